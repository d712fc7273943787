"""Embedding vectors as little-endian float32: how they are stored, merged and sent.

An embedding job's vectors live in `Job.result_vectors` (bytea: count × dim float32, row after
row, little-endian); its JSON `result` keeps only `{"dim", "count"}`. A float list in JSON costs
about 20 characters a value against 4 bytes, and parsing and printing it costs the worker and
the web far more than copying bytes. The same bytes are what OpenAI's `encoding_format=base64`
sends (base64 of little-endian float32), so a base64 answer is encoded from storage directly.

    engine / backend result {"embeddings": ndarray | tensor | [[float]], "dim"}
        ──split_result──▶ ({"dim", "count"}, bytes)        what store_outcomes writes
        ──render_result(…, "float" | "base64")──▶ {"embeddings": [[float]] | [str], "dim"}

Plain Python and numpy (no torch, no Django): the web process uses it too. A torch tensor is
accepted by what it offers (`.detach().cpu().numpy()`), without importing torch.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Little-endian float32 on every host: what is stored, and what OpenAI's base64 carries.
FLOAT32_LE = np.dtype("<f4")
VECTORS_KEY = "embeddings"
ENCODING_FORMATS = ("float", "base64")


class EmbeddingMatrix:
    """`count` vectors of `dim` float32 values: a read-only (count, dim) little-endian array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        if array.ndim != 2:
            raise ValueError(f"embeddings must be a list of vectors, got {array.ndim} dimensions")
        self.array = array.astype(FLOAT32_LE, copy=False)

    @classmethod
    def of(cls, vectors: Any, dim: int | None = None) -> EmbeddingMatrix:
        """From what engines and backends produce: a numpy array, a torch tensor, a list of
        float lists (or of arrays), or another EmbeddingMatrix. `dim` gives an empty list its
        width and is checked against a non-empty one."""
        if isinstance(vectors, EmbeddingMatrix):
            matrix = vectors
        else:
            if hasattr(vectors, "detach"):  # a torch tensor, perhaps on a GPU
                vectors = vectors.detach().cpu().numpy()
            if isinstance(vectors, Sequence) and len(vectors) == 0:
                array = np.empty((0, dim or 0), dtype=FLOAT32_LE)
            else:
                array = np.asarray(vectors, dtype=FLOAT32_LE)
            matrix = cls(array)
        if dim is not None and matrix.count and matrix.dim != dim:
            raise ValueError(f"vectors have {matrix.dim} values, the result says dim {dim}")
        return matrix

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, dim: int) -> EmbeddingMatrix:
        """The stored form back, without copying (bytea arrives as a memoryview)."""
        if dim < 0 or (dim == 0 and len(data)) or (dim and len(data) % (dim * 4)):
            raise ValueError(f"{len(data)} bytes are not whole float32 vectors of {dim} values")
        flat = np.frombuffer(data, dtype=FLOAT32_LE)
        return cls(flat.reshape(len(flat) // dim if dim else 0, dim))

    @classmethod
    def concat(cls, matrices: Iterable[Any], dim: int) -> EmbeddingMatrix:
        """Vectors of several results, in order (a bulk job's pieces)."""
        parts = [cls.of(m, dim).array for m in matrices]
        if not parts:
            return cls(np.empty((0, dim), dtype=FLOAT32_LE))
        return cls(np.concatenate(parts))

    @property
    def count(self) -> int:
        return int(self.array.shape[0])

    @property
    def dim(self) -> int:
        return int(self.array.shape[1])

    def to_bytes(self) -> bytes:
        return np.ascontiguousarray(self.array).tobytes()

    def tolist(self) -> list[list[float]]:
        """Python floats; each is the float32 value exactly, so JSON prints what was computed."""
        return self.array.tolist()

    def base64_rows(self) -> list[str]:
        """One base64 string per vector, as OpenAI's `encoding_format=base64` sends them."""
        data = memoryview(self.to_bytes())
        row = self.dim * 4
        return [
            base64.b64encode(data[i * row : (i + 1) * row]).decode("ascii")
            for i in range(self.count)
        ]

    def truncated(self, dimensions: int) -> EmbeddingMatrix:
        """The first `dimensions` values of each vector, L2-normalised again (OpenAI's
        `dimensions`); a zero vector stays zero. Computed in float64, stored as float32."""
        head = self.array[:, :dimensions].astype(np.float64)
        norms = np.linalg.norm(head, axis=1, keepdims=True)
        return EmbeddingMatrix(np.divide(head, norms, out=head.copy(), where=norms > 0))

    def encoded(self, encoding_format: str) -> list:
        """The vectors as a client asked for them: float lists, or base64 strings."""
        if encoding_format == "base64":
            return self.base64_rows()
        if encoding_format == "float":
            return self.tolist()
        raise ValueError(f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}")


def has_vectors(result: Any) -> bool:
    return isinstance(result, dict) and VECTORS_KEY in result


def split_result(result: dict | None) -> tuple[dict | None, bytes | None]:
    """A result as an engine or backend returns it → (the JSON column, the bytea column).
    Results without vectors (scores, text, counts) are kept whole; vectors leave the JSON,
    which records their `dim` and `count`."""
    if not has_vectors(result):
        return result, None
    matrix = EmbeddingMatrix.of(result[VECTORS_KEY], result.get("dim"))
    kept = {key: value for key, value in result.items() if key != VECTORS_KEY}
    kept.update(dim=matrix.dim, count=matrix.count)
    return kept, matrix.to_bytes()


def stored_matrix(result: dict | None, data: bytes | memoryview | None) -> EmbeddingMatrix | None:
    """The vectors of a stored result: from its bytes, or from JSON floats (a row stored
    before vectors had a column of their own); None when it has none."""
    if data is not None and isinstance(result, dict) and "dim" in result:
        return EmbeddingMatrix.from_bytes(data, int(result["dim"]))
    if has_vectors(result):
        return EmbeddingMatrix.of(result[VECTORS_KEY], result.get("dim"))
    return None


def with_vectors(result: dict | None, data: bytes | memoryview | None) -> dict | None:
    """A stored result with its vectors back in place as an EmbeddingMatrix (to merge them,
    e.g. a bulk job's pieces); results without vectors come back as they are."""
    matrix = stored_matrix(result, data)
    if matrix is None:
        return result
    rest = {k: v for k, v in result.items() if k not in (VECTORS_KEY, "dim", "count")}
    return {VECTORS_KEY: matrix, "dim": matrix.dim, **rest}


def render_result(
    result: dict | None, data: bytes | memoryview | None, encoding_format: str = "float"
) -> dict | None:
    """A stored result as clients see it: `{"embeddings": [...], "dim": n}` with float lists
    (the default, the same values as ever) or one base64 string per vector."""
    matrix = stored_matrix(result, data)
    if matrix is None:
        return result
    rest = {k: v for k, v in result.items() if k not in (VECTORS_KEY, "dim", "count")}
    return {VECTORS_KEY: matrix.encoded(encoding_format), "dim": matrix.dim, **rest}
