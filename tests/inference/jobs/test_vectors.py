"""inference.jobs.vectors: embeddings as little-endian float32 bytes, float lists and base64."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest
import torch

from inference.jobs.vectors import (
    EmbeddingMatrix,
    render_result,
    split_result,
    stored_matrix,
    with_vectors,
)

VECTORS = [[0.1, -2.5, 3.25], [1e-8, 0.0, -1.0]]


def test_split_keeps_dim_and_count_in_json_and_the_values_as_float32_le_bytes():
    result, packed = split_result({"embeddings": np.array(VECTORS), "dim": 3})
    assert result == {"dim": 3, "count": 2}
    assert packed == struct.pack("<6f", *VECTORS[0], *VECTORS[1])


@pytest.mark.parametrize(
    "vectors",
    [
        VECTORS,
        np.array(VECTORS, dtype=np.float64),
        torch.tensor(VECTORS),
        [np.array(v) for v in VECTORS],
    ],
    ids=["float lists", "float64 array", "torch tensor", "list of arrays"],
)
def test_every_engine_and_backend_output_packs_the_same(vectors):
    _, packed = split_result({"embeddings": vectors, "dim": 3})
    assert packed == split_result({"embeddings": VECTORS, "dim": 3})[1]


def test_float_rendering_is_the_float32_values_as_json_printed_them_before():
    engine_output = np.array(VECTORS, dtype=np.float32)
    result, packed = split_result({"embeddings": engine_output, "dim": 3})
    rendered = render_result(result, memoryview(packed))  # bytea arrives as a memoryview
    # Before: the worker stored vector.tolist() as JSON. Now: the same floats, same keys.
    assert rendered == {"embeddings": engine_output.tolist(), "dim": 3}
    assert json.dumps(rendered) == json.dumps({"embeddings": engine_output.tolist(), "dim": 3})


def test_base64_is_openais_layout_one_string_per_vector():
    result, packed = split_result({"embeddings": VECTORS, "dim": 3})
    rendered = render_result(result, packed, "base64")
    assert rendered["dim"] == 3 and len(rendered["embeddings"]) == 2
    for encoded, want in zip(rendered["embeddings"], VECTORS, strict=True):
        # The openai SDK decodes with np.frombuffer(base64.b64decode(s), dtype="float32").
        got = np.frombuffer(base64.b64decode(encoded), dtype="float32")
        assert got.tolist() == np.array(want, dtype=np.float32).tolist()
    assert base64.b64decode(rendered["embeddings"][1]) == packed[12:]


def test_results_without_vectors_are_stored_and_read_whole():
    for result in ({"scores": [0.5], "ranking": [0]}, {"text": "hi"}, {"count": 3}, {}):
        assert split_result(result) == (result, None)
        assert render_result(result, None, "base64") == result
    assert split_result(None) == (None, None)


def test_a_json_float_row_from_before_the_bytes_column_still_reads():
    legacy = {"embeddings": [[1.0, 0.5]], "dim": 2}
    assert render_result(legacy, None) == legacy
    assert base64.b64decode(render_result(legacy, None, "base64")["embeddings"][0]) == (
        struct.pack("<2f", 1.0, 0.5)
    )


def test_empty_vectors_keep_their_width():
    result, packed = split_result({"embeddings": [], "dim": 384})
    assert (result, packed) == ({"dim": 384, "count": 0}, b"")
    assert render_result(result, packed) == {"embeddings": [], "dim": 384}


def test_with_vectors_and_concat_merge_pieces_in_order():
    first = split_result({"embeddings": VECTORS[:1], "dim": 3})
    second = split_result({"embeddings": VECTORS[1:], "dim": 3})
    pieces = [with_vectors(*first), with_vectors(*second)]
    merged = EmbeddingMatrix.concat([p["embeddings"] for p in pieces], 3)
    assert merged.to_bytes() == first[1] + second[1]
    assert split_result({"embeddings": merged, "dim": 3}) == (
        {"dim": 3, "count": 2},
        merged.to_bytes(),
    )


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        split_result({"embeddings": [[1.0, 2.0], [3.0]], "dim": 2})  # ragged
    with pytest.raises(ValueError, match="dim 4"):
        split_result({"embeddings": [[1.0, 2.0]], "dim": 4})
    with pytest.raises(ValueError, match="whole float32 vectors"):
        stored_matrix({"dim": 3, "count": 1}, b"\x00" * 8)


def test_truncated_renormalises_and_leaves_zero_vectors_alone():
    matrix = EmbeddingMatrix.of([[3.0, 4.0, 12.0], [0.0, 0.0, 1.0]]).truncated(2)
    assert matrix.dim == 2
    assert np.allclose(matrix.array, [[0.6, 0.8], [0.0, 0.0]])
