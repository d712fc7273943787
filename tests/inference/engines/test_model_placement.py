"""config.yaml `models.<name>.device` / `dtype` decide where and in what precision a worker loads
the model; a device or dtype given to load_engine (the worker's RENQ_DEVICE) wins."""

from __future__ import annotations

import textwrap

import pytest
import torch

from inference.config.file import apply_config, parse_config
from inference.config.models import ModelSpec
from inference.engines import clear_engine_cache, load_engine
from inference.engines.base import pick_device
from inference.models import Service

pytestmark = pytest.mark.django_db

TINY_RERANKER_REF = "fixtures/models/tiny-reranker"
TINY_LLM_REF = "fixtures/models/tiny-llm"


@pytest.fixture(autouse=True)
def fresh_engines(tiny_models):
    clear_engine_cache()
    yield
    clear_engine_cache()


def weights_dtype(engine) -> torch.dtype:
    return next(engine.model.parameters()).dtype


def configure(**placement) -> Service:
    """A reranker service on the tiny model, placed as given, loaded through config.yaml."""
    entry = ", ".join(f"{key}: {value}" for key, value in placement.items())
    apply_config(
        parse_config(
            textwrap.dedent(
                f"""
                models:
                  tiny: {{type: reranker, path: {TINY_RERANKER_REF}, {entry}}}
                services:
                  reranker: {{model: tiny}}
                """
            )
        )
    )
    return Service.objects.get(name="reranker")


def test_the_configured_device_and_dtype_reach_the_engine():
    service = configure(device="cpu", dtype="bfloat16")
    # What the GPU worker and the warm-up call, RENQ_DEVICE unset.
    engine = load_engine(service.kind, service.model_ref, device=None)
    assert engine.device == "cpu"
    assert engine.dtype == torch.bfloat16 and weights_dtype(engine) == torch.bfloat16
    result = engine.run_batch([{"query": "q", "documents": ["a", "b c"]}])[0]
    assert len(result["scores"]) == 2 and sorted(result["ranking"]) == [0, 1]
    # Later calls reuse it.
    assert load_engine(service.kind, service.model_ref) is engine


def test_float32_and_auto_are_float32_on_the_cpu():
    service = configure(device="cpu", dtype="float32")
    assert weights_dtype(load_engine(service.kind, service.model_ref)) == torch.float32
    clear_engine_cache()
    service = configure(device="auto", dtype="auto")
    engine = load_engine(service.kind, service.model_ref)
    assert engine.device == pick_device(None)
    if engine.device == "cpu":
        assert engine.dtype == torch.float32


def test_a_device_given_to_the_call_wins_over_the_configured_one():
    # RENQ_DEVICE=cpu on a worker whose config names a GPU this machine may not have.
    service = configure(device="cuda:7", dtype="bfloat16")
    engine = load_engine(service.kind, service.model_ref, device="cpu")
    assert engine.device == "cpu"
    assert engine.dtype == torch.bfloat16  # the dtype still comes from the file


def test_a_configured_device_the_machine_lacks_fails_with_a_clear_error():
    missing = torch.cuda.device_count() if torch.cuda.is_available() else 0
    service = configure(device=f"cuda:{missing}", dtype="auto")
    with pytest.raises(ValueError, match=rf"cuda:{missing}.*CUDA"):
        load_engine(service.kind, service.model_ref)


def test_a_model_no_config_names_loads_auto():
    assert not ModelSpec.objects.filter(model_ref=TINY_LLM_REF).exists()
    engine = load_engine("llm", TINY_LLM_REF)
    assert engine.device == pick_device(None)
    if engine.device == "cpu":
        assert weights_dtype(engine) == torch.float32


def test_pick_device_auto_is_the_default_choice():
    assert pick_device("auto") == pick_device(None)
    assert pick_device("cpu") == "cpu"
