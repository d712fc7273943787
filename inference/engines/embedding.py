"""Sentence embeddings: mean pooling over the attention mask, then optional L2 normalisation.

This is the sentence-transformers recipe for all-MiniLM-L6-v2 (modules.json: Transformer →
mean Pooling → Normalize), done with plain transformers so the worker needs no extra library.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from inference.engines.base import Engine, encoder_max_length, pad_token_rows, sum_per_job
from inference.engines.traced import trace_encoder


class EmbeddingEngine(Engine):
    """payload {"texts": [...], "normalize": true} → {"embeddings": float32 array (texts × dim),
    "dim": int}.

    normalize defaults to true (unit-length vectors, so a dot product is the cosine).
    """

    kind = "embedding"
    # A job of more texts than one pass may hold runs a range of them per pass.
    runs_in_parts = True

    def __init__(self, model_ref: str, *, device: str | None = None, dtype: str | None = None):
        super().__init__(model_ref, device=device, dtype=dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.model = AutoModel.from_pretrained(
            self.model_path, local_files_only=True, dtype=self.dtype
        )
        self.model.to(self.device).eval()
        self.max_length = encoder_max_length(self.model_path, self.tokenizer, self.model.config)
        self.dim = int(self.model.config.hidden_size)
        self.forward = trace_encoder(
            self.model, read=pooled_output, tokenize=self._tokenize, pad=self._pad
        )

    def _tokenize(self, texts: list[str]) -> list[dict[str, list[int]]]:
        if not texts:
            return []
        encoded = self.tokenizer(
            texts, add_special_tokens=True, truncation=True, max_length=self.max_length
        )
        names = [name for name in ("input_ids", "token_type_ids") if name in encoded]
        return [{name: encoded[name][i] for name in names} for i in range(len(texts))]

    def _pad(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return pad_token_rows(rows, pad_token_id=self.tokenizer.pad_token_id, device=self.device)

    def count_tokens(self, payload: dict) -> int:
        return sum(len(row["input_ids"]) for row in self._tokenize(list(payload["texts"])))

    def count_tokens_many(self, payloads: list[dict]) -> list[int]:
        rows = self._tokenize([text for payload in payloads for text in payload["texts"]])
        lengths = [len(row["input_ids"]) for row in rows]
        return sum_per_job(lengths, [len(payload["texts"]) for payload in payloads])

    def run_batch(self, payloads: list[dict]) -> list[dict]:
        # Flatten every job's texts into one list of units so texts of similar length from
        # different jobs share a forward pass; owners maps a unit back to its job.
        texts: list[str] = []
        owners: list[int] = []
        for job_index, payload in enumerate(payloads):
            texts.extend(payload["texts"])
            owners.extend([job_index] * len(payload["texts"]))
        rows = self._tokenize(texts)

        # Few torch ops per pass, none per text: this runs on the worker's model thread, where
        # every op gives up the GIL and waits to take it back from the loop's Python.
        embeddings = np.empty((len(rows), self.dim), dtype="<f4")
        with torch.inference_mode():
            for bucket in self.plan_buckets([len(row["input_ids"]) for row in rows]):
                inputs = self._pad([rows[i] for i in bucket])
                embeddings[bucket] = self.forward(inputs).cpu().numpy()
        normalize = np.array([payloads[owner].get("normalize", True) for owner in owners], bool)
        if normalize.any():
            # F.normalize's arithmetic: divide by the L2 norm, at least 1e-12.
            norms = np.linalg.norm(embeddings[normalize], axis=1, keepdims=True)
            embeddings[normalize] /= np.maximum(norms, 1e-12)

        # One float32 array per job (a job's texts are consecutive rows): stored as bytes as
        # it is (inference.jobs.vectors), never turned into Python floats on the worker.
        results = []
        start = 0
        for payload in payloads:
            end = start + len(payload["texts"])
            results.append({"embeddings": embeddings[start:end], "dim": self.dim})
            start = end
        return results


def pooled_output(outputs: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sentence vector of each row, in float32: what the engine reads from the model."""
    return mean_pool(outputs.last_hidden_state.float(), inputs["attention_mask"])


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average the token vectors of each row, ignoring padding."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return summed / counts
