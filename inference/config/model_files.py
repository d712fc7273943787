"""What the web process reads of a model's folder without loading the model (the import
contract keeps torch and transformers out of it): where the folder is, and how long a sequence
its encoder reads."""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_PREFIX = "package:"
# The longest input an encoder reads when its files state less: BERT-style position tables.
ENCODER_MAX_TOKENS = 512


def model_folder(model_ref: str) -> Path:
    """The folder of `model_ref`, resolved like inference.engines.base.resolve_model_path
    (which imports torch, so it cannot be used here). ImportError for a missing package."""
    if model_ref.startswith(PACKAGE_PREFIX):
        package = importlib.import_module(model_ref[len(PACKAGE_PREFIX) :].strip())
        return Path(getattr(package, "MODEL_DIR", Path(package.__file__).parent / "model"))
    path = Path(model_ref).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def _json(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


@lru_cache(maxsize=64)
def encoder_max_tokens(model_ref: str) -> int:
    """The longest sequence the encoder at `model_ref` reads, in tokens: the rule of
    inference.engines.base.encoder_max_length, from the folder's files alone (a
    sentence-transformers max_seq_length, else the tokenizer's and the position table's limits,
    at most ENCODER_MAX_TOKENS). ENCODER_MAX_TOKENS when the folder cannot be read."""
    try:
        folder = model_folder(model_ref)
    except ImportError:
        return ENCODER_MAX_TOKENS
    max_seq_length = _json(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(max_seq_length, int) and max_seq_length > 0:
        return max_seq_length
    limits = [ENCODER_MAX_TOKENS]
    for value in (
        _json(folder / "tokenizer_config.json").get("model_max_length"),
        _json(folder / "config.json").get("max_position_embeddings"),
    ):
        if isinstance(value, int | float) and value > 0:
            limits.append(int(value))
    return min(limits)
