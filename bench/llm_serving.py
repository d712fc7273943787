"""`--only llm`: LLM serving with continuous batching (issue 31's proof), over /v1/completions.

One web server and one GPU worker on the LLM service (device auto: the GPU where there is
one), its rate_limit lifted; in one run:

1. throughput: C concurrent clients (16, then 64) each send /v1/completions of 32 tokens
   (greedy), ROUNDS_PER_CLIENT each; completion tokens/s against the raw model's own static
   generate() over the same prompts in batches of the service's batch_size, in this process on
   the same device and threads (target ≥ 1.2 ×); and, for 16 clients, against renq's previous
   engine (a worker with continuous batching off: generate() passes);
2. time to first token of realtime streamed requests, at idle and beside a saturating offline
   load (2 × batch_size clients sending offline completions of 64 tokens without pause);
   inter-token latency p50/p99 of the streamed requests, as the client sees the pieces;
3. rows in flight over time, plotted to llm_rows_in_flight.png: the rows of each decode step
   of the engine's loop (its step log, in this process, the 64 clients' load replayed closed
   loop into the same engine the worker runs), and, from the job rows of the runs above, the
   jobs claimed and not yet stored (rows, the small lookahead and outcomes on their way to
   Postgres).

    .venv/bin/python bench/run_all.py --only llm [--quick]
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from bench.common import JsonPoster, bench_tenant, pct, purge_queues

SERVICE = "bench-llm"
TINY_LLM_REF = "fixtures/models/tiny-llm"
# A real model for a GPU run, where one is installed (a package: ref or a folder).
MODEL_ENV = "RENQ_BENCH_LLM_REF"
BATCH_SIZE = 4
COMPLETION_TOKENS = 32
OFFLINE_TOKENS = 64
CONCURRENCY = (16, 64)
ROUNDS_PER_CLIENT = 4
PRIORITY_HEADER = "X-Renq-Priority"
RUNTIME = dict(
    kind="llm",
    batch_size=BATCH_SIZE,
    batch_timeout=0.01,
    max_queue_size=1_000_000,
    queue_timeout=600.0,
    inference_timeout=600.0,
    total_timeout=600.0,
    rate_limit=0,
    preemption_budget_s=1.0,
    enable_cache=False,
    max_total_tokens=16384,
    max_items_per_job=256,
)


def model_ref() -> str:
    return os.environ.get(MODEL_ENV, TINY_LLM_REF)


def llm_service():
    from inference.models import Service

    service, _ = Service.objects.update_or_create(
        name=SERVICE, defaults={**RUNTIME, "model_ref": model_ref()}
    )
    return service


def prompts(count: int, tag: str) -> list[str]:
    """Different prompts of a few lengths, as a mix of users would send."""
    subjects = ("a story", "the weather", "a recipe", "the news", "a poem", "a letter")
    return [
        f"{tag} {i}: please write {subjects[i % len(subjects)]} " + "and more " * (i % 5)
        for i in range(count)
    ]


# --- the raw model ------------------------------------------------------------------------------


def raw_static_generate(texts: list[str], batch_size: int, max_tokens: int) -> dict:
    """The model's own generate(), greedy, in static batches of `batch_size` (left padding),
    as a user of transformers would serve these prompts."""
    import torch

    from inference.engines.llm import LlmEngine, trim_completion

    engine = LlmEngine(model_ref(), continuous=False)
    engine._generate([engine._encode_prompt("warm up")], 4, 0.0)
    tokens = 0
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = [engine._encode_prompt(t) for t in texts[start : start + batch_size]]
            for row in engine._generate(batch, max_tokens, 0.0):
                eos = engine.eos_token_ids
                tokens += trim_completion(row, limit=max_tokens, eos_token_ids=eos)[1]
    elapsed = time.perf_counter() - started
    return {
        "device": engine.device,
        "completion_tokens": tokens,
        "seconds": round(elapsed, 3),
        "tokens_s": round(tokens / elapsed, 1),
    }


# --- clients ------------------------------------------------------------------------------------


def completion_body(prompt: str, max_tokens: int, *, stream: bool = False) -> dict:
    body = {"model": SERVICE, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body["stream"] = True
    return body


class Poster(JsonPoster):
    def __init__(self, url: str, key: str, priority: str):
        super().__init__(url, key)
        self.headers = {**self.headers, PRIORITY_HEADER: priority}


def concurrent_completions(url: str, key: str, clients: int, rounds: int, tag: str) -> dict:
    """`clients` threads, each sending `rounds` completions one after another."""
    poster = Poster(url, key, "api")
    texts = prompts(clients * rounds, tag)
    tokens: list[int] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for r in range(rounds):
            status, _, raw = poster.post(
                "/v1/completions", completion_body(texts[i * rounds + r], COMPLETION_TOKENS)
            )
            with lock:
                if status == 200:
                    tokens.append(json.loads(raw)["usage"]["completion_tokens"])
                else:
                    failures.append(f"{status} {raw[:200]!r}")

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": clients * rounds,
        "failed": len(failures),
        "first_failure": failures[0] if failures else None,
        "completion_tokens": sum(tokens),
        "seconds": round(elapsed, 3),
        "tokens_s": round(sum(tokens) / elapsed, 1),
        "texts": texts,
    }


def streamed_completion(url: str, key: str, prompt: str, priority: str) -> dict:
    """One streamed completion: time to the first piece of text, and the gaps between
    pieces, as the client sees them."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = json.dumps(completion_body(prompt, COMPLETION_TOKENS, stream=True))
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        PRIORITY_HEADER: priority,
    }
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", body=body, headers=headers)
    response = connection.getresponse()
    arrivals: list[float] = []
    while True:
        line = response.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        choices = event.get("choices") or []
        if choices and choices[0].get("text"):
            arrivals.append(time.perf_counter())
    connection.close()
    if not arrivals:
        return {"status": response.status, "ttft_ms": None, "gaps_ms": []}
    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {
        "status": response.status,
        "ttft_ms": (arrivals[0] - started) * 1000,
        "gaps_ms": gaps,
    }


def realtime_streams(url: str, key: str, count: int, tag: str) -> dict:
    results = [streamed_completion(url, key, text, "realtime") for text in prompts(count, tag)]
    ttft = [r["ttft_ms"] for r in results if r["ttft_ms"] is not None]
    gaps = [g for r in results for g in r["gaps_ms"]]
    return {
        "requests": count,
        "with_text": len(ttft),
        "ttft_p50_ms": round(pct(ttft, 50), 2),
        "ttft_p99_ms": round(pct(ttft, 99), 2),
        "inter_token_p50_ms": round(pct(gaps, 50), 2),
        "inter_token_p99_ms": round(pct(gaps, 99), 2),
    }


class OfflineLoad:
    """Clients sending offline completions back to back until stopped."""

    def __init__(self, url: str, key: str, clients: int):
        self.poster = Poster(url, key, "offline")
        self.stop_event = threading.Event()
        self.sent = 0
        self.threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]

    def _client(self, i: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            body = completion_body(f"offline {i} {n}: write a long story", OFFLINE_TOKENS)
            self.poster.post("/v1/completions", body)
            self.sent += 1
            n += 1

    def __enter__(self) -> OfflineLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=120)


def engine_rows(texts: list[str], clients: int) -> list[tuple[float, int]]:
    """The engine's rows per decode step while `clients` closed-loop clients send `texts`
    (each sends its next prompt when its last one finished), in this process."""
    from inference.engines.llm import LlmEngine

    engine = LlmEngine(model_ref())
    generator = engine.continuous
    if generator is None:
        return []
    generator.set_rows(BATCH_SIZE)
    pending = list(reversed(texts))

    def send() -> None:
        text = pending.pop()
        job = {"prompt": text, "max_tokens": COMPLETION_TOKENS, "temperature": 0}
        engine.start_generation(f"replay-{len(pending)}", job)

    for _ in range(min(clients, len(pending))):
        send()
    start = time.monotonic()
    for _ in texts:
        generator.results.get(timeout=600)
        if pending:
            send()
    generator.close()
    return [(round(t - start, 4), rows) for t, rows, _ in generator.step_log if t >= start]


# --- rows in flight -----------------------------------------------------------------------------


def rows_in_flight(since: float, until: float, step_s: float = 0.01) -> list[tuple[float, int]]:
    """(seconds since `since`, jobs claimed and not yet stored) every step_s, from the rows."""
    from datetime import UTC, datetime

    from inference.models import Job

    spans = [
        (start.timestamp(), end.timestamp())
        for start, end in Job.objects.filter(
            service__name=SERVICE,
            started_at__isnull=False,
            finished_at__isnull=False,
            finished_at__gte=datetime.fromtimestamp(since, UTC),
            started_at__lte=datetime.fromtimestamp(until, UTC),
        ).values_list("started_at", "finished_at")
    ]
    points = []
    t = since
    while t <= until:
        points.append((round(t - since, 3), sum(1 for a, b in spans if a <= t < b)))
        t += step_s
    return points


def plot_rows(phases: dict[str, list[tuple[float, int]]], batch_size: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(phases), 1, figsize=(8, 2.4 * len(phases)), squeeze=False)
    for ax, (name, points) in zip(axes[:, 0], phases.items(), strict=True):
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", lw=0.8)
        ax.axhline(batch_size, color="black", ls=":", lw=1, label=f"rows = batch_size {batch_size}")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("in flight")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


# --- the scenario -------------------------------------------------------------------------------


def run(*, quick: bool, out_dir: Path) -> dict:
    from processes import ProcessGroup, free_port

    from bench.common import MODEL_THREADS, keep_web_log
    from inference.dispatch.queues import service_queues
    from inference.engines.llm import CONTINUOUS_BATCHING_ENV

    llm_service()
    _, key = bench_tenant("llm-bench")
    rounds = 2 if quick else ROUNDS_PER_CLIENT
    streams = 10 if quick else 30
    out: dict = {
        "model": model_ref(),
        "service": {k: RUNTIME[k] for k in ("batch_size", "batch_timeout", "rate_limit")},
        "completion_tokens": COMPLETION_TOKENS,
        "rounds_per_client": rounds,
    }
    purge_queues(service_queues(SERVICE))
    rows: dict[str, list[tuple[float, int]]] = {}
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        procs.worker("bench-llm", service_queues(SERVICE), threads=MODEL_THREADS)
        Poster(url, key, "api").post("/v1/completions", completion_body("warm up", 4))

        print("== llm: realtime streamed TTFT at idle", flush=True)
        out["realtime_idle"] = realtime_streams(url, key, streams, "idle")
        print(out["realtime_idle"], flush=True)

        for clients in CONCURRENCY:
            print(f"== llm: {clients} concurrent completions of {COMPLETION_TOKENS}", flush=True)
            t0 = time.time()
            renq = concurrent_completions(url, key, clients, rounds, f"c{clients}")
            rows[f"{clients} concurrent completions: jobs claimed, not yet stored"] = (
                rows_in_flight(t0, time.time())
            )
            texts = renq.pop("texts")
            raw = raw_static_generate(texts, BATCH_SIZE, COMPLETION_TOKENS)
            if clients == CONCURRENCY[-1]:
                rows_per_step = engine_rows(texts, clients)
            out[f"concurrent_{clients}"] = {
                "renq": renq,
                "raw_static_generate": raw,
                "vs_raw": round(renq["tokens_s"] / raw["tokens_s"], 3),
            }
            print(out[f"concurrent_{clients}"], flush=True)

        print("== llm: realtime streamed TTFT beside a saturating offline load", flush=True)
        with OfflineLoad(url, key, 2 * BATCH_SIZE) as load:
            time.sleep(2.0)  # every row busy with offline work
            t0 = time.time()
            out["realtime_beside_offline"] = realtime_streams(url, key, streams, "busy")
            rows["realtime streams beside offline load: jobs claimed, not yet stored"] = (
                rows_in_flight(t0, time.time())
            )
        out["realtime_beside_offline"]["offline_requests_sent"] = load.sent
        print(out["realtime_beside_offline"], flush=True)
        procs.stop_one("bench-llm")

        print("== llm: renq's previous engine (generate() passes), 16 clients", flush=True)
        purge_queues(service_queues(SERVICE))
        procs.env[CONTINUOUS_BATCHING_ENV] = "0"
        try:
            procs.worker("bench-llm-generate", service_queues(SERVICE), threads=MODEL_THREADS)
        finally:
            procs.env.pop(CONTINUOUS_BATCHING_ENV)
        Poster(url, key, "api").post("/v1/completions", completion_body("warm up", 4))
        previous = concurrent_completions(url, key, CONCURRENCY[0], rounds, "c16")
        previous.pop("texts")
        out["previous_engine_16"] = previous
        out["continuous_vs_previous_16"] = round(
            out[f"concurrent_{CONCURRENCY[0]}"]["renq"]["tokens_s"] / previous["tokens_s"], 3
        )
        print(previous, flush=True)
    out["web_log"] = keep_web_log("llm")
    idle = out["realtime_idle"]["ttft_p50_ms"]
    step = out["realtime_idle"]["inter_token_p50_ms"]
    out["ttft_busy_target_ms"] = round(2 * idle + step, 2)
    out["ttft_busy_met"] = out["realtime_beside_offline"]["ttft_p50_ms"] <= 2 * idle + step
    steps = {
        f"{CONCURRENCY[-1]} closed-loop clients: the engine's rows per decode step": rows_per_step
    }
    out["engine_steps_64"] = len(rows_per_step)
    out["engine_mean_rows_64"] = (
        round(sum(r for _, r in rows_per_step) / len(rows_per_step), 2) if rows_per_step else None
    )
    plot_rows({**steps, **rows}, BATCH_SIZE, out_dir / "llm_rows_in_flight.png")
    return out


def report_lines(r: dict) -> list[str]:
    """The README's section for this scenario."""
    lines = [
        "## LLM serving: continuous batching (`--only llm`)",
        "",
        f"Model `{r['model']}`, service batch_size {r['service']['batch_size']}, "
        f"{r['completion_tokens']}-token greedy completions over /v1/completions.",
        "",
        "| figure | this run | target |",
        "| --- | --- | --- |",
    ]
    for clients in CONCURRENCY:
        c = r.get(f"concurrent_{clients}")
        if c:
            lines.append(
                f"| {clients} concurrent: completion tokens/s, renq vs raw static generate() "
                f"(batches of {r['service']['batch_size']}) | {c['renq']['tokens_s']:,.0f} vs "
                f"{c['raw_static_generate']['tokens_s']:,.0f} = {c['vs_raw']:.2f} × | ≥ 1.2 × |"
            )
    if "continuous_vs_previous_16" in r:
        lines.append(
            f"| 16 concurrent: continuous vs renq's previous engine (generate() passes) | "
            f"{r['continuous_vs_previous_16']:.2f} × | — |"
        )
    if r.get("engine_mean_rows_64") is not None:
        lines.append(
            f"| engine rows per decode step, {CONCURRENCY[-1]} closed-loop clients replayed "
            f"in-process | mean {r['engine_mean_rows_64']:.2f} of {r['service']['batch_size']} "
            f"over {r['engine_steps_64']} steps | — |"
        )
    idle, busy = r["realtime_idle"], r["realtime_beside_offline"]
    lines += [
        f"| realtime streamed TTFT p50 / p99, idle | {idle['ttft_p50_ms']:.1f} / "
        f"{idle['ttft_p99_ms']:.1f} ms | — |",
        f"| realtime streamed TTFT p50 / p99, beside a saturating offline load | "
        f"{busy['ttft_p50_ms']:.1f} / {busy['ttft_p99_ms']:.1f} ms | ≤ 2 × idle + one step "
        f"({r['ttft_busy_target_ms']:.1f} ms): {'met' if r['ttft_busy_met'] else 'missed'} |",
        f"| inter-token latency p50 / p99, idle | {idle['inter_token_p50_ms']:.1f} / "
        f"{idle['inter_token_p99_ms']:.1f} ms | — |",
        f"| inter-token latency p50 / p99, beside offline load | "
        f"{busy['inter_token_p50_ms']:.1f} / {busy['inter_token_p99_ms']:.1f} ms | — |",
        "",
        "![rows in flight](llm_rows_in_flight.png)",
        "",
    ]
    return lines
