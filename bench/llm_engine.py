"""The LLM engine alone, no services (no Postgres, RabbitMQ, Redis, web or worker): the
continuous-batching loop against the model's static generate() in batches, on device auto.
For a machine that has a GPU but not the stack (bench/llm_serving.py measures the service).

1. greedy tokens of the continuous loop vs generate() alone, per prompt (share identical);
2. completion tokens/s: C closed-loop clients (each sends its next prompt when its last one
   finished) into the loop with `rows` rows per step, vs generate() over the same prompts in
   static batches of `rows` (left padding);
3. a realtime prompt arriving while every row is busy: decode steps until its first token.

    .venv/bin/python bench/llm_engine.py [--model fixtures/models/tiny-llm | --random-llama]
        [--rows 4,16] [--clients 16,64] [--tokens 32] [--out results.json]

`--random-llama` builds a seeded random Llama of a realistic width (about 0.2 B parameters,
grouped-query attention) with the tiny LLM fixture's tokenizer: the speed of a real model of
that size, without downloading one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from inference.engines.llm import LlmEngine, trim_completion  # noqa: E402

TINY_LLM = ROOT / "fixtures" / "models" / "tiny-llm"


def random_llama(folder: Path) -> str:
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TINY_LLM, local_files_only=True)
    special = {"bos_token_id": 101, "eos_token_id": 102, "pad_token_id": 0}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        **special,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.model_max_length = 2048
    tokenizer.save_pretrained(folder)
    return str(folder)


def prompts(count: int) -> list[str]:
    subjects = ("a story", "the weather", "a recipe", "the news", "a poem", "a letter")
    return [
        f"request {i}: please write {subjects[i % len(subjects)]} " + "and more " * (i % 7)
        for i in range(count)
    ]


def static_generate(engine: LlmEngine, texts: list[str], rows: int, tokens: int) -> dict:
    done = 0
    sync()
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(texts), rows):
            batch = [engine._encode_prompt(t) for t in texts[start : start + rows]]
            for row in engine._generate(batch, tokens, 0.0):
                done += trim_completion(row, limit=tokens, eos_token_ids=engine.eos_token_ids)[1]
    sync()
    elapsed = time.perf_counter() - started
    return {"tokens": done, "seconds": round(elapsed, 3), "tokens_s": round(done / elapsed, 1)}


def continuous(engine: LlmEngine, texts: list[str], clients: int, tokens: int) -> dict:
    generator = engine.continuous
    pending = list(reversed(texts))
    done = 0
    steps_before = generator.steps

    def send() -> None:
        job = {"prompt": pending.pop(), "max_tokens": tokens, "temperature": 0}
        engine.start_generation(f"bench-{time.monotonic_ns()}-{len(pending)}", job)

    started = time.perf_counter()
    for _ in range(min(clients, len(pending))):
        send()
    for _ in texts:
        finished = generator.results.get(timeout=600)
        done += engine.generation_result(finished)["usage"]["completion_tokens"]
        if pending:
            send()
    elapsed = time.perf_counter() - started
    steps = generator.steps - steps_before
    return {
        "tokens": done,
        "seconds": round(elapsed, 3),
        "tokens_s": round(done / elapsed, 1),
        "steps": steps,
        "ms_per_step": round(elapsed / steps * 1000, 3),
    }


def greedy_identical(engine: LlmEngine, texts: list[str], tokens: int) -> float:
    expected = [engine.run_batch([{"prompt": t, "max_tokens": tokens}])[0] for t in texts]
    for i, text in enumerate(texts):
        engine.start_generation(f"same-{i}", {"prompt": text, "max_tokens": tokens})
    got = {}
    for _ in texts:
        finished = engine.continuous.results.get(timeout=600)
        got[finished.request_id] = engine.generation_result(finished)
    same = sum(got[f"same-{i}"] == expected[i] for i in range(len(texts)))
    return round(same / len(texts), 3)


def realtime_steps(engine: LlmEngine, rows: int, tokens: int) -> dict:
    """Decode steps from a realtime prompt's arrival (between two steps, every row busy with
    low-tier generations) to its first token."""
    generator = engine.continuous
    arrived: list[int] = []
    arrival_step = generator.steps + 10

    def arrive(batch) -> None:
        if generator.steps == arrival_step and not arrived:
            arrived.append(generator.steps)
            ids = engine._encode_prompt("urgent")
            generator.submit("realtime", ids, 4, priority=(0,), preempts=True)

    generator._step_hook = arrive
    try:
        for i in range(rows):
            ids = engine._encode_prompt(f"low {i}")
            generator.submit(f"low-{i}", ids, tokens * 4, priority=(3,))
        found = {}
        for _ in range(rows + 1):
            finished = generator.results.get(timeout=600)
            found[finished.request_id] = finished
    finally:
        generator._step_hook = None
    realtime = found["realtime"]
    return {
        "rows_busy": rows,
        "steps_to_first_token": realtime.first_token_step - arrived[0],
        "finished_before_every_low_row": realtime.finished_step
        < min(f.finished_step for name, f in found.items() if name != "realtime"),
    }


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(TINY_LLM))
    parser.add_argument("--random-llama", action="store_true")
    parser.add_argument("--rows", default="4,16")
    parser.add_argument("--clients", default="16,64")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = random_llama(Path(folder)) if args.random_llama else args.model
        engine = LlmEngine(model)
    out: dict = {
        "model": "random Llama, 0.2 B" if args.random_llama else args.model,
        "device": engine.device,
        "dtype": str(engine.dtype),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "continuous": engine.supports_continuous,
        "tokens": args.tokens,
    }
    print(json.dumps(out), flush=True)
    if not engine.supports_continuous:
        return 1
    generator = engine.continuous
    static_generate(engine, prompts(8), 4, 8)  # warm up both paths
    continuous(engine, prompts(8), 8, 8)
    out["greedy_identical_share"] = greedy_identical(engine, prompts(8), args.tokens)
    for rows in (int(r) for r in args.rows.split(",")):
        generator.set_rows(rows)
        out[f"realtime_rows_{rows}"] = realtime_steps(engine, rows, args.tokens)
        for clients in (int(c) for c in args.clients.split(",")):
            texts = prompts(clients * 4)
            cont = continuous(engine, texts, clients, args.tokens)
            static = static_generate(engine, texts, rows, args.tokens)
            out[f"rows_{rows}_clients_{clients}"] = {
                "continuous": cont,
                "static_generate": static,
                "vs_static": round(cont["tokens_s"] / static["tokens_s"], 3),
            }
            print(
                json.dumps(
                    {f"rows_{rows}_clients_{clients}": out[f"rows_{rows}_clients_{clients}"]}
                ),
                flush=True,
            )
    threading.Thread(target=generator.close, daemon=True).start()
    print(json.dumps(out, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
