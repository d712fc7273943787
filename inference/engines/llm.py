"""Text generation with a causal LM, batched with left padding.

Left padding keeps every prompt's last token in the last column, where generate() appends.
generate() also derives position ids from the attention mask (cumsum − 1), so a padded prompt
sees the same positions as when it runs alone and greedy output does not depend on its
batch-mates.

A generation may run in several passes (chunked decoding, so that a long low-tier generation
does not hold the model for its whole length): `run_batch(..., max_steps=[...])` stops a job
after that many decode steps and returns `{RESUME: state}` instead of its result; the same
payload with that state under RESUME continues it. The next pass feeds the prompt's token ids
plus the ids generated so far (never re-tokenized text) with the budget reduced by what was
generated, so a greedy generation in chunks is the unchunked one; no KV cache is kept between
passes, so each continuation runs prefill again over prompt + generated tokens.

Where the model supports transformers' paged KV cache (checked with one prompt at load), the
engine also runs a continuous-batching decode loop (`inference.engines.continuous`): the GPU
worker feeds it jobs one at a time (`start_generation`) and stores each as it finishes
(`generation_result`), with no passes and no re-prefill. run_batch (generate()) stays for
models the paged cache does not support, and gives the same greedy output.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import queue
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

from inference.engines.base import Engine, pad_token_rows
from inference.engines.continuous import (
    PAGED_ATTENTION,
    ContinuousGenerator,
    size_cache,
)
from inference.engines.protocol import RESUME, Finished
from inference.jobs.inputs import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE

logger = logging.getLogger(__name__)

# "0" turns continuous batching off in this process: every model is served by generate().
CONTINUOUS_BATCHING_ENV = "RENQ_CONTINUOUS_BATCHING"


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
    # run_batch can stop a job after some decode steps and continue it later (RESUME).
    resumable = True
    # Continuous batching, where the model supports it: rows decoded together per step, and
    # the paged KV cache's tokens per forward pass (None: the context length, at least 256).
    continuous_batching = True
    continuous_rows = 32
    continuous_batch_tokens: int | None = None
    # On a GPU, the share of its free memory the paged KV cache may take at most.
    continuous_cache_memory_share = 0.3

    def __init__(
        self,
        model_ref: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        continuous: bool | None = None,
    ):
        super().__init__(model_ref, device=device, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        tokenizer.padding_side = "left"
        tokenizer.truncation_side = "left"  # an over-long prompt keeps its end, nearest the answer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, local_files_only=True, dtype=self.dtype
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

        # generate() and the paged decode loop share the model; the attention implementation
        # is read from its config at each forward, so each switches it under this lock.
        self._model_lock = threading.RLock()
        self._attention = self.model.config._attn_implementation
        self.continuous: ContinuousGenerator | None = None
        if continuous is None:
            continuous = self.continuous_batching and os.environ.get(CONTINUOUS_BATCHING_ENV) != "0"
        if continuous:
            self.continuous = self._start_continuous()

    @property
    def supports_continuous(self) -> bool:
        return self.continuous is not None

    def close(self) -> None:
        """End the continuous-batching loop's thread (after what it is running)."""
        if self.continuous is not None:
            self.continuous.close()

    @contextlib.contextmanager
    def _attention_as(self, implementation: str) -> Iterator[None]:
        with self._model_lock:
            config = self.model.config
            before = config._attn_implementation
            config._attn_implementation = implementation
            try:
                yield
            finally:
                config._attn_implementation = before

    def _paged_forward(self) -> contextlib.AbstractContextManager:
        return self._attention_as(PAGED_ATTENTION)

    def _start_continuous(self) -> ContinuousGenerator | None:
        """The continuous-batching loop, if one greedy prompt through it gives generate()'s
        tokens; None (generate() only) if the model's attention has no paged form or gives
        other tokens with it."""
        generator = None
        probe = self._encode_prompt("The continuous batching check")
        try:
            generator = ContinuousGenerator(
                self.model,
                rows=self.continuous_rows,
                cache=size_cache(
                    rows=self.continuous_rows,
                    context_length=self.context_length,
                    max_batch_tokens=self.continuous_batch_tokens,
                    max_tokens=self._cache_token_budget(),
                ),
                decode=self._decode,
                forward_guard=self._paged_forward,
            )
            steps = min(4, self.context_length - len(probe))
            generator.submit("renq-load-check", probe, steps)
            finished = generator.results.get(timeout=120)
            expected = self._generate([probe], steps, 0.0)[0]
            if finished.error or finished.tokens != expected[: len(finished.tokens)]:
                raise RuntimeError(
                    f"paged attention gave {finished.tokens} (error {finished.error}), "
                    f"generate() {expected}"
                )
        except Exception as exc:  # noqa: BLE001 - any failure means: generate() only
            logger.info("%s: no continuous batching (%s); generate() serves it", self, exc)
            if generator is not None:
                generator.close()
            return None
        return generator

    def _cache_token_budget(self) -> int | None:
        """On CUDA, the KV cache tokens that fit continuous_cache_memory_share of the free
        memory (the rest stays for activations and other models); None on a CPU."""
        if not self.uses_cuda:
            return None
        config = self.model.config
        layers = config.num_hidden_layers
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        per_token = 2 * layers * kv_heads * head_dim * torch.finfo(self.dtype).bits // 8
        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        return int(free * self.continuous_cache_memory_share // per_token)

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def auto_dtype(self) -> torch.dtype:
        # bf16's range keeps long generations from overflowing where fp16 might.
        if self.uses_cuda:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32

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

    def _prompt_and_generated(self, payload: dict) -> tuple[list[int], list[int]]:
        """The prompt's token ids and those generated by earlier passes (none at first)."""
        state = payload.get(RESUME)
        if state:
            return list(state["prompt_ids"]), list(state["generated_ids"])
        return self._encode_prompt(payload["prompt"]), []

    def count_tokens(self, payload: dict) -> int:
        """Prompt tokens plus the most tokens it may generate: each generated token is fed
        back through the model, so both count toward a batch's token budget."""
        prompt, _ = self._prompt_and_generated(payload)
        return len(prompt) + self._new_token_budget(len(prompt), payload)

    def decode_progress(self, payload: dict) -> tuple[int, int]:
        """(tokens the next pass starts from: prompt + generated so far, decode steps left)."""
        prompt, generated = self._prompt_and_generated(payload)
        budget = self._new_token_budget(len(prompt), payload)
        return len(prompt) + len(generated), budget - len(generated)

    def run_batch(
        self,
        payloads: list[dict],
        *,
        on_text: Callable[[int, str], None] | None = None,
        max_steps: Sequence[int | None] | None = None,
    ) -> list[dict]:
        """`on_text(job_index, new_text)` is called after each decode step for every job
        whose payload asks to stream, with the text generated since the last call (across
        passes: the text a continued job streamed before is not sent again).

        `max_steps[j]` (None: no bound) stops job j after at most that many decode steps if
        it has not finished by then; its result is then `{RESUME: state}`, to continue in a
        later pass with `{**payload, RESUME: state}`."""
        with self._model_lock:
            return self._run_batch(payloads, on_text, max_steps)

    def _run_batch(
        self,
        payloads: list[dict],
        on_text: Callable[[int, str], None] | None,
        max_steps: Sequence[int | None] | None,
    ) -> list[dict]:
        bounds = list(max_steps) if max_steps is not None else [None] * len(payloads)
        results = self._one_pass(payloads, on_text, bounds)
        # generate() stops where a bucket's widest row reaches the context length, which may
        # cut a padded row short of its budget: a job that asked for no bound continues now.
        while unfinished := [j for j, r in enumerate(results) if RESUME in r and bounds[j] is None]:
            again = self._one_pass(
                [{**payloads[j], RESUME: results[j][RESUME]} for j in unfinished],
                None if on_text is None else _renumbered(on_text, unfinished),
                [None] * len(unfinished),
            )
            for job_index, result in zip(unfinished, again, strict=True):
                results[job_index] = result
        return results

    def _one_pass(
        self,
        payloads: list[dict],
        on_text: Callable[[int, str], None] | None,
        bounds: list[int | None],
    ) -> list[dict]:
        contexts = [self._prompt_and_generated(payload) for payload in payloads]
        budgets = [
            self._new_token_budget(len(prompt), payload)
            for (prompt, _), payload in zip(contexts, payloads, strict=True)
        ]
        # Decode steps each job may still take, and those it may take in this pass.
        left = [
            budget - len(generated)
            for budget, (_, generated) in zip(budgets, contexts, strict=True)
        ]
        steps = [
            n if bound is None else min(n, max(1, int(bound)))
            for n, bound in zip(left, bounds, strict=True)
        ]
        streamed_before = [(payload.get(RESUME) or {}).get("streamed", "") for payload in payloads]
        results: dict[int, dict] = {}

        # One generate() call can only use one decoding mode, so group jobs by temperature
        # (0 = greedy), then bucket each group by input length (prompt + tokens generated by
        # earlier passes) to keep left padding small.
        groups: dict[float, list[int]] = {}
        for job_index, payload in enumerate(payloads):
            temperature = max(0.0, float(payload.get("temperature", DEFAULT_TEMPERATURE)))
            groups.setdefault(temperature, []).append(job_index)

        with torch.inference_mode():
            for temperature, job_indices in groups.items():
                inputs = {j: contexts[j][0] + contexts[j][1] for j in job_indices}
                lengths = [len(inputs[j]) for j in job_indices]
                for bucket in self.plan_buckets(lengths):
                    members = [job_indices[i] for i in bucket]
                    streamed = {
                        row: StreamedRow(
                            job_index,
                            before_ids=contexts[job_index][1],
                            sent=streamed_before[job_index],
                            limit=left[job_index],
                        )
                        for row, job_index in enumerate(members)
                        if on_text is not None and payloads[job_index].get("stream")
                    }
                    relay = (
                        StreamedText(self.tokenizer, self.eos_token_ids, streamed, on_text)
                        if streamed
                        else None
                    )
                    width = max(len(inputs[j]) for j in members)
                    generated = self._generate(
                        [inputs[j] for j in members],
                        min(max(steps[j] for j in members), self.context_length - width),
                        temperature,
                        relay=relay,
                    )
                    for row, (job_index, new_tokens) in enumerate(
                        zip(members, generated, strict=True)
                    ):
                        prompt, before = contexts[job_index]
                        results[job_index] = self._pass_result(
                            prompt,
                            # A row may run past its own steps (a bucket-mate's are longer):
                            # those tokens are its own too, up to its budget.
                            before + new_tokens[: left[job_index]],
                            budgets[job_index],
                            streamed[row].sent if row in streamed else "",
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

    def _pass_result(
        self, prompt: list[int], generated: list[int], budget: int, streamed: str
    ) -> dict:
        """The job's result once it is finished (an EOS, or its whole budget), else the state
        a later pass continues it from."""
        if len(generated) < budget and not set(generated) & set(self.eos_token_ids):
            return {
                RESUME: {"prompt_ids": prompt, "generated_ids": generated, "streamed": streamed}
            }
        return self._completion_result(generated, budget, len(prompt))

    def start_generation(
        self,
        request_id: str,
        payload: dict,
        *,
        priority: tuple = (),
        preempts: bool = False,
        on_text: Callable[[str], None] | None = None,
        results: queue.Queue | None = None,
    ) -> dict | None:
        """Hand one job to the continuous-batching loop (any thread); its result comes on
        `results` (default `self.continuous.results`) as a Finished, for generation_result.
        `on_text(new_text)` is called on the loop's thread as text is generated. Returns the
        result at once when there is nothing to generate (no room left in the context)."""
        prompt = self._encode_prompt(payload["prompt"])
        budget = self._new_token_budget(len(prompt), payload)
        if budget == 0:
            return self._completion_result([], 0, len(prompt))
        stop = payload.get("stop") or ()
        self.continuous.submit(
            request_id,
            prompt,
            budget,
            temperature=float(payload.get("temperature", DEFAULT_TEMPERATURE)),
            eos_ids=self.eos_token_ids,
            stop=[stop] if isinstance(stop, str) else list(stop),
            priority=priority,
            preempts=preempts,
            on_token=None if on_text is None else StreamedTokens(self, on_text),
            results=results,
        )
        return None

    def generation_result(self, finished: Finished) -> dict:
        """A finished continuous generation as run_batch returns it: {"text", "usage",
        "finish_reason"}. Raises for a request that failed."""
        if finished.error is not None:
            raise RuntimeError(finished.error)
        result = self._completion_result(
            finished.tokens, finished.max_new_tokens, finished.prompt_tokens
        )
        if finished.stop_text is not None:
            # Text up to the stop string, as OpenAI returns it; its tokens were generated.
            result["text"] = result["text"].split(finished.stop_text, 1)[0]
            result["finish_reason"] = "stop"
        return result

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


def _renumbered(
    on_text: Callable[[int, str], None], job_indices: list[int]
) -> Callable[[int, str], None]:
    """on_text for a call over some of the jobs: its job k is job_indices[k]."""
    return lambda k, text: on_text(job_indices[k], text)


@dataclass
class StreamedRow:
    """One streaming job's row of a generate() call."""

    job_index: int
    before_ids: list[int] = field(default_factory=list)  # generated by earlier passes
    sent: str = ""  # the text handed on so far, earlier passes included
    limit: int | None = None  # the row's own new tokens; after them it runs for bucket-mates


class StreamedText(StoppingCriteria):
    """Called by generate() after every decode step (as a stopping criterion that never stops):
    decodes the rows that stream and hands on the text each gained since the last step."""

    def __init__(
        self,
        tokenizer,
        eos_token_ids: Collection[int],
        rows: dict[int, StreamedRow],
        on_text: Callable[[int, str], None],
    ):
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.rows = rows  # generate() row → its job
        self.on_text = on_text
        self.prompt_width = 0

    def at(self, prompt_width: int) -> StreamedText:
        self.prompt_width = prompt_width
        return self

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        new = input_ids[:, self.prompt_width :].tolist()
        for row, job in self.rows.items():
            ids = new[row][: job.limit]
            ended = next((i for i, token in enumerate(ids) if token in self.eos), None)
            # Decoded whole, earlier passes included: text is not the sum of decoded pieces.
            text = self.tokenizer.decode(job.before_ids + ids[:ended], skip_special_tokens=True)
            # Only whole characters: a multi-byte character may span two tokens.
            if text.endswith("\ufffd"):
                continue
            if len(text) > len(job.sent) and text.startswith(job.sent):
                self.on_text(job.job_index, text[len(job.sent) :])
                job.sent = text
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class StreamedTokens:
    """on_token for one continuous generation: hands on the text its tokens added since the
    last call (decoded whole, up to an EOS; only whole characters)."""

    def __init__(self, engine: LlmEngine, on_text: Callable[[str], None]):
        self._decode = engine._decode
        self._eos = set(engine.eos_token_ids)
        self._on_text = on_text
        self.sent = ""

    def __call__(self, request_id: str, tokens: list[int]) -> None:
        ended = next((i for i, token in enumerate(tokens) if token in self._eos), None)
        text = self._decode(tokens[:ended])
        if text.endswith("\ufffd"):
            return
        if len(text) > len(self.sent) and text.startswith(self.sent):
            self._on_text(text[len(self.sent) :])
            self.sent = text
