"""Continuous batching (inference.engines.continuous) with the tiny Llama on the CPU: greedy
output is generate()'s, prompts join running generations, realtime work takes a row within
one decode step, per-request decoding parameters, memory safety and restarts.

Steps are counted by the loop (`Finished.*_step`), so ordering is asserted on steps, never
on wall time. A step hook (`_step_hook`, run on the loop's thread before each step) submits
work at an exact step."""

from __future__ import annotations

import sys
import threading

import pytest
import transformers

from inference.engines.continuous import (
    SUPPORTED_TRANSFORMERS,
    CacheSize,
    ContinuousGenerator,
    Finished,
    RequestTooLarge,
)
from inference.engines.llm import LlmEngine
from tests.inference.engines.test_engines import LLM_JOBS, TINY_LLM_REF

RESULT_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def llm(tiny_models) -> LlmEngine:
    return LlmEngine(TINY_LLM_REF, device="cpu")


def generator_for(
    llm: LlmEngine, *, rows: int = 8, num_blocks: int = 256, block_size: int = 16
) -> ContinuousGenerator:
    return ContinuousGenerator(
        llm.model,
        rows=rows,
        cache=CacheSize(num_blocks=num_blocks, block_size=block_size, max_batch_tokens=256),
        decode=llm._decode,
        forward_guard=llm._paged_forward,
    )


@pytest.fixture
def make_generator(llm):
    made: list[ContinuousGenerator] = []

    def make(**kwargs) -> ContinuousGenerator:
        made.append(generator_for(llm, **kwargs))
        return made[-1]

    yield make
    for generator in made:
        generator.close()


def results(generator: ContinuousGenerator, count: int) -> dict[str, Finished]:
    found = {}
    for _ in range(count):
        finished = generator.results.get(timeout=RESULT_TIMEOUT_S)
        found[finished.request_id] = finished
    return found


def greedy(llm: LlmEngine, prompt: str, max_tokens: int) -> list[int]:
    """generate()'s greedy tokens, with no EOS stop (the reference for a row)."""
    ids = llm._encode_prompt(prompt)
    return llm._generate([ids], max_tokens, 0.0)[0]


def test_transformers_is_the_pinned_version():
    # The adapter uses private hooks; a different version must be a deliberate upgrade.
    assert transformers.__version__ == SUPPORTED_TRANSFORMERS


def test_the_tiny_llm_passes_the_load_check(llm):
    assert llm.supports_continuous


def test_without_continuous_batching_the_engine_serves_by_generate(tiny_models):
    engine = LlmEngine(TINY_LLM_REF, device="cpu", continuous=False)
    assert not engine.supports_continuous
    assert engine.run_batch(LLM_JOBS[:2])[0]["usage"]["completion_tokens"] > 0


def test_greedy_results_are_generate_results(llm):
    expected = llm.run_batch(LLM_JOBS)
    for i, job in enumerate(LLM_JOBS):
        assert llm.start_generation(f"same-{i}", job) is None
    found = results(llm.continuous, len(LLM_JOBS))
    got = [llm.generation_result(found[f"same-{i}"]) for i in range(len(LLM_JOBS))]
    assert got == expected


def test_streamed_text_adds_up_to_the_result(llm):
    pieces: list[str] = []
    job = {"prompt": "once upon a time", "max_tokens": 30, "temperature": 0}
    llm.start_generation("streamed", job, on_text=pieces.append)
    result = llm.generation_result(results(llm.continuous, 1)["streamed"])
    assert len(pieces) > 1
    assert "".join(pieces) == result["text"]


def test_a_prompt_joins_a_running_generation(llm, make_generator):
    generator = make_generator(rows=4)
    joined_at: list[int] = []

    def join_later(batch):
        if generator.steps == 10 and not joined_at:
            joined_at.append(generator.steps)
            generator.submit("short", llm._encode_prompt("hello there"), 5)

    generator._step_hook = join_later
    generator.submit("long", llm._encode_prompt("once upon a time"), 60)
    found = results(generator, 2)
    long, short = found["long"], found["short"]
    # Admitted in the step after it arrived, while the long one was mid-generation, and out
    # before it: no waiting for a pass to end.
    assert short.admitted_step == joined_at[0] + 2
    assert long.admitted_step < short.admitted_step < short.finished_step < long.finished_step
    # Joining changes nobody's tokens.
    assert long.tokens == greedy(llm, "once upon a time", 60)
    assert short.tokens == greedy(llm, "hello there", 5)


def test_a_realtime_prompt_gets_a_row_within_one_step_when_every_row_is_busy(llm, make_generator):
    generator = make_generator(rows=2)
    arrived: list[int] = []

    def realtime_arrives(batch):
        if generator.steps == 5 and not arrived:
            # Submitted before step 6 runs: it must run in step 7 at the latest; with the
            # loop's queue read at the start of each step, step 6 itself is too late.
            arrived.append(generator.steps)
            generator.submit(
                "realtime", llm._encode_prompt("urgent"), 4, priority=(0,), preempts=True
            )

    generator._step_hook = realtime_arrives
    for name in ("low-a", "low-b"):
        generator.submit(name, llm._encode_prompt(f"{name} story"), 40, priority=(3,))
    found = results(generator, 3)
    realtime = found["realtime"]
    assert realtime.first_token_step <= arrived[0] + 2
    assert realtime.finished_step < min(found["low-a"].finished_step, found["low-b"].finished_step)
    # A low-tier row was paused, not evicted: nothing recomputed, and its tokens are its own.
    assert found["low-a"].evictions == found["low-b"].evictions == 0
    for name in ("low-a", "low-b"):
        assert found[name].tokens == greedy(llm, f"{name} story", 40)
    assert generator._manager.scheduler.paused > 0


def test_short_of_cache_a_realtime_prompt_evicts_a_low_row_that_keeps_its_tokens(
    llm, make_generator
):
    # Room for exactly two 40-token generations of these prompts (4 blocks of 16 tokens each).
    generator = make_generator(rows=4, num_blocks=8, block_size=16)
    arrived: list[int] = []

    def realtime_arrives(batch):
        if generator.steps == 10 and not arrived:
            arrived.append(generator.steps)
            generator.submit(
                "realtime", llm._encode_prompt("urgent"), 20, priority=(0,), preempts=True
            )

    generator._step_hook = realtime_arrives
    for name in ("low-a", "low-b"):
        generator.submit(name, llm._encode_prompt(f"{name} story"), 50, priority=(3,))
    found = results(generator, 3)
    assert found["realtime"].first_token_step <= arrived[0] + 2
    evicted = [found[name] for name in ("low-a", "low-b") if found[name].evictions]
    assert len(evicted) == 1
    # Recomputed over prompt + what it had generated: the same tokens as in one go.
    for name in ("low-a", "low-b"):
        assert found[name].tokens == greedy(llm, f"{name} story", 50)


def test_admission_follows_the_priority_key(llm, make_generator):
    generator = make_generator(rows=1)
    running, hold = threading.Event(), threading.Event()

    def wait_for_all(batch):
        # The one row is taken: everything submitted meanwhile waits to be admitted.
        running.set()
        hold.wait(RESULT_TIMEOUT_S)

    generator._step_hook = wait_for_all
    generator.submit("first", llm._encode_prompt("a"), 2, priority=(2, 0.0))
    assert running.wait(RESULT_TIMEOUT_S)
    for name, key in (("offline", (3, 0.0)), ("api-late", (1, 5.0)), ("api-early", (1, 1.0))):
        generator.submit(name, llm._encode_prompt(name), 2, priority=key)
    hold.set()
    found = results(generator, 4)
    order = sorted(found, key=lambda name: found[name].admitted_step)
    assert order == ["first", "api-early", "api-late", "offline"]


def test_temperature_is_per_request(llm, make_generator):
    generator = make_generator(rows=4)
    prompt = llm._encode_prompt("the quick brown fox")
    generator.submit("greedy", prompt, 30)
    generator.submit("hot-a", prompt, 30, temperature=2.0)
    generator.submit("hot-b", prompt, 30, temperature=2.0)
    found = results(generator, 3)
    # Sampled in the same steps as a greedy row, which stays generate()'s.
    assert found["greedy"].tokens == greedy(llm, "the quick brown fox", 30)
    assert found["hot-a"].tokens != found["greedy"].tokens
    assert found["hot-a"].tokens != found["hot-b"].tokens


def test_any_of_several_eos_ids_stops_a_request(llm, make_generator):
    generator = make_generator()
    reference = greedy(llm, "once upon a time", 30)
    first_eos, second_eos = reference[7], reference[4]
    generator.submit(
        "two-eos",
        llm._encode_prompt("once upon a time"),
        30,
        eos_ids=[first_eos, second_eos, llm.tokenizer.sep_token_id],
    )
    finished = results(generator, 1)["two-eos"]
    assert finished.finish_reason == "stop"
    assert finished.tokens == reference[: reference.index(second_eos) + 1]


def test_the_engine_applies_every_eos_id_of_the_model(llm, monkeypatch):
    reference = greedy(llm, "once upon a time", 30)
    monkeypatch.setattr(llm, "eos_token_ids", [*llm.eos_token_ids, reference[3]])
    job = {"prompt": "once upon a time", "max_tokens": 30, "temperature": 0}
    llm.start_generation("model-eos", job)
    result = llm.generation_result(results(llm.continuous, 1)["model-eos"])
    assert result["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == 4  # the EOS counts, as with generate()
    assert result["text"] == llm._decode(reference[:3])


def test_a_stop_string_ends_a_request_and_is_cut_from_its_text(llm):
    reference = greedy(llm, "once upon a time", 30)
    stop = llm._decode(reference[5:7])
    job = {"prompt": "once upon a time", "max_tokens": 30, "temperature": 0, "stop": [stop]}
    llm.start_generation("stop-string", job)
    result = llm.generation_result(results(llm.continuous, 1)["stop-string"])
    assert result["finish_reason"] == "stop"
    assert stop not in result["text"]
    assert result["text"] == llm._decode(reference[:7]).split(stop, 1)[0]


def test_a_request_that_can_never_fit_is_refused_naming_the_limit(llm, make_generator):
    generator = make_generator(num_blocks=4, block_size=16)
    with pytest.raises(RequestTooLarge, match="64 tokens"):
        generator.submit("too-big", llm._encode_prompt("hello"), 100)
    assert generator.in_flight == 0


def test_a_full_cache_queues_requests_and_loses_none(llm, make_generator):
    # Room for one request at a time: the others wait for its blocks, none fails.
    generator = make_generator(rows=4, num_blocks=3, block_size=16)
    for i in range(5):
        generator.submit(f"r{i}", llm._encode_prompt(f"prompt {i}"), 30)
    found = results(generator, 5)
    assert all(f.finish_reason == "length" and f.error is None for f in found.values())
    steps = sorted((f.admitted_step, f.finished_step) for f in found.values())
    assert all(later[0] > earlier[1] for earlier, later in zip(steps, steps[1:], strict=False))
    for i in range(5):
        assert found[f"r{i}"].tokens == greedy(llm, f"prompt {i}", 30)


def test_a_dead_loop_is_restarted_and_its_requests_finish(llm, make_generator):
    generator = make_generator(rows=4)
    crashed: list[int] = []

    def crash_once(batch):
        if generator.steps == 8 and not crashed:
            crashed.append(generator.steps)
            # What the stock manager raises when its cache is full.
            raise ValueError("No more free blocks")

    generator._step_hook = crash_once
    for i in range(3):
        generator.submit(f"r{i}", llm._encode_prompt(f"prompt {i}"), 25)
    found = results(generator, 3)
    assert generator.restarts == 1
    for i in range(3):
        finished = found[f"r{i}"]
        assert finished.error is None and finished.restarts == 1
        assert finished.tokens == greedy(llm, f"prompt {i}", 25)


def test_a_request_that_kills_the_loop_twice_fails_alone(llm, make_generator):
    generator = make_generator(rows=4)

    def poisoned(batch):
        if any(state.request_id == "poison" for state in batch):
            raise RuntimeError("bad input")

    generator._step_hook = poisoned
    generator.submit("poison", llm._encode_prompt("poison"), 10)
    found = results(generator, 1)
    assert found["poison"].finish_reason == "error" and "bad input" in found["poison"].error
    generator._step_hook = None
    generator.submit("healthy", llm._encode_prompt("healthy"), 10)
    assert results(generator, 1)["healthy"].tokens == greedy(llm, "healthy", 10)


def test_a_cancelled_request_gets_a_final_result(llm, make_generator):
    generator = make_generator(rows=2)
    cancelled: list[int] = []

    def cancel_mid_way(batch):
        if generator.steps == 5 and not cancelled:
            cancelled.append(generator.steps)
            generator.cancel("doomed")

    generator._step_hook = cancel_mid_way
    generator.submit("doomed", llm._encode_prompt("doomed"), 100)
    finished = results(generator, 1)["doomed"]
    assert finished.finish_reason == "cancelled"
    assert 0 < len(finished.tokens) < 100


def test_an_idle_loop_blocks_instead_of_spinning(llm, make_generator):
    generator = make_generator()
    generator.submit("one", llm._encode_prompt("one"), 3)
    results(generator, 1)
    steps = generator.steps
    thread = generator._manager._generation_thread
    # Blocked in the input queue's get (a Condition wait), not looping over empty steps.
    for _ in range(20):
        frame = sys._current_frames()[thread.ident]
        names = set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if "get" in names and "wait" in names:
            break
        threading.Event().wait(0.05)
    assert "get" in names and "wait" in names, names
    assert generator.steps == steps


def test_the_decode_loop_makes_no_transformers_spans(llm):
    # transformers wraps these in OpenTelemetry spans (one per layer per step for the cache's
    # update); renq's traces must not fill with them, nor its steps pay for them.
    manager = llm.continuous._manager
    for method in (
        manager.batch_processor.cache.update,
        manager.batch_processor.prepare_next_batch,
        manager.scheduler._prepare_request_for_processing,
    ):
        assert method.__func__.__code__.co_name != "wrapper", method
