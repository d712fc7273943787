"""Text generation with a causal LM, batched with left padding.

Left padding keeps every prompt's last token in the last column, where generate() appends.
generate() also derives position ids from the attention mask (cumsum − 1), so a padded prompt
sees the same positions as when it runs alone and greedy output does not depend on its
batch-mates.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

from inference.engines.base import Engine, pad_token_rows
from inference.inputs import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE


class LlmEngine(Engine):
    """payload {"prompt", "max_tokens", "temperature"} → {"text", "usage", "finish_reason"}.

    temperature 0 is greedy decoding; above 0 it samples from softmax(logits / temperature)
    over the whole vocabulary (no top-k/top-p, and none of the model's own sampling
    defaults). usage.completion_tokens counts generated tokens including a final EOS, so it
    never exceeds max_tokens. A prompt longer than the model's context keeps its last tokens,
    and max_tokens is cut to what still fits (finish_reason "length" then).
    """

    kind = "llm"
    max_batch_rows = 32

    def __init__(self, model_ref: str, *, device: str | None = None):
        super().__init__(model_ref, device=device)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        tokenizer.padding_side = "left"
        tokenizer.truncation_side = "left"  # an over-long prompt keeps its end, nearest the answer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

        if self.uses_cuda:
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dtype = torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, local_files_only=True, dtype=dtype
        )
        self.model.to(self.device).eval()

        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_ids = self._eos_token_ids()
        self.context_length = self._context_length()
        # generate() only builds position ids from the attention mask when forward() takes a
        # position_ids argument (it inspects the signature). Without them left padding would
        # shift absolute positions, so fall back to batching prompts of identical length only.
        if "position_ids" not in inspect.signature(self.model.forward).parameters:
            self.max_padding_ratio = 0.0

    def _eos_token_ids(self) -> list[int]:
        configured = self.model.generation_config.eos_token_id
        if configured is None:
            configured = self.tokenizer.eos_token_id
        if configured is None:
            return []
        return [int(configured)] if isinstance(configured, int) else [int(i) for i in configured]

    def _context_length(self) -> int:
        limits = [
            value
            for value in (
                getattr(self.model.config, "max_position_embeddings", None),
                getattr(self.model.config, "n_positions", None),
            )
            if value
        ]
        # Tokenizers without a limit report a huge sentinel; only trust realistic values.
        if self.tokenizer.model_max_length < 1_000_000:
            limits.append(self.tokenizer.model_max_length)
        return int(min(limits)) if limits else 2048

    def _encode_prompt(self, prompt: str) -> list[int]:
        # Leave room for at least one generated token.
        encoded = self.tokenizer(
            prompt, add_special_tokens=True, truncation=True, max_length=self.context_length - 1
        )
        return list(encoded["input_ids"])

    def _new_token_budget(self, prompt_length: int, payload: dict) -> int:
        requested = int(payload.get("max_tokens", DEFAULT_MAX_TOKENS))
        return max(0, min(requested, self.context_length - prompt_length))

    def count_tokens(self, payload: dict) -> int:
        """Prompt tokens plus the most tokens it may generate: each generated token is fed
        back through the model, so both count toward a batch's token budget."""
        prompt_length = len(self._encode_prompt(payload["prompt"]))
        return prompt_length + self._new_token_budget(prompt_length, payload)

    def run_batch(
        self, payloads: list[dict], *, on_text: Callable[[int, str], None] | None = None
    ) -> list[dict]:
        """`on_text(job_index, new_text)` is called after each decode step for every job
        whose payload asks to stream, with the text generated since the last call."""
        prompts = [self._encode_prompt(payload["prompt"]) for payload in payloads]
        budgets = [
            self._new_token_budget(len(ids), payload)
            for ids, payload in zip(prompts, payloads, strict=True)
        ]
        results: dict[int, dict] = {}

        # One generate() call can only use one decoding mode, so group jobs by temperature
        # (0 = greedy), then bucket each group by prompt length to keep left padding small.
        groups: dict[float, list[int]] = {}
        for job_index, payload in enumerate(payloads):
            temperature = max(0.0, float(payload.get("temperature", DEFAULT_TEMPERATURE)))
            groups.setdefault(temperature, []).append(job_index)

        with torch.inference_mode():
            for temperature, job_indices in groups.items():
                lengths = [len(prompts[j]) for j in job_indices]
                for bucket in self.plan_buckets(lengths):
                    members = [job_indices[i] for i in bucket]
                    streamed = {
                        row: job_index
                        for row, job_index in enumerate(members)
                        if on_text is not None and payloads[job_index].get("stream")
                    }
                    relay = (
                        StreamedText(self.tokenizer, self.eos_token_ids, streamed, on_text)
                        if streamed
                        else None
                    )
                    generated = self._generate(
                        [prompts[j] for j in members],
                        max(budgets[j] for j in members),
                        temperature,
                        relay=relay,
                    )
                    for job_index, new_tokens in zip(members, generated, strict=True):
                        results[job_index] = self._completion_result(
                            new_tokens, budgets[job_index], len(prompts[job_index])
                        )
        return [results[job_index] for job_index in range(len(payloads))]

    def _generate(
        self,
        prompts: Sequence[list[int]],
        max_new_tokens: int,
        temperature: float,
        *,
        relay: StreamedText | None = None,
    ) -> list[list[int]]:
        """Run one generate() call; return each row's new tokens (the prompt stripped)."""
        if max_new_tokens == 0:
            return [[] for _ in prompts]
        inputs = pad_token_rows(
            [{"input_ids": ids} for ids in prompts],
            pad_token_id=self.pad_token_id,
            side="left",
            device=self.device,
        )
        output = self.model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            generation_config=self._generation_config(max_new_tokens, temperature),
            # The payload alone decides decoding: no top-k/top-p/penalties from the model folder.
            use_model_defaults=False,
            stopping_criteria=StoppingCriteriaList([relay.at(inputs["input_ids"].shape[1])])
            if relay is not None
            else None,
        )
        return output[:, inputs["input_ids"].shape[1] :].cpu().tolist()

    def _generation_config(self, max_new_tokens: int, temperature: float) -> GenerationConfig:
        common = {
            "max_new_tokens": max_new_tokens,
            "eos_token_id": self.eos_token_ids or None,
            "pad_token_id": self.pad_token_id,
            "bos_token_id": self.model.generation_config.bos_token_id,
        }
        if temperature == 0.0:
            return GenerationConfig(do_sample=False, **common)
        # top_k=0 and top_p=1.0 switch those filters off: plain temperature sampling.
        return GenerationConfig(
            do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common
        )

    def _completion_result(self, new_tokens: list[int], budget: int, prompt_tokens: int) -> dict:
        kept, completion_tokens, finish_reason = trim_completion(
            new_tokens, limit=budget, eos_token_ids=self.eos_token_ids
        )
        return {
            "text": self.tokenizer.decode(kept, skip_special_tokens=True),
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
            "finish_reason": finish_reason,
        }


def trim_completion(
    new_tokens: Sequence[int], *, limit: int, eos_token_ids: Collection[int]
) -> tuple[list[int], int, str]:
    """Cut one row of a batched generate() to its own job.

    The row ran to the bucket's longest max_tokens and, after its EOS, was filled with padding;
    keep at most `limit` tokens and stop at the first EOS.
    Returns (tokens to decode, completion token count including the EOS, finish_reason).
    """
    window = list(new_tokens[:limit])
    for position, token_id in enumerate(window):
        if token_id in eos_token_ids:
            return window[:position], position + 1, "stop"
    return window, len(window), "length"


class StreamedText(StoppingCriteria):
    """Called by generate() after every decode step (as a stopping criterion that never stops):
    decodes the rows that stream and hands on the text each gained since the last step."""

    def __init__(
        self,
        tokenizer,
        eos_token_ids: Collection[int],
        rows: dict[int, int],
        on_text: Callable[[int, str], None],
    ):
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.rows = rows  # generate() row → job index
        self.on_text = on_text
        self.sent = dict.fromkeys(rows, "")
        self.prompt_width = 0

    def at(self, prompt_width: int) -> StreamedText:
        self.prompt_width = prompt_width
        return self

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        new = input_ids[:, self.prompt_width :].tolist()
        for row, job_index in self.rows.items():
            ids = new[row]
            ended = next((i for i, token in enumerate(ids) if token in self.eos), None)
            text = self.tokenizer.decode(ids[:ended], skip_special_tokens=True)
            # Only whole characters: a multi-byte character may span two tokens.
            if text.endswith("\ufffd"):
                continue
            if len(text) > len(self.sent[row]) and text.startswith(self.sent[row]):
                self.on_text(job_index, text[len(self.sent[row]) :])
                self.sent[row] = text
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
