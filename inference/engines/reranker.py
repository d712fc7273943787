"""Cross-encoder reranking: score each (query, document) pair with one classification head."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from inference.engines.base import Engine, encoder_max_length, pad_token_rows, sum_per_job
from inference.engines.traced import trace_encoder


class RerankerEngine(Engine):
    """payload {"query", "documents", "top_n"?} → {"scores": [...], "ranking": [...]}.

    Scores are raw logits (no sigmoid): the single logit when the head has one label, else
    the last label's logit ("relevant" in two-label heads). Higher means more relevant; only
    their order is meaningful across models. `scores` follows the input document order and
    `ranking` lists document indices by descending score (ties: lower index first), cut to
    `top_n` when given.
    """

    kind = "reranker"

    def __init__(self, model_ref: str, *, device: str | None = None, dtype: str | None = None):
        super().__init__(model_ref, device=device, dtype=dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            self.model_path, local_files_only=True, dtype=self.dtype
        )
        self.model.to(self.device).eval()
        self.max_length = encoder_max_length(self.model_path, self.tokenizer, self.model.config)
        self.forward = trace_encoder(
            self.model,
            read=relevance_logit,
            # Each text as a query beside one document: pairs of different lengths, so padded.
            tokenize=lambda texts: self._tokenize_pairs(texts, ["a document"] * len(texts)),
            pad=self._pad,
        )

    def _tokenize_pairs(self, queries: list[str], documents: list[str]) -> list[dict]:
        if not documents:
            return []
        # longest_first truncation trims whichever side is longer, like sentence-transformers'
        # CrossEncoder, so a long query cannot push a document out entirely (or fail).
        encoded = self.tokenizer(
            queries, documents, add_special_tokens=True, truncation=True, max_length=self.max_length
        )
        names = [name for name in ("input_ids", "token_type_ids") if name in encoded]
        return [{name: encoded[name][i] for name in names} for i in range(len(documents))]

    def _pad(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return pad_token_rows(rows, pad_token_id=self.tokenizer.pad_token_id, device=self.device)

    def count_tokens(self, payload: dict) -> int:
        documents = list(payload["documents"])
        rows = self._tokenize_pairs([payload["query"]] * len(documents), documents)
        return sum(len(row["input_ids"]) for row in rows)

    def count_tokens_many(self, payloads: list[dict]) -> list[int]:
        queries = [payload["query"] for payload in payloads for _ in payload["documents"]]
        documents = [document for payload in payloads for document in payload["documents"]]
        lengths = [len(row["input_ids"]) for row in self._tokenize_pairs(queries, documents)]
        return sum_per_job(lengths, [len(payload["documents"]) for payload in payloads])

    def run_batch(self, payloads: list[dict]) -> list[dict]:
        # One unit per (query, document) pair across all jobs; owners maps units to jobs.
        queries: list[str] = []
        documents: list[str] = []
        owners: list[int] = []
        for job_index, payload in enumerate(payloads):
            queries.extend([payload["query"]] * len(payload["documents"]))
            documents.extend(payload["documents"])
            owners.extend([job_index] * len(payload["documents"]))
        rows = self._tokenize_pairs(queries, documents)

        scores = [0.0] * len(rows)
        with torch.inference_mode():
            for bucket in self.plan_buckets([len(row["input_ids"]) for row in rows]):
                inputs = self._pad([rows[i] for i in bucket])
                bucket_scores = self.forward(inputs).cpu().tolist()
                for position, unit_index in enumerate(bucket):
                    scores[unit_index] = bucket_scores[position]

        job_scores: list[list[float]] = [[] for _ in payloads]
        for unit_index, score in enumerate(scores):
            job_scores[owners[unit_index]].append(score)
        results = []
        for payload, doc_scores in zip(payloads, job_scores, strict=True):
            ranking = sorted(range(len(doc_scores)), key=lambda i, s=doc_scores: (-s[i], i))
            top_n = payload.get("top_n")
            if top_n is not None:
                ranking = ranking[:top_n]
            results.append({"scores": doc_scores, "ranking": ranking})
        return results


def relevance_logit(outputs: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each pair's score: the last label's logit (column 0 when num_labels == 1), float32."""
    return outputs.logits[:, -1].float()
