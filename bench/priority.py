"""Priority under saturation (issue 8's proof), with the real MiniLM model on the bench's model
threads and the shipped CPU profile's service settings:

1. capacity: a few P3 jobs (16 texts of ~160 words each) through the worker → jobs/minute;
2. saturation: a P3 backlog of ≥ 10 × that per-minute capacity, then, for `phase_s`, a steady
   stream of P0 (one short text every 0.5 s), P1 and P2 jobs (same shape as P3, each offered
   at 1.5 × its 5:3:2 share of the capacity, so every tier queue stays non-empty);
   measured: P0 queue wait vs the preemption budget + 20 ms, where every P0 job ran, the
   backlog left at the end, completions per tier queue vs 5:3:2, the longest time a P3 job
   waited in its own tier (aging), batch run times vs the budget, throughput;
3. the same for `nobudget_s` with preemption_budget_s = 10^6 (and inference_timeout raised
   so that long batches are not cut): the throughput the bound costs;
4. fairness: two tenants in one tier, one offering 50 × the other's jobs, without and with
   a max_running_jobs quota on the flooding one: the quiet tenant's wait.

The service has a local-only route (the router is consulted, nothing can spill to a cloud).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime

import requests
from django.db import connection

from bench.common import (
    EMBEDDING_OVERRIDES,
    WORDS,
    bench_tenant,
    embedding_service,
    long_text,
    pct,
    purge_queues,
    refusal_pause_s,
    wait_finished,
)

SERVICE = "bench-priority"
SHARE = {"api": 5, "batch": 3, "offline": 2}
P0_INTERVAL_S = 0.5
# P1-P3 jobs: long texts (~160 words). One per job by default: a job is the unit of dispatch
# (never split), so a job whose forward pass alone exceeds the preemption budget bounds P0's wait
# by its own length, whatever the scheduler does; 16 such texts take seconds on one CPU thread
# (measured and reported as `big_job`). RENQ_BENCH_TEXTS_PER_JOB=16 runs the shape.
TEXTS_PER_JOB = int(os.environ.get("RENQ_BENCH_TEXTS_PER_JOB", "1"))
BIG_JOB_TEXTS = 16


def priority_service():
    """The shipped embedding settings (bench.common.embedding_service) with a local-only route:
    the router is consulted for every job, and nothing can spill to a cloud backend."""
    from routing.models import Backend, Route, RouteEntry

    service = embedding_service(SERVICE)
    route, _ = Route.objects.update_or_create(service=service, defaults={"enabled": True})
    local = Backend.objects.get(name="local-embedding")
    RouteEntry.objects.filter(route=route).exclude(backend=local).delete()
    RouteEntry.objects.update_or_create(route=route, backend=local, defaults={"order": 0})
    return service


def configure(**fields) -> None:
    from inference.models import Service

    service = Service.objects.get(name=SERVICE)
    for name, value in fields.items():
        setattr(service, name, value)
    service.save()  # save(): bumps the config change marker the workers watch


class Poster:
    """POSTs from many threads, one requests.Session each."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.local = threading.local()

    def session(self) -> requests.Session:
        if not hasattr(self.local, "s"):
            self.local.s = requests.Session()
            self.local.s.headers["Authorization"] = f"Bearer {self.key}"
        return self.local.s

    def post(self, body, path: str = "/api/v1/jobs") -> requests.Response:
        return self.session().post(f"{self.url}{path}", json=body, timeout=120)


def long_job(rng: random.Random, priority: str, texts_per_job: int = TEXTS_PER_JOB) -> dict:
    texts = [long_text(rng) for _ in range(texts_per_job)]
    return {"service": SERVICE, "priority": priority, "input": {"texts": texts}}


def short_job(rng: random.Random, priority: str, tag: str) -> dict:
    text = f"{tag} " + " ".join(rng.choices(WORDS, k=8))
    return {"service": SERVICE, "priority": priority, "input": {"texts": [text]}}


def submit_list(poster: Poster, jobs: list[dict]) -> list[str]:
    r = poster.post(jobs)
    r.raise_for_status()
    return [j["id"] for j in r.json()["jobs"] if j and "id" in j]


def measure_capacity(poster: Poster, n: int, texts_per_job: int = TEXTS_PER_JOB) -> dict:
    """n P3 jobs at once: the worker runs them back to back; jobs/s from first start to last
    finish (per-batch overheads included, as under saturation)."""
    from inference.models import Job

    rng = random.Random(1 + texts_per_job)
    ids = submit_list(poster, [long_job(rng, "offline", texts_per_job) for _ in range(n)])
    jobs = Job.objects.filter(pk__in=ids)
    wait_finished(jobs, len(ids), timeout_s=300)
    rows = list(
        jobs.values_list("started_at", "finished_at", "inference_ms", "status", "batch_size")
    )
    first = min(r[0] for r in rows)
    last = max(r[1] for r in rows)
    per_s = len(rows) / (last - first).total_seconds()
    return {
        "jobs": len(rows),
        "texts_per_job": texts_per_job,
        "succeeded": sum(r[3] == "succeeded" for r in rows),
        "jobs_s": per_s,
        "jobs_per_minute": per_s * 60,
        "batch_run_ms_p50": pct([r[2] for r in rows if r[2]], 50),
        "jobs_per_batch_p50": pct([r[4] or 0 for r in rows], 50),
    }


class Stream(threading.Thread):
    """Open loop: one job every 1/rate s until stopped; records (id, status, sent at)."""

    def __init__(self, poster: Poster, rate: float, make, name: str):
        super().__init__(daemon=True, name=name)
        self.poster, self.rate, self.make = poster, rate, make
        self.sent: list[tuple[str | None, int, float]] = []
        self.stop_at = float("inf")

    def run(self) -> None:
        t0 = time.time()
        i = 0
        while True:
            due = t0 + i / self.rate
            if due >= self.stop_at:
                return
            time.sleep(max(0.0, due - time.time()))
            try:
                r = self.poster.post(self.make(i))
                job_id = r.json().get("id") if r.status_code in (200, 202) else None
                self.sent.append((job_id, r.status_code, time.time()))
            except requests.RequestException:
                self.sent.append((None, 0, time.time()))
            i += 1


def queue_sampler(service_id: int, samples: list):
    """Per tier queue a job waits in (its own, or the one aging moved it to): depth and the
    oldest job's age, one GROUP BY a second."""

    def sample() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COALESCE(NULLIF(serving_tier, ''), tier), count(*), "
                "EXTRACT(EPOCH FROM now() - min(created_at)) FROM inference_job "
                "WHERE service_id = %s AND status = 'queued' AND parent_id IS NULL GROUP BY 1",
                [service_id],
            )
            rows = cursor.fetchall()
        samples.append((time.time(), {t: (int(n), float(age)) for t, n, age in rows}))

    return sample


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt else None


def job_rows(service, since: float) -> list[dict]:
    from inference.models import Job

    fields = (
        "id",
        "tier",
        "serving_tier",
        "status",
        "created_at",
        "started_at",
        "finished_at",
        "inference_ms",
        "batch_size",
        "worker",
        "input_tokens",
        "error",
        "route__backend__name",
        "tenant__name",
        "claim_token",
    )
    rows = []
    for values in Job.objects.filter(service=service, parent__isnull=True).values_list(*fields):
        row = dict(zip(fields, values, strict=True))
        for key in ("created_at", "started_at", "finished_at"):
            row[key] = _ts(row[key])
        if row["created_at"] >= since - 1:
            rows.append(row)
    return rows


def batches(rows: list[dict], start: float, end: float) -> list[dict]:
    """Forward passes that started in [start, end): one per (worker, started_at)."""
    seen: dict[tuple, dict] = {}
    for r in rows:
        if r["started_at"] is None or r["inference_ms"] is None:
            continue
        if not start <= r["started_at"] < end:
            continue
        key = (r["worker"], r["started_at"])
        b = seen.setdefault(key, {"ms": r["inference_ms"], "tiers": Counter(), "jobs": 0})
        b["tiers"][r["tier"]] += 1
        b["jobs"] += 1
    return list(seen.values())


def analyse(
    rows, samples, *, start, end, budget_s, aging_s, sweep_s, share_until=None, answered_at=None
) -> dict:
    """`answered_at`: when each P0 job's POST was answered (job id → epoch s); its message was
    in RabbitMQ by then (the web publishes after commit, before it answers)."""
    """Figures for one saturation phase [start, end)."""
    p0 = [r for r in rows if r["tier"] == "realtime" and start <= r["created_at"] < end]
    p0_waits = [
        1000 * (r["started_at"] - r["created_at"]) for r in p0 if r["started_at"] is not None
    ]
    # The same wait from the moment the POST was answered: the part spent queued behind the
    # running pass, without the web's own time under load (which created_at includes).
    answered_at = answered_at or {}
    p0_queued = [
        1000 * max(0.0, r["started_at"] - answered_at[str(r["id"])])
        for r in p0
        if r["started_at"] is not None and str(r["id"]) in answered_at
    ]
    p0_local = [
        r
        for r in p0
        if r["status"] == "succeeded"
        and r["worker"]
        and r["route__backend__name"]
        in (
            "local-embedding",
            None,
        )
    ]
    ran = [r for r in rows if r["status"] == "succeeded" and start <= (r["started_at"] or 0) < end]
    long_ran = [r for r in ran if r["tier"] != "realtime"]
    in_phase = [s for s in samples if start <= s[0] < end]
    # The share is what the worker chose while every tier below realtime had work to choose
    # from: passes that started in a 1 s sample with all three tier queues non-empty (aging
    # empties the offline queue late in the phase by moving its jobs to the batch queue).
    # Also before aging moved any job (`share_until`): a promoted job may be claimed through
    # the copy left in its old queue, which the worker counts for the old tier while its row
    # says the new one.
    contended = [
        t
        for t, tiers in in_phase
        if all(tiers.get(q, (0, 0))[0] > 0 for q in SHARE)
        and (share_until is None or t + 1.0 <= share_until)
    ]
    contended_ran = [
        r for r in long_ran if any(t <= r["started_at"] < t + 1.0 for t in contended)
    ]
    served = Counter(r["serving_tier"] or r["tier"] for r in contended_ran)
    own = Counter(r["tier"] for r in long_ran)
    share_total = sum(served[t] for t in SHARE)
    want_total = sum(SHARE.values())
    share = {
        t: {
            "completed": served[t],
            "share": served[t] / share_total if share_total else 0.0,
            "target": SHARE[t] / want_total,
            "ratio_to_target": (served[t] / share_total) / (SHARE[t] / want_total)
            if share_total
            else 0.0,
        }
        for t in SHARE
    }
    nonempty = {
        t: sum(1 for _, tiers in in_phase if tiers.get(t, (0, 0))[0] > 0) / max(1, len(in_phase))
        for t in ("realtime", *SHARE)
    }
    # Aging: the longest any P3 job had waited in the offline queue (unpromoted, unstarted).
    p3_own_queue_max = max((tiers.get("offline", (0, 0.0))[1] for _, tiers in in_phase), default=0)
    non_rt = batches([r for r in rows if r["tier"] != "realtime"], start, end)
    batch_ms = [b["ms"] for b in non_rt]
    expired = Counter(
        r["tier"] for r in rows if r["status"] == "expired" and start <= r["created_at"] < end
    )
    # Jobs claimed together (one claim token): a dispatch message may carry several jobs.
    claims = Counter(r["claim_token"] for r in long_ran if r["claim_token"])
    claim_tier = {r["claim_token"]: r["serving_tier"] or r["tier"] for r in long_ran}
    per_claim = defaultdict(list)
    for token, n in claims.items():
        per_claim[claim_tier[token]].append(n)
    p3_waits = [
        r["started_at"] - r["created_at"]
        for r in long_ran
        if r["tier"] == "offline" and r["started_at"] is not None
    ]
    seconds = end - start
    return {
        "seconds": round(seconds, 1),
        "p0": {
            "sent": len(p0),
            "succeeded_locally": len(p0_local),
            "statuses": dict(Counter(r["status"] for r in p0)),
            "backends": dict(Counter(str(r["route__backend__name"]) for r in p0)),
            "queue_wait_ms_p50": pct(p0_waits, 50),
            "queue_wait_ms_p99": pct(p0_waits, 99),
            "queue_wait_ms_max": max(p0_waits, default=float("nan")),
            "after_answer_ms_p50": pct(p0_queued, 50),
            "after_answer_ms_p99": pct(p0_queued, 99),
            "after_answer_ms_max": max(p0_queued, default=float("nan")),
            "target_ms": 1000 * budget_s + 20,
        },
        "non_realtime_batches": {
            "count": len(batch_ms),
            "run_ms_p50": pct(batch_ms, 50),
            "run_ms_p99": pct(batch_ms, 99),
            "run_ms_max": max(batch_ms, default=float("nan")),
            "jobs_per_batch_p50": pct([b["jobs"] for b in non_rt], 50),
            "budget_ms": 1000 * budget_s,
        },
        "completions_by_served_queue": share,
        "share_measured_s": len(contended),
        "completions_by_own_tier": dict(own),
        "jobs_per_claim_max_by_tier": {t: max(v) for t, v in sorted(per_claim.items())},
        "queue_nonempty_fraction": nonempty,
        "expired_by_tier": dict(expired),
        "p3_longest_wait_in_own_queue_s": round(p3_own_queue_max, 2),
        "p3_started_wait_s_p50": round(pct(p3_waits, 50), 2),
        "p3_started_wait_s_max": round(max(p3_waits, default=float("nan")), 2),
        "p3_promoted": sum(1 for r in rows if r["tier"] == "offline" and r["serving_tier"]),
        "p3_aging_bound_s": aging_s,
        "p3_aging_bound_with_interval_s": aging_s + sweep_s,
        "throughput_long_jobs_s": len(long_ran) / seconds,
        "throughput_texts_s": (TEXTS_PER_JOB * len(long_ran) + len(ran) - len(long_ran)) / seconds,
        "throughput_tokens_s": sum(r["input_tokens"] or 0 for r in ran) / seconds,
    }


def saturate(poster, service, *, phase_s: float, capacity_jobs_s: float, samples, rng_seed: int):
    """Start the P0/P1/P2 streams; run `phase_s`; stop them. Returns (start, end, streams)."""
    streams = {
        "realtime": Stream(
            poster,
            1 / P0_INTERVAL_S,
            lambda i: short_job(random.Random(rng_seed * 10**6 + i), "realtime", f"p0-{i}"),
            "p0",
        ),
        "api": Stream(
            poster,
            1.5 * capacity_jobs_s * SHARE["api"] / 10,
            lambda i: long_job(random.Random(rng_seed * 10**6 + 10**5 + i), "api"),
            "p1",
        ),
        "batch": Stream(
            poster,
            1.5 * capacity_jobs_s * SHARE["batch"] / 10,
            lambda i: long_job(random.Random(rng_seed * 10**6 + 2 * 10**5 + i), "batch"),
            "p2",
        ),
    }
    start = time.time()
    for s in streams.values():
        s.stop_at = start + phase_s
        s.start()
    for s in streams.values():
        s.join()
    return start, time.time(), streams


def fairness(url: str, service, *, quick: bool) -> dict:
    """Tenant A offers 50 × tenant B's jobs, same tier (batch), short texts; B's wait without and
    with A capped by max_running_jobs."""
    from inference.models import Job, Tenant

    results = {}
    for label, quota in (("no_quota", 0), ("quota", 128)):
        tenant_a, key_a = bench_tenant("bench-flood", max_running_jobs=quota)
        tenant_b, key_b = bench_tenant("bench-quiet")
        results[label] = _fairness_case(
            Poster(url, key_a), Poster(url, key_b), service, tenant_a, quick=quick
        )
        results[label]["a_max_running_jobs"] = quota
        print(label, results[label], flush=True)
        # The flood's leftovers are not the next case's problem.
        Job.objects.filter(tenant=tenant_a, service=service, status="queued").cancel()
        both = Job.objects.filter(service=service, tenant__in=[tenant_a, tenant_b])
        wait_finished(both, both.count(), timeout_s=120)
        Tenant.objects.filter(pk=tenant_a.pk).update(max_running_jobs=0)
    return results


def _fairness_case(flood: Poster, quiet: Poster, service, tenant_a, *, quick: bool) -> dict:
    from inference.models import Job

    duration = 3.0 if quick else 5.0
    a_rate, b_rate = 300.0, 6.0  # jobs/s offered: 50 ×
    a_threads, per_post = 3, 25
    counts: Counter = Counter()
    lock = threading.Lock()
    b_ids: list[str] = []
    t0 = time.time()
    stop_at = t0 + duration

    def flooder(k: int) -> None:
        rng = random.Random(k)
        interval = a_threads * per_post / a_rate
        i = 0
        while True:
            due = t0 + (i + k / a_threads) * interval
            if due >= stop_at:
                return
            time.sleep(max(0.0, due - time.time()))
            r = flood.post([short_job(rng, "batch", f"a{k}-{i}-{j}") for j in range(per_post)])
            with lock:
                counts["a_offered"] += per_post
                if r.status_code == 202:
                    counts["a_accepted"] += r.json()["accepted"]
                else:
                    counts[f"a_refused_{r.status_code}"] += per_post
            if r.status_code == 429:  # a polite client waits as told
                time.sleep(refusal_pause_s(r.headers))
            i += 1

    def quiet_client() -> None:
        rng = random.Random(99)
        i = 0
        while True:
            due = t0 + i / b_rate
            if due >= stop_at:
                return
            time.sleep(max(0.0, due - time.time()))
            r = quiet.post(short_job(rng, "batch", f"b-{i}"))
            with lock:
                counts["b_offered"] += 1
                if r.status_code == 202:
                    b_ids.append(r.json()["id"])
            i += 1

    threads = [threading.Thread(target=flooder, args=(k,)) for k in range(a_threads)]
    threads.append(threading.Thread(target=quiet_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b_jobs = Job.objects.filter(pk__in=b_ids)
    wait_finished(b_jobs, len(b_ids), timeout_s=180)
    b_waits = [
        1000 * (s - c).total_seconds()
        for c, s in b_jobs.values_list("created_at", "started_at")
        if s is not None
    ]
    a_jobs = Job.objects.filter(tenant=tenant_a, service=service, created_at__gte=_dt(t0))
    a_waits = [
        1000 * (s - c).total_seconds()
        for c, s in a_jobs.values_list("created_at", "started_at")
        if s is not None
    ]
    return {
        "seconds": duration,
        "offered_a_jobs_s": a_rate,
        "offered_b_jobs_s": b_rate,
        **dict(counts),
        "b_succeeded": b_jobs.filter(status="succeeded").count(),
        "b_wait_ms_p50": pct(b_waits, 50),
        "b_wait_ms_p99": pct(b_waits, 99),
        "b_wait_ms_max": max(b_waits, default=float("nan")),
        "a_wait_ms_p50_of_started": pct(a_waits, 50),
        "a_left_queued": a_jobs.filter(status="queued").count(),
    }


def _dt(ts: float):
    from datetime import UTC

    return datetime.fromtimestamp(ts, UTC)


def run(url: str, key: str, *, quick: bool, procs=None) -> dict:
    from django.conf import settings

    from bench.common import Ticker
    from inference.config.tiers import tier_policies
    from inference.dispatch.queues import service_queues
    from inference.models import Job

    service = priority_service()
    budget_s = service.preemption_budget_s
    shipped_timeout = service.inference_timeout
    poster = Poster(url, key)
    policies = tier_policies()
    sweep_s = float(settings.RENQ_AGING_INTERVAL_S)  # promotion runs this often
    phase_s = 25.0 if quick else 65.0
    nobudget_s = 12.0 if quick else 20.0
    out: dict = {
        "service": {
            k: getattr(service, k)
            for k in (
                "batch_size",
                "batch_timeout",
                "max_total_tokens",
                "queue_timeout",
                "inference_timeout",
                "total_timeout",
                "preemption_budget_s",
            )
        },
        "overrides": EMBEDDING_OVERRIDES,
        "tiers": {
            t: {"aging_after_s": p.aging_after_s, "weight": p.weight} for t, p in policies.items()
        },
        "aging_interval_s": sweep_s,
        "texts_per_long_job": TEXTS_PER_JOB,
    }

    print(f"== priority: one job of {BIG_JOB_TEXTS} texts of ~160 words, alone", flush=True)
    out["big_job"] = measure_capacity(poster, 2, BIG_JOB_TEXTS)
    print(out["big_job"], flush=True)
    print(f"== priority: capacity (P3 jobs of {TEXTS_PER_JOB} text(s) of ~160 words)", flush=True)
    out["capacity"] = measure_capacity(poster, 20 if quick else 40)
    print(out["capacity"], flush=True)
    cap = out["capacity"]["jobs_s"]
    backlog = int(max(60, (3 if quick else 10.5) * out["capacity"]["jobs_per_minute"]))

    samples: list = []
    sampler = Ticker(1.0, queue_sampler(service.pk, samples))
    sampler.start()
    t_backlog = time.time()
    print(f"== priority: P3 backlog of {backlog} jobs", flush=True)
    rng = random.Random(3)
    lock = threading.Lock()
    sent = {"n": 0}

    def backlog_client() -> None:
        while True:
            with lock:
                n = min(max(1, 100 // TEXTS_PER_JOB), backlog - sent["n"])
                sent["n"] += n
            if n <= 0:
                return
            with lock:
                body = [long_job(rng, "offline") for _ in range(n)]
            submit_list(poster, body)

    threads = [threading.Thread(target=backlog_client) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backlog_s = time.time() - t_backlog
    out["backlog"] = {
        "jobs": backlog,
        "x_capacity_per_minute": backlog / out["capacity"]["jobs_per_minute"],
        "submit_s": round(backlog_s, 1),
    }
    print(out["backlog"], flush=True)

    print(
        f"== priority: saturated, P0/P1/P2 streams for {phase_s:.0f} s (budget {budget_s} s)",
        flush=True,
    )
    start, end, streams = saturate(
        poster, service, phase_s=phase_s, capacity_jobs_s=cap, samples=samples, rng_seed=1
    )
    queued_p3 = Job.objects.filter(service=service, tier="offline", status="queued").count()
    out["backlog"]["p3_queued_when_streams_ended"] = queued_p3
    out["streams"] = {
        t: {
            "rate_jobs_s": s.rate,
            "sent": len(s.sent),
            "refused": sum(1 for _, code, _ in s.sent if code not in (200, 202)),
        }
        for t, s in streams.items()
    }

    print(f"== priority: no budget (preemption_budget_s = 1e6) for {nobudget_s:.0f} s", flush=True)
    configure(preemption_budget_s=1e6, inference_timeout=120)
    start_b, end_b, streams_b = saturate(
        poster, service, phase_s=nobudget_s, capacity_jobs_s=cap, samples=samples, rng_seed=2
    )
    queued_p3_b = Job.objects.filter(service=service, tier="offline", status="queued").count()
    configure(preemption_budget_s=budget_s, inference_timeout=shipped_timeout)
    # Let the phase's P0 jobs finish (or expire) before reading them.
    time.sleep(3 if quick else 6)
    sampler.stop()
    rows = job_rows(service, t_backlog)
    aging_s = policies["offline"].aging_after_s
    # Saturation is measured from when the backlog was in and the streams' queues had filled.
    warm = 5.0
    out["with_budget"] = analyse(
        rows,
        samples,
        start=start + warm,
        end=end,
        budget_s=budget_s,
        aging_s=aging_s,
        sweep_s=sweep_s,
        # The first backlog jobs come due for promotion aging_s after they were submitted.
        share_until=t_backlog + aging_s,
        answered_at={jid: t for jid, _, t in streams["realtime"].sent if jid},
    )
    out["without_budget"] = analyse(
        rows,
        samples,
        start=start_b + warm,
        end=end_b,
        budget_s=budget_s,
        aging_s=aging_s,
        sweep_s=sweep_s,
    )
    out["without_budget"]["backlog_p3_queued_at_end"] = queued_p3_b
    out["price_of_the_bound"] = {
        "texts_s_with_budget": out["with_budget"]["throughput_texts_s"],
        "texts_s_without_budget": out["without_budget"]["throughput_texts_s"],
        "ratio": out["with_budget"]["throughput_texts_s"]
        / max(1e-9, out["without_budget"]["throughput_texts_s"]),
    }
    out["timeline"] = timeline(
        rows, samples, t0=t_backlog, phases={"budget": (start, end), "no_budget": (start_b, end_b)}
    )
    print({k: out[k] for k in ("with_budget", "without_budget", "price_of_the_bound")}, flush=True)

    print("== priority: drop the backlog; fairness between two tenants of one tier", flush=True)
    Job.objects.filter(service=service, status="queued").cancel()
    purge_queues(service_queues(SERVICE))
    wait_finished(
        Job.objects.filter(service=service),
        Job.objects.filter(service=service).count(),
        timeout_s=60,
    )
    out["fairness"] = fairness(url, service, quick=quick)
    return out


def timeline(rows, samples, *, t0: float, phases: dict) -> dict:
    """What the plot needs: every started job's (start, wait, tier); the queue samples."""
    started = [
        (round(r["started_at"] - t0, 3), round(r["started_at"] - r["created_at"], 3), r["tier"])
        for r in rows
        if r["started_at"] is not None and r["tenant__name"] == "bench"
    ]
    queues = [
        (round(t - t0, 2), {tier: [n, round(age, 2)] for tier, (n, age) in tiers.items()})
        for t, tiers in samples
    ]
    return {
        "started": started,
        "queues": queues,
        "phases": {k: [round(a - t0, 2), round(b - t0, 2)] for k, (a, b) in phases.items()},
    }


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result["timeline"]
    colors = {
        "realtime": "tab:red",
        "api": "tab:orange",
        "batch": "tab:green",
        "offline": "tab:blue",
    }
    labels = {
        "realtime": "P0 realtime",
        "api": "P1 api",
        "batch": "P2 batch",
        "offline": "P3 offline",
    }
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    by_tier = defaultdict(list)
    for t, wait, tier in tl["started"]:
        by_tier[tier].append((t, max(wait, 1e-3)))
    for tier in ("offline", "batch", "api", "realtime"):
        pts = by_tier.get(tier, [])
        if pts:
            top.scatter(
                [p[0] for p in pts],
                [p[1] for p in pts],
                s=6,
                color=colors[tier],
                label=labels[tier],
            )
    budget = result["service"]["preemption_budget_s"]
    top.axhline(budget + 0.02, color="tab:red", ls=":", lw=1, label="P0 target (budget + 20 ms)")
    top.set_yscale("log")
    top.set_ylabel("queue wait of each job (s)\nby the time it started")
    top.legend(loc="upper left", fontsize=8, ncol=3)
    for tier in ("offline", "batch", "api", "realtime"):
        pts = [(t, q[tier][1]) for t, q in tl["queues"] if tier in q]
        if pts:
            bottom.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                color=colors[tier],
                label=f"{labels[tier]} queue",
            )
    bottom.axhline(
        result["tiers"]["offline"]["aging_after_s"],
        color="tab:blue",
        ls=":",
        lw=1,
        label="P3 aging threshold",
    )
    bottom.set_ylabel("oldest job waiting in\neach tier queue (s)")
    bottom.set_xlabel("seconds since the backlog was submitted")
    bottom.legend(loc="upper left", fontsize=8, ncol=2)
    for ax in (top, bottom):
        for name, (a, b) in tl["phases"].items():
            ax.axvspan(a, b, color="grey" if name == "budget" else "wheat", alpha=0.15)
    top.set_title(
        "priority under saturation: grey = with the preemption budget, tan = without", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
