"""Continuous (iteration-level) batching of text generation, on transformers' manager.

One long-lived `ContinuousGenerator` per loaded model runs a decode loop on its own thread:
between two decode steps new prompts join the batch and finished sequences leave it, so no
row waits for the longest one and no prompt waits for a pass to end. The KV cache is paged
(transformers' PagedAttentionCache): every request keeps its cache from prefill to its last
token, and nothing is prefilled twice unless it is evicted.

What is taken from transformers 4.57 (private hooks, hence the pinned version): the manager's
thread and queues (ContinuousBatchingManager), the paged cache, the batch processor that packs
a step's rows into one forward pass (ContinuousBatchProcessor.prepare_next_batch), and the
Scheduler base class. What is renq's, because the stock pieces cannot do it:

- admission by a priority key (`PriorityScheduler`): realtime first, then the order the worker
  gives (tier, fair-share start tag, arrival). A realtime request that finds every row busy
  takes the row of the lowest-priority running request in the very next step: that request is
  paused (skipped in the step, its KV blocks kept, so it resumes with no recompute). Only when
  the cache has no room for the realtime request's reservation is a lower-tier request evicted:
  its blocks are freed and it is prefilled again later over its prompt plus the tokens it
  generated, which it keeps. Pausing is the default because it costs nothing but the row's
  turn; eviction costs one prefill and only happens under memory pressure. Below realtime,
  a running row is never preempted (the worker's weighted share between tiers holds at the
  door, not by stopping work half done);
- per-request temperature (one decoding config per manager otherwise), several EOS ids and
  stop strings (the stock request stops on one int id only);
- memory safety: a request reserves blocks for prompt + max_new_tokens when admitted, so the
  cache never fills mid-generation (the stock manager raises and its thread dies); a request
  that could never fit is refused at submit (`RequestTooLarge`, naming the limit). If the
  thread dies anyway, a new manager is started and every request it held is resubmitted with
  the tokens it had (a request that takes the loop down twice is failed instead);
- no busy spin: with nothing to do the thread blocks on its input queue;
- results are copies (the stock streamed outputs share one list), and a cancelled request
  gets a final result.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import transformers
from transformers import GenerationConfig
from transformers.generation.continuous_batching import cache as paged_cache
from transformers.generation.continuous_batching.continuous_api import (
    ContinuousBatchingManager,
    ContinuousBatchProcessor,
)
from transformers.generation.continuous_batching.requests import RequestState, RequestStatus
from transformers.generation.continuous_batching.scheduler import Scheduler

from inference.engines.protocol import Finished, RequestTooLarge

logger = logging.getLogger(__name__)

# The hooks used here are private and changed a lot in transformers 5; pyproject pins this.
SUPPORTED_TRANSFORMERS = "4.57.6"
# The paged attention used for the continuous path (the model's own stays for generate()).
PAGED_ATTENTION = "sdpa_paged"
# A request that takes the decode loop down this many times is failed, not resubmitted again.
MAX_CRASHES = 2
# While requests wait for cache room (nothing can run), the loop looks again this often.
BLOCKED_WAIT_S = 0.01


@dataclass
class GenerationRequest(RequestState):
    """A request as the decode loop holds it: transformers' RequestState plus what renq's
    scheduling and stopping need."""

    eos_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    priority: tuple = ()
    preempts: bool = False  # realtime: may pause or evict lower-priority rows
    on_token: Callable[[str, list[int]], None] | None = None
    results: queue.Queue | None = None  # where its Finished goes (None: the generator's)
    finish_reason: str = ""
    stop_text: str | None = None
    admitted_step: int | None = None
    first_token_step: int | None = None
    evictions: int = 0
    crashes: int = 0

    def update_with_token(self, token_id: int) -> bool:
        """Add a generated token; True when the request is finished (EOS, budget, stop)."""
        if self.status != RequestStatus.DECODING:
            return False
        self.static_outputs.append(token_id)
        if token_id in self.eos_ids:
            self.finish_reason = "stop"
        elif len(self.static_outputs) >= self.max_new_tokens:
            self.finish_reason = "length"
        else:
            return False
        self._status = RequestStatus.FINISHED
        return True

    def needed_tokens(self) -> int:
        """Cache positions it may fill: the prompt and its whole budget."""
        return len(self.full_prompt_ids) + self.max_new_tokens

    def reset_for_recompute(self) -> None:
        """Back to waiting with no cache: its next prefill runs over prompt + generated."""
        self.prompt_ids = list(self.full_prompt_ids) + list(self.static_outputs)
        self.remaining_prompt_ids = []
        self.position_offset = 0
        self.allocated_blocks = 0
        self._status = RequestStatus.PENDING


class PriorityScheduler(Scheduler):
    """Each step: at most `rows` requests, realtime first, then running rows (no preemption
    below realtime), then waiting ones by priority key; a request is admitted only with a
    reservation of cache blocks for its prompt and its whole budget."""

    def __init__(self, cache, rows: int):
        super().__init__(cache, retain_cache_on_finish=False)
        self.rows = rows
        self.cancelled: list[GenerationRequest] = []
        self.evicted = 0
        self.paused = 0  # rows skipped for realtime work, over the scheduler's life

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.cache.block_size)

    def add_waiting_request(self, state: GenerationRequest) -> None:
        self.waiting_requests[state.request_id] = state
        self.waiting_requests_order.append(state.request_id)

    def clear_cancelled_requests(self) -> None:
        """As the base class does, and keeps what was cancelled for a final result."""
        with self._cancellation_lock:
            for request_id in self._requests_to_cancel:
                state = self.active_requests.pop(request_id, None) or self.waiting_requests.pop(
                    request_id, None
                )
                if state is None:
                    continue
                if state.allocated_blocks:
                    self.cache.free_blocks(request_id)
                    state.allocated_blocks = 0
                self.cancelled.append(state)
            self.waiting_requests_order = deque(
                r for r in self.waiting_requests_order if r not in self._requests_to_cancel
            )
            self._requests_to_cancel = set()

    def finish_request(self, request_id: str, evict_from_cache: bool = True) -> None:
        state = self.active_requests.pop(request_id, None)
        if state is not None and state.allocated_blocks:
            self.cache.free_blocks(request_id)
            state.allocated_blocks = 0

    def schedule_batch(self, token_budget: int) -> list[GenerationRequest]:
        running = list(self.active_requests.values())
        waiting = list(self.waiting_requests.values())
        candidates = sorted(
            running + waiting,
            key=lambda s: (not s.preempts, s.request_id not in self.active_requests, s.priority),
        )
        batch: list[GenerationRequest] = []
        admitted: set[str] = set()
        for state in candidates:
            if len(batch) >= self.rows or token_budget <= 0:
                break
            if state.request_id not in self.active_requests:
                if not self._reserve(state, batch):
                    if state.preempts:
                        continue  # another realtime request may still fit
                    break  # below realtime, admission keeps its order
                admitted.add(state.request_id)
            self._prepare_request_for_processing(state, token_budget, admitted)
            batch.append(state)
            token_budget -= len(state.prompt_ids)
        for state in self.waiting_requests.copy().values():
            if state.request_id in admitted:
                del self.waiting_requests[state.request_id]
        self.waiting_requests_order = deque(
            r for r in self.waiting_requests_order if r not in admitted
        )
        if any(state.preempts for state in batch):
            in_batch = {state.request_id for state in batch}
            self.paused += sum(
                1 for request_id in self.active_requests if request_id not in in_batch
            )
        return batch

    def _reserve(self, state: GenerationRequest, batch: list[GenerationRequest]) -> bool:
        """Blocks for the request's prompt and whole budget, evicting lower-priority running
        rows for a realtime request when the cache has no room for it."""
        needed = self.blocks_for(state.needed_tokens())
        if needed > self.cache.get_num_free_blocks() and state.preempts:
            victims = sorted(
                (s for s in self.active_requests.values() if not s.preempts and s not in batch),
                key=lambda s: s.priority,
                reverse=True,
            )
            for victim in victims:
                if needed <= self.cache.get_num_free_blocks():
                    break
                self.evict(victim)
        if needed > self.cache.get_num_free_blocks():
            return False
        state.allocated_blocks = self.cache.allocate_blocks(needed, state.request_id)
        return True

    def evict(self, state: GenerationRequest) -> None:
        """Free the request's cache and put it back to wait, keeping its tokens."""
        self.active_requests.pop(state.request_id, None)
        self.cache.free_blocks(state.request_id)
        state.reset_for_recompute()
        state.evictions += 1
        self.evicted += 1
        self.add_waiting_request(state)

    def all_requests(self) -> list[GenerationRequest]:
        return [*self.active_requests.values(), *self.waiting_requests.values()]


@dataclass
class CacheSize:
    """The paged cache's size: blocks of `block_size` tokens, and tokens per forward pass."""

    num_blocks: int
    block_size: int
    max_batch_tokens: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


@contextlib.contextmanager
def _host_memory_sizer() -> Iterator[None]:
    """transformers sizes the cache against CUDA/MPS memory only and crashes on a CPU; there,
    the host's available memory stands in for the device's."""
    handler = paged_cache.PagedAttentionMemoryHandler
    original = handler.__dict__["get_available_memory"]

    def host_available(max_memory_percent: float = 1.0) -> int:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(pages * max_memory_percent)

    handler.get_available_memory = staticmethod(host_available)
    try:
        yield
    finally:
        handler.get_available_memory = original


_sizer_lock = threading.Lock()


class _NoMetrics:
    """Stands in for transformers' per-step OpenTelemetry metrics (renq has its own)."""

    def __getattr__(self, name: str):
        return _ignore


def _ignore(*args, **kwargs) -> None:
    return None


def _without_spans(obj: object) -> object:
    """transformers wraps the continuous-batching methods in OpenTelemetry spans whenever
    opentelemetry is installed (renq installs it for its own tracing): a span per layer per
    decode step, exported with renq's traces when tracing is on, and their cost on every step
    when it is off. The instance gets the unwrapped methods."""
    seen: set[str] = set()
    for klass in type(obj).__mro__:
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            code = getattr(attr, "__code__", None)
            wrapped = getattr(attr, "__wrapped__", None)
            if (
                wrapped is not None
                and code is not None
                and code.co_name == "wrapper"
                and code.co_filename.endswith(os.path.join("utils", "metrics.py"))
            ):
                setattr(obj, name, types.MethodType(wrapped, obj))
    return obj


class _Manager(ContinuousBatchingManager):
    """transformers' manager with renq's decode loop (see the module's docstring)."""

    def __init__(self, generator: ContinuousGenerator, generation_config: GenerationConfig):
        super().__init__(generator.model, generation_config, streaming=False)
        self.generator = generator
        self.scheduler: PriorityScheduler | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """As the base class, on a daemon thread: an idle loop must not hold the process
        open at exit."""
        self._generation_thread = threading.Thread(
            target=self._run_generation_loop, name="renq-continuous-batching", daemon=True
        )
        self._generation_thread.start()

    def _run_generation_loop(self) -> None:
        generator = self.generator
        try:
            with _sizer_lock, contextlib.ExitStack() as stack:
                if not torch.cuda.is_available():
                    stack.enter_context(_host_memory_sizer())
                cache = paged_cache.PagedAttentionCache(
                    self.model.config, self.generation_config, self.model.device, self.model.dtype
                )
            _without_spans(cache)
            scheduler = _without_spans(PriorityScheduler(cache, generator.rows))
            processor = ContinuousBatchProcessor(
                cache,
                self.model.config,
                self.generation_config,
                self.input_queue,
                self.output_queue,
                self.stop_event,
                self.model.device,
                self.model.dtype,
                scheduler,
                streaming=False,
                manual_eviction=False,
                slice_inputs=True,
            )
            _without_spans(processor)
            processor.metrics = _NoMetrics()
            self.scheduler, self.batch_processor = scheduler, processor
            generator.started.set()
            while True:
                if not scheduler.has_pending_requests():
                    if self.stop_event.is_set() and self.input_queue.empty():
                        return
                    # Idle: block until a request (or the stop sentinel) arrives.
                    state = self.input_queue.get()
                    if state is not None:
                        scheduler.add_waiting_request(state)
                    continue
                self._step(processor, scheduler)
        except BaseException as exc:  # noqa: BLE001 - the generator restarts the loop
            self.error = exc
            logger.exception("continuous batching loop failed")
        finally:
            generator.started.set()
            generator.loop_ended(self)

    def _step(self, processor: ContinuousBatchProcessor, scheduler: PriorityScheduler) -> None:
        generator = self.generator
        ready = processor.prepare_next_batch()
        for state in scheduler.cancelled:
            generator.finish(state, "cancelled")
        scheduler.cancelled.clear()
        if not ready:
            # Requests wait for cache room held by cancelled or finishing work: look again
            # shortly, or sooner when a request arrives.
            with contextlib.suppress(queue.Empty):
                state = self.input_queue.get(timeout=BLOCKED_WAIT_S)
                if state is not None:
                    scheduler.add_waiting_request(state)
            return
        batch: list[GenerationRequest] = processor.requests_in_batch
        with_logits = [s for s in batch if not s.remaining_prompt_ids]
        step = generator.steps + 1
        for state in batch:
            if state.admitted_step is None:
                state.admitted_step = step
        generator.before_step(batch)
        kwargs = processor.get_model_kwargs()
        keep = processor.logits_indices[: len(with_logits)].long()
        with generator.forward_guard(), torch.inference_mode():
            logits = self.model(**kwargs, logits_to_keep=keep).logits[0]
            tokens = generator.next_tokens(logits, with_logits)
        generator.steps = step
        generator.note_step(len(batch), len(scheduler.waiting_requests))
        for state in batch:
            if state.remaining_prompt_ids:
                if state.status == RequestStatus.PREFILLING_SPLIT:
                    state.status = RequestStatus.SPLIT_PENDING_REMAINDER
        for state, token in zip(with_logits, tokens, strict=True):
            state._status = RequestStatus.DECODING
            state.prompt_ids = [token]
            if state.first_token_step is None:
                state.first_token_step = step
            done = state.update_with_token(token)
            if not done and state.stop:
                done = generator.hit_stop(state)
            if state.on_token is not None:
                generator.call_on_token(state)
            if done:
                scheduler.finish_request(state.request_id)
                generator.finish(state, state.finish_reason)


class ContinuousGenerator:
    """One model's continuous-batching decode loop, fed from any thread.

    `submit` adds a request; its final result goes to `results` (a queue of `Finished`) or to
    the `on_finished` callback; `on_token(request_id, tokens)` is called on the loop's thread
    after every step that gave the request a token (`tokens`: a copy of all it generated).
    """

    def __init__(
        self,
        model,
        *,
        rows: int,
        cache: CacheSize,
        decode: Callable[[Sequence[int]], str],
        forward_guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        on_finished: Callable[[Finished], None] | None = None,
        step_log_size: int = 100_000,
    ):
        if transformers.__version__ != SUPPORTED_TRANSFORMERS:
            raise RuntimeError(
                f"continuous batching is written against transformers {SUPPORTED_TRANSFORMERS}, "
                f"not {transformers.__version__}"
            )
        self.model = model
        self.rows = rows
        self.cache = cache
        self.decode = decode
        self.forward_guard = forward_guard
        self.on_finished = on_finished
        self.results: queue.Queue[Finished] = queue.Queue()
        self.steps = 0
        self.restarts = 0
        # (time.monotonic(), rows in the step, requests waiting): for plots and tests.
        self.step_log: deque[tuple[float, int, int]] = deque(maxlen=step_log_size)
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._requests: dict[str, GenerationRequest] = {}  # submitted and not finished
        self._seq = itertools.count()
        self._closed = False
        self._step_hook: Callable[[list[GenerationRequest]], None] | None = None
        # Run once on the loop's thread before its next step (and again after a restart).
        self._thread_initializer: Callable[[], None] | None = None
        self._initialized: threading.Thread | None = None
        self._manager = self._start_manager()

    @property
    def max_request_tokens(self) -> int:
        return self.cache.tokens

    def set_rows(self, rows: int) -> None:
        """Rows per decode step from the next step on (the worker sets its service's
        batch_size)."""
        self.rows = max(1, int(rows))
        scheduler = self._manager.scheduler
        if scheduler is not None:
            scheduler.rows = self.rows

    def _generation_config(self) -> GenerationConfig:
        return GenerationConfig(
            do_sample=False,
            max_new_tokens=1,
            eos_token_id=-1,
            num_blocks=self.cache.num_blocks,
            block_size=self.cache.block_size,
            max_batch_tokens=self.cache.max_batch_tokens,
        )

    def _start_manager(self) -> _Manager:
        self.started.clear()
        manager = _Manager(self, self._generation_config())
        manager.start()
        self.started.wait(timeout=60)
        if manager.error is not None:
            raise RuntimeError(f"continuous batching could not start: {manager.error}")
        return manager

    def submit(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        eos_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        priority: tuple = (),
        preempts: bool = False,
        on_token: Callable[[str, list[int]], None] | None = None,
        results: queue.Queue | None = None,
    ) -> None:
        """Queue a request (any thread). Raises RequestTooLarge when it can never fit.
        Its Finished goes to `results` if given (each caller its own), else to
        on_finished or self.results."""
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        needed = len(prompt_ids) + max_new_tokens
        if needed > self.max_request_tokens:
            raise RequestTooLarge(needed, self.max_request_tokens)
        state = GenerationRequest(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            full_prompt_ids=list(prompt_ids),
            max_new_tokens=max_new_tokens,
            eos_ids=frozenset(int(i) for i in eos_ids),
            stop=tuple(s for s in stop if s),
            temperature=max(0.0, float(temperature)),
            # Arrival breaks ties: equal keys run in the order they were submitted.
            priority=(*priority, next(self._seq)),
            preempts=preempts,
            on_token=on_token,
            results=results,
        )
        with self._lock:
            if self._closed:
                raise RuntimeError("the continuous batching loop is stopped")
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} is already running")
            self._requests[request_id] = state
            self._manager.input_queue.put(state)

    def cancel(self, request_id: str) -> None:
        """Stop a request; its final result comes with finish_reason "cancelled"."""
        manager = self._manager
        if manager.scheduler is not None:
            manager.scheduler.set_request_cancellation(request_id)
            manager.input_queue.put(None)  # wakes an idle loop

    @property
    def in_flight(self) -> int:
        """Submitted requests without a final result yet."""
        with self._lock:
            return len(self._requests)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish what is running, then end the loop's thread."""
        with self._lock:
            self._closed = True
            manager = self._manager
        manager.stop_event.set()
        manager.input_queue.put(None)
        manager.join(timeout=timeout_s)

    # --- called on the loop's thread ----------------------------------------------------------

    def set_thread_initializer(self, initializer: Callable[[], None]) -> None:
        """Have the loop's thread call `initializer` before its next step (and its
        successor's, after a restart): the worker pins it to the model's cores."""
        if initializer is not self._thread_initializer:
            self._thread_initializer, self._initialized = initializer, None

    def before_step(self, batch: list[GenerationRequest]) -> None:
        initializer = self._thread_initializer
        if initializer is not None and self._initialized is not threading.current_thread():
            self._initialized = threading.current_thread()
            initializer()
        if self._step_hook is not None:
            self._step_hook(batch)

    def note_step(self, rows: int, waiting: int) -> None:
        self.step_log.append((time.monotonic(), rows, waiting))

    def next_tokens(self, logits: torch.Tensor, rows: list[GenerationRequest]) -> list[int]:
        """Each row's next token: greedy at temperature 0, else sampled from
        softmax(logits / temperature) over the whole vocabulary (as LlmEngine's generate())."""
        greedy = logits.argmax(dim=-1)
        temperatures = [state.temperature for state in rows]
        if not any(temperatures):
            return greedy.tolist()
        scale = torch.tensor(temperatures, dtype=logits.dtype, device=logits.device)
        sampling = scale > 0
        probs = torch.softmax(logits.float() / scale.clamp(min=1e-6).unsqueeze(-1).float(), -1)
        sampled = torch.multinomial(probs, num_samples=1).squeeze(-1)
        return torch.where(sampling, sampled, greedy).tolist()

    def hit_stop(self, state: GenerationRequest) -> bool:
        """A stop string in the generated text ends the request ("stop")."""
        text = self.decode(state.static_outputs)
        for stop in state.stop:
            if stop in text:
                state.stop_text = stop
                state.finish_reason = "stop"
                state._status = RequestStatus.FINISHED
                return True
        return False

    def call_on_token(self, state: GenerationRequest) -> None:
        try:
            state.on_token(state.request_id, list(state.static_outputs))
        except Exception:
            # Streaming is a preview: a broken relay never stops the generation.
            logger.warning("on_token of %s raised", state.request_id, exc_info=True)

    def finish(self, state: GenerationRequest, reason: str, error: str | None = None) -> None:
        with self._lock:
            if self._requests.pop(state.request_id, None) is None:
                return
        finished = Finished(
            request_id=state.request_id,
            tokens=list(state.static_outputs),
            finish_reason=reason,
            prompt_tokens=len(state.full_prompt_ids),
            max_new_tokens=state.max_new_tokens,
            error=error,
            stop_text=state.stop_text,
            admitted_step=state.admitted_step,
            first_token_step=state.first_token_step,
            finished_step=self.steps,
            evictions=state.evictions,
            restarts=state.crashes,
        )
        if state.results is not None:
            state.results.put(finished)
        elif self.on_finished is not None:
            self.on_finished(finished)
        else:
            self.results.put(finished)

    def loop_ended(self, manager: _Manager) -> None:
        """The loop's thread ends: on a stop, that is all; after a crash, a new manager takes
        over every request the old one held, with the tokens each had generated."""
        if manager.error is None:
            return
        with self._lock:
            if self._closed or manager is not self._manager:
                return
            held = list(self._requests.values())
        crashed_in = set()
        if manager.batch_processor is not None:
            crashed_in = {s.request_id for s in manager.batch_processor.requests_in_batch}
        resubmit = []
        for state in held:
            if state.request_id in crashed_in:
                state.crashes += 1
            if state.crashes >= MAX_CRASHES:
                self.finish(
                    state, "error", error=f"{type(manager.error).__name__}: {manager.error}"
                )
                continue
            state.reset_for_recompute()
            resubmit.append(state)
        self.restarts += 1
        logger.warning("continuous batching loop restarted; %d requests resubmitted", len(resubmit))
        # A fresh thread: this one is ending.
        threading.Thread(
            target=self._restart, args=(resubmit,), name="renq-cb-restart", daemon=True
        ).start()

    def _restart(self, resubmit: list[GenerationRequest]) -> None:
        manager = self._start_manager()
        with self._lock:
            self._manager = manager
            pending = [s for s in resubmit if s.request_id in self._requests]
            # Submitted while the old loop was going down: in its queue, not in `held`.
            known = {s.request_id for s in pending}
            pending += [s for rid, s in self._requests.items() if rid not in known]
            for state in sorted(pending, key=lambda s: s.priority):
                if state.status != RequestStatus.PENDING:
                    state.reset_for_recompute()
                manager.input_queue.put(state)


def size_cache(
    *,
    rows: int,
    context_length: int,
    block_size: int = 16,
    max_batch_tokens: int | None = None,
    max_tokens: int | None = None,
) -> CacheSize:
    """A cache that holds `rows` requests of the full context at once, so reservations only
    queue work when every row is busy with long generations; at most `max_tokens` (a device
    memory budget), and never less than one full context."""
    tokens = rows * context_length
    if max_tokens is not None:
        tokens = max(context_length, min(tokens, max_tokens))
    num_blocks = math.ceil(tokens / block_size)
    if max_batch_tokens is None:
        max_batch_tokens = max(256, min(context_length, 2048))
    return CacheSize(
        num_blocks=num_blocks, block_size=block_size, max_batch_tokens=max_batch_tokens
    )
