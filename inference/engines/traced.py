"""An encoder's forward pass as one traced TorchScript graph, so it takes the GIL once per pass
instead of once per op.

The worker runs forward passes on a thread of their own while its main thread pulls, claims
and tokenizes the next batch and the store thread writes the last one: Python, holding the GIL.
An eager forward pass gives the GIL up inside every op and must take it back after each, and a
thread that wants it back waits out the holder's switch interval (5 ms) every time. A traced
graph runs in C++ from its first op to its last, so beside a thread running Python it keeps
most of its speed where the eager model loses most of it.

Tracing records the ops one example input runs: the example is padded, so the attention mask
is part of the graph (transformers keeps the mask while tracing). Shapes stay symbolic, so any
batch size and length runs. Before it is used, the graph is checked against the eager model on
an input of another shape; an architecture that traces wrongly or not at all keeps its eager
forward pass, with a warning.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

Inputs = dict[str, torch.Tensor]


# What the engine reads from the model's outputs, given its inputs: a pooled vector, a logit.
# Part of the graph, so those few ops do not each wait for the GIL either.
ReadOutput = Callable[[Any, Inputs], torch.Tensor]


class _ReadModel(torch.nn.Module):
    """The model with positional tensor inputs, returning what the engine reads: what a traced
    graph takes and returns."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...], read: ReadOutput):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.read = read

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        inputs = dict(zip(self.input_names, tensors, strict=True))
        return self.read(self.model(**inputs), inputs)


class EncoderForward:
    """`forward(inputs)` → `read(model(**inputs), inputs)` for padded inputs (input_ids,
    attention_mask, token_type_ids as the tokenizer gives them): the traced graph when it
    traced and matched the eager model, else the eager model itself."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        read: ReadOutput,
        example: Inputs,
        check: Inputs,
    ) -> None:
        self.model = model
        self.input_names = tuple(example)
        self.eager = _ReadModel(model, self.input_names, read).eval()
        self.graph: torch.jit.ScriptModule | None = None
        try:
            self.graph = self._trace(example, check)
        except Exception as exc:  # any architecture the tracer cannot follow stays eager
            logger.warning(
                "%s: the forward pass did not trace (%s: %s); it runs eager, and beside the "
                "worker's own Python it runs slower.",
                type(model).__name__,
                type(exc).__name__,
                exc,
            )

    @property
    def traced(self) -> bool:
        return self.graph is not None

    def __call__(self, inputs: Inputs) -> torch.Tensor:
        if self.graph is not None and tuple(inputs) == self.input_names:
            return self.graph(*inputs.values())
        return self.eager.read(self.model(**inputs), inputs)

    def _trace(self, example: Inputs, check: Inputs) -> torch.jit.ScriptModule | None:
        if tuple(check) != self.input_names:
            raise ValueError(f"check inputs {tuple(check)} differ from {self.input_names}")
        with torch.inference_mode(), warnings.catch_warnings():
            # The tracer warns about every Python value it records; the check below is what
            # decides whether the graph is right.
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(self.eager, tuple(example.values()), check_trace=False)
            expected = self.eager(*check.values()).float()
            got = graph(*check.values()).float()
        tolerance = 1e-2 if _half(self.model) else 1e-5
        if got.shape != expected.shape or not torch.allclose(
            got, expected, rtol=tolerance, atol=tolerance
        ):
            logger.warning(
                "%s: the traced forward pass differs from the eager one on a check input; it "
                "runs eager.",
                type(self.model).__name__,
            )
            return None
        return graph


def _half(model: torch.nn.Module) -> bool:
    first = next(model.parameters(), None)
    return first is not None and first.dtype in (torch.float16, torch.bfloat16)


def trace_encoder(
    model: torch.nn.Module,
    *,
    read: ReadOutput,
    tokenize: Callable[[list[str]], list[dict[str, list[int]]]],
    pad: Callable[[list[dict[str, list[int]]]], Inputs],
) -> EncoderForward:
    """The encoder's forward pass, traced on the engine's own tokenization and padding: an
    example of two rows of different lengths (so padded), checked on three rows of others."""
    example = pad(tokenize(["renq traces this encoder once", "at load"]))
    check = pad(tokenize(["a check", "of another shape than the example's", "and a third"]))
    return EncoderForward(model, read=read, example=example, check=check)
