"""Sentence embeddings: mean pooling over the attention mask, then optional L2 normalisation.

This is the sentence-transformers recipe for all-MiniLM-L6-v2 (modules.json: Transformer →
mean Pooling → Normalize), done with plain transformers so the worker needs no extra library.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

from inference.engines.base import Engine, encoder_max_length, pad_token_rows, sum_per_job


class EmbeddingEngine(Engine):
    """payload {"texts": [...], "normalize": true} → {"embeddings": float32 array (texts × dim),
    "dim": int}.

    normalize defaults to true (unit-length vectors, so a dot product is the cosine).
    """

    kind = "embedding"

    def __init__(self, model_ref: str, *, device: str | None = None):
        super().__init__(model_ref, device=device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        # fp16 halves memory and is plenty for embeddings on GPU; CPU fp16 matmuls are slow.
        dtype = torch.float16 if self.uses_cuda else torch.float32
        self.model = AutoModel.from_pretrained(self.model_path, local_files_only=True, dtype=dtype)
        self.model.to(self.device).eval()
        self.max_length = encoder_max_length(self.model_path, self.tokenizer, self.model.config)
        self.dim = int(self.model.config.hidden_size)

    def _tokenize(self, texts: list[str]) -> list[dict[str, list[int]]]:
        if not texts:
            return []
        encoded = self.tokenizer(
            texts, add_special_tokens=True, truncation=True, max_length=self.max_length
        )
        names = [name for name in ("input_ids", "token_type_ids") if name in encoded]
        return [{name: encoded[name][i] for name in names} for i in range(len(texts))]

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

        vectors: list[torch.Tensor | None] = [None] * len(rows)
        with torch.inference_mode():
            for bucket in self.plan_buckets([len(row["input_ids"]) for row in rows]):
                inputs = pad_token_rows(
                    [rows[i] for i in bucket],
                    pad_token_id=self.tokenizer.pad_token_id,
                    device=self.device,
                )
                hidden = self.model(**inputs).last_hidden_state.float()
                pooled = mean_pool(hidden, inputs["attention_mask"]).cpu()
                for position, unit_index in enumerate(bucket):
                    vectors[unit_index] = pooled[position]

        per_job: list[list[torch.Tensor]] = [[] for _ in payloads]
        for unit_index, vector in enumerate(vectors):
            payload = payloads[owners[unit_index]]
            if payload.get("normalize", True):
                vector = F.normalize(vector, p=2, dim=0)
            per_job[owners[unit_index]].append(vector)
        # One float32 array per job: stored as bytes as it is (inference.vectors), never
        # turned into Python floats on the worker.
        return [
            {
                "embeddings": torch.stack(rows).numpy() if rows else np.empty((0, self.dim), "<f4"),
                "dim": self.dim,
            }
            for rows in per_job
        ]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average the token vectors of each row, ignoring padding."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return summed / counts
