"""What every inference engine shares: model location, device and dtype choice, batching knobs,
padding."""

from __future__ import annotations

import abc
import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

# Workers have no network: never let transformers/huggingface_hub try to reach the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from inference.scheduling.bucketing import plan_length_buckets  # noqa: E402

if TYPE_CHECKING:
    import torch

# torch is imported where it is used, so this module (and the no-op engine) loads without it;
# the engines that run a model import it after the offline switches above.

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_PREFIX = "package:"
FIXTURES_MAKE_TARGET = "make fixtures"


def resolve_model_path(model_ref: str) -> Path:
    """Turn a model_ref into the folder holding config + weights + tokenizer.

    `package:<name>` imports that package and uses its `MODEL_DIR` (else `<package>/model`);
    anything else is a folder, relative paths being relative to the project root.
    """
    if model_ref.startswith(PACKAGE_PREFIX):
        package_name = model_ref[len(PACKAGE_PREFIX) :].strip()
        try:
            package = importlib.import_module(package_name)
        except ImportError as exc:
            raise FileNotFoundError(
                f"model_ref {model_ref!r}: Python package {package_name!r} is not installed."
            ) from exc
        model_dir = getattr(package, "MODEL_DIR", None)
        if model_dir is None:
            model_dir = Path(package.__file__).resolve().parent / "model"
        path = Path(model_dir)
    else:
        path = Path(model_ref).expanduser()
        if not path.is_absolute():
            path = PROJECT_ROOT / path
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model_ref {model_ref!r}: no model folder with a config.json at {path}. "
            f"Fixture models under fixtures/models/ are built by `{FIXTURES_MAKE_TARGET}`."
        )
    return path


AUTO = "auto"
DTYPE_NAMES = ("float32", "float16", "bfloat16")


def pick_device(requested: str | None) -> str:
    """The device to run on: the requested one, else (None or "auto") CUDA when present, else
    CPU. A requested accelerator this machine lacks is an error, never a quiet fall back to the
    CPU: a model meant for a GPU would run there at a fraction of the speed."""
    import torch

    if not requested or requested == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise ValueError(f"device {requested!r}: not a torch device ({exc})") from exc
    if device.type == "cuda":
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if present == 0:
            raise ValueError(f"device {requested!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= present:
            raise ValueError(
                f"device {requested!r}: this machine has {present} CUDA device(s) "
                f"(cuda:0 to cuda:{present - 1})"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {requested!r}: MPS is not available on this machine")
    return requested


def encoder_max_length(model_path: Path, tokenizer: Any, config: Any) -> int:
    """Longest input an encoder should see, in tokens (special tokens included).

    sentence-transformers models state theirs in sentence_bert_config.json (256 for MiniLM,
    which was trained at that length); otherwise trust the tokenizer, capped by the position
    table and by 512 (tokenizers without a limit report a huge sentinel value).
    """
    sbert_config = model_path / "sentence_bert_config.json"
    if sbert_config.is_file():
        max_seq_length = json.loads(sbert_config.read_text()).get("max_seq_length")
        if max_seq_length:
            return int(max_seq_length)
    limits = [512, int(tokenizer.model_max_length)]
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions:
        limits.append(int(max_positions))
    return min(limits)


def pad_token_rows(
    rows: Sequence[dict[str, list[int]]],
    *,
    pad_token_id: int,
    side: str = "right",
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Pad already-tokenized rows into tensors (input_ids, attention_mask, token_type_ids).

    Done by hand rather than with tokenizer.pad so each text is tokenized once per batch:
    lengths for bucketing and model inputs come from the same encoding.
    """
    import torch

    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")

    def pad(values: list[int], fill: int, pad_value: int) -> list[int]:
        padding = [pad_value] * fill
        return padding + list(values) if side == "left" else list(values) + padding

    longest = max(len(row["input_ids"]) for row in rows)
    with_token_types = "token_type_ids" in rows[0]
    padded: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": []}
    if with_token_types:
        padded["token_type_ids"] = []
    for row in rows:
        length = len(row["input_ids"])
        fill = longest - length
        padded["input_ids"].append(pad(row["input_ids"], fill, pad_token_id))
        padded["attention_mask"].append(pad([1] * length, fill, 0))
        if with_token_types:
            padded["token_type_ids"].append(pad(row["token_type_ids"], fill, 0))
    return {
        name: torch.tensor(values, dtype=torch.long, device=device)
        for name, values in padded.items()
    }


def sum_per_job(unit_values: list[int], units_per_job: list[int]) -> list[int]:
    """Per-unit values (texts, document pairs) summed back to the jobs they came from, in
    order: job i owns the next units_per_job[i] units."""
    values = iter(unit_values)
    return [sum(next(values) for _ in range(units)) for units in units_per_job]


class Engine(abc.ABC):
    """A loaded model that runs a list of job payloads together.

    Subclasses load their tokenizer + model in __init__ from `self.model_path`, on
    `self.device`, in `self.dtype`, and implement count_tokens and run_batch.
    """

    kind: ClassVar[str]
    # Whether the engine runs torch (its worker sets torch's threads before loading it).
    uses_torch: ClassVar[bool] = True
    model_ref: str
    device: str
    dtype: torch.dtype
    model_path: Path

    # Batching knobs (instance attributes may override them, e.g. in tests or benchmarks).
    # Padding ratio: how much of a forward pass may be padding before a new bucket is cheaper.
    max_padding_ratio: float = 0.25
    # Rows and padded tokens per forward pass bound activation memory.
    max_batch_rows: int | None = 64
    max_batch_tokens: int | None = 16384

    def __init__(self, model_ref: str, *, device: str | None = None, dtype: str | None = None):
        self.model_ref = model_ref
        self.model_path = resolve_model_path(model_ref)
        self.device = self.placed_on(device)
        self.dtype = self.pick_dtype(dtype)

    @classmethod
    def placed_on(cls, requested: str | None) -> str:
        """The device an engine of this class runs on when `requested` (pick_device)."""
        return pick_device(requested)

    @property
    def uses_cuda(self) -> bool:
        return self.device.partition(":")[0] == "cuda"

    def pick_dtype(self, requested: str | None) -> torch.dtype:
        """The named dtype (float32, float16, bfloat16), else (None or "auto") auto_dtype()."""
        import torch

        if not requested or requested == AUTO:
            return self.auto_dtype()
        if requested not in DTYPE_NAMES:
            known = ", ".join([AUTO, *DTYPE_NAMES])
            raise ValueError(f"dtype {requested!r}: expected one of {known}")
        return getattr(torch, requested)

    def auto_dtype(self) -> torch.dtype:
        import torch

        # fp16 halves memory and is plenty for encoders on a GPU; CPU fp16 matmuls are slow.
        return torch.float16 if self.uses_cuda else torch.float32

    @abc.abstractmethod
    def count_tokens(self, payload: dict) -> int:
        """Tokens this job puts through the model (special tokens included, no padding)."""

    def count_tokens_many(self, payloads: list[dict]) -> list[int]:
        """count_tokens of each payload; engines with a tokenizer make it one call for all
        (the worker sizes a whole claim at once, while the model runs the last batch)."""
        return [self.count_tokens(payload) for payload in payloads]

    @abc.abstractmethod
    def run_batch(self, payloads: list[dict]) -> list[dict]:
        """Run the jobs together; one result per payload, in the same order."""

    def plan_buckets(self, lengths: Sequence[int]) -> list[list[int]]:
        """Groups of unit indices to run as one padded forward pass each."""
        return plan_length_buckets(
            lengths,
            max_items=self.max_batch_rows,
            max_padding_ratio=self.max_padding_ratio,
            max_tokens=self.max_batch_tokens,
        )

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"<{type(self).__name__} {self.model_ref!r} on {self.device} in {dtype}>"
