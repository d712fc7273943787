"""Fairness between tenants (issue 27's proof), with the no-op model kind: each text sleeps a
fixed SLEEP_MS_PER_TEXT in the worker, so a job's run time is exactly its work and the
figures do not move with the machine's load (the real model on 2 shared cores would make
"one batch" and the capacity drift between phases). The texts are sized so the fair share's
charge (the embedding estimate, 4 characters a token) equals the slept milliseconds.

One web server, one worker, the service's rate_limit 0 (only the scheduler decides who
waits), in one run:

1. alone: two quiet `pro` tenants each send a trickle of single-text batch jobs;
2. flood alone: a `pro` tenant floods the batch tier (8 client threads, 8 texts per job,
   ≥ 50 × a quiet tenant's job rate): the throughput of a single-tenant run;
3. flood + quiet: the same flood beside the same trickle: the quiet tenants' wait vs alone,
   throughput vs (2);
4. contended: an `enterprise`, a `pro` and a `free` tenant all flood the batch tier (each
   asking for the tier its plan serves as batch), with 1-, 8- and 4-text jobs: served work
   per plan weight while all three are backlogged, Jain's index;
5. position/ETA: a shorter flood beside the trickle, every accepted job read back at once
   (GET /api/v1/jobs/<id>, as a polling client sees it) and its predicted start compared
   with when the worker really started it, once the backlog has drained;
6. free realtime flood: a `free` tenant sends realtime jobs from 8 clients while a `pro`
   tenant sends 15 `api` jobs: how many pro jobs succeed within queue_timeout;
7. a 100,000-text bulk: one tenant POSTs it to a service with config.yaml's queue size (500)
   that no worker serves (everything accepted stays queued: the hardest case for
   admission) while two other tenants submit realtime and batch jobs: their answers.

Between phases the leftovers are cancelled, the queues purged and the fair-share tags of the
service's queues deleted (in a service that drained its backlog, the virtual time would have
caught up with every finish tag).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime

from bench.common import JsonPoster, bench_tenant, pct, purge_queues, wait_finished

SERVICE = "bench-tenants"
SLEEP_MS_PER_TEXT = 5
# 20 characters: 5 tokens by the embedding estimate the fair share charges, = the sleep.
TEXT_CHARS = 4 * SLEEP_MS_PER_TEXT
BATCH_SIZE = 8
RUNTIME = dict(
    kind="noop",
    model_ref="none",
    batch_size=BATCH_SIZE,
    batch_timeout=0.005,
    max_total_tokens=16384,
    max_queue_size=1_000_000,
    queue_timeout=2.0,  # config.yaml's embedding service: a realtime/api job's wait
    inference_timeout=60,
    total_timeout=3600,
    rate_limit=0,
    enable_cache=False,
    max_items_per_job=16,
    preemption_budget_s=None,
)
QUIET_RATE = 1.0  # jobs/s per quiet tenant
FLOOD_RATE = 60.0  # jobs/s offered by the flooding tenant, from FLOOD_THREADS
FLOOD_THREADS = 8
FLOOD_TEXTS = 8
PRO_API_JOBS = 15
# The bulk phase: its own service (config.yaml's embedding max_queue_size, no worker), the
# bulk's size (the most one bulk POST may carry) and what the two others send meanwhile.
BULK_SERVICE = "bench-tenants-bulk"
BULK_QUEUE_SIZE = 500
BULK_TEXTS = 100_000
BULK_OTHERS_JOBS = 100  # each, half realtime, over the bulk's POST
# The position/ETA phase: a flood this long at ETA_FLOOD_RATE builds a backlog of a few
# seconds that drains within the phase's wait.
ETA_SEND_S = 6.0
ETA_FLOOD_RATE = 40.0
WEIGHTS_KEY = "weight"


def tenants_service(name: str = SERVICE, **extra):
    from inference.models import Service

    service, _ = Service.objects.update_or_create(name=name, defaults={**RUNTIME, **extra})
    return service


def _text(tag: str) -> str:
    return (tag + " " + "x" * TEXT_CHARS)[:TEXT_CHARS].ljust(TEXT_CHARS, "x")


def job_body(tag: str, texts: int, priority: str) -> dict:
    return {
        "service": SERVICE,
        "priority": priority,
        "input": {
            "texts": [_text(f"{tag}-{k}") for k in range(texts)],
            "sleep_ms": SLEEP_MS_PER_TEXT * texts,
        },
    }


def requested_for(plan: str, served: str) -> str:
    """The tier a tenant of `plan` asks for to be served in `served` (its plan's tier boost);
    `served` itself where no tier maps there."""
    from inference.config.plans import effective_tier
    from inference.jobs.tiers import TIER_ORDER

    for tier in TIER_ORDER:
        if effective_tier(tier, plan) == served:
            return str(getattr(tier, "value", tier))
    return served


class Sender(threading.Thread):
    """Open loop: POSTs `make(i)` (a job, or a list of jobs) every `interval_s` until
    `stop_at`; counts answers by status. Paced, so a flood's offered rate is what was asked
    for and does not depend on how fast the web answers. With `read_back`, each accepted
    single job is read back at once (GET) and its predicted start kept in `predicted`."""

    def __init__(
        self,
        poster: JsonPoster,
        interval_s: float,
        make,
        *,
        offset_s: float = 0.0,
        read_back: bool = False,
    ):
        super().__init__(daemon=True)
        self.poster, self.interval_s, self.make, self.offset_s = poster, interval_s, make, offset_s
        self.read_back = read_back
        self.predicted: dict[str, float] = {}
        self.t0 = time.time()
        self.stop_at = float("inf")
        self.statuses: Counter = Counter()
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        import json

        i = 0
        while True:
            due = self.t0 + self.offset_s + i * self.interval_s
            # The clock too: a closed-loop sender (interval 0) is never due past the end.
            if due >= self.stop_at or time.time() >= self.stop_at:
                return
            time.sleep(max(0.0, due - time.time()))
            try:
                status, _, answer = self.poster.post("/api/v1/jobs", self.make(i))
            except OSError:
                status, answer = 0, b""
            with self.lock:
                self.statuses[status] += 1
                if status == 202:
                    body = json.loads(answer)
                    if "jobs" in body:
                        self.ids += [j["id"] for j in body["jobs"] if j and "id" in j]
                    elif "id" in body:
                        self.ids.append(body["id"])
            if status == 202 and self.read_back and "id" in body:
                self._read_back(body["id"])
            i += 1

    def _read_back(self, job_id: str) -> None:
        import json

        try:
            status, _, answer = self.poster.get(f"/api/v1/jobs/{job_id}")
        except OSError:
            return
        wait = json.loads(answer).get("wait") if status == 200 else None
        if wait and wait.get("predicted_start"):  # None: already taken by the worker
            self.predicted[job_id] = datetime.fromisoformat(wait["predicted_start"]).timestamp()


def run_senders(senders: list[Sender], seconds: float) -> tuple[float, float]:
    t0 = time.time()
    for s in senders:
        s.t0, s.stop_at = t0, t0 + seconds
        s.start()
    for s in senders:
        s.join()
    return t0, time.time()


def flood_senders(
    poster: JsonPoster,
    tag: str,
    *,
    rate: float,
    texts: int,
    priority: str,
    threads: int = FLOOD_THREADS,
    per_post: int = 1,
    read_back: bool = False,
) -> list[Sender]:
    interval = threads * per_post / rate

    def make(k: int):
        def body(i: int):
            jobs = [job_body(f"{tag}{k}.{i}.{j}", texts, priority) for j in range(per_post)]
            return jobs[0] if per_post == 1 else jobs

        return body

    return [
        Sender(poster, interval, make(k), offset_s=k * interval / threads, read_back=read_back)
        for k in range(threads)
    ]


def quiet_senders(posters: dict[str, JsonPoster], *, read_back: bool = False) -> dict[str, Sender]:
    return {
        name: Sender(
            poster,
            1 / QUIET_RATE,
            lambda i, name=name: job_body(f"{name}.{i}", 1, "batch"),
            offset_s=0.37 * n,
            read_back=read_back,
        )
        for n, (name, poster) in enumerate(posters.items())
    }


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def rows(service, since: float) -> list[dict]:
    from inference.models import Job

    fields = [
        "id",
        "tenant__name",
        "tenant__plan",
        "tier",
        "status",
        "created_at",
        "started_at",
        "finished_at",
        "inference_ms",
        "input",
        "worker",
    ]
    if any(f.name == "requested_tier" for f in Job._meta.get_fields()):
        fields.append("requested_tier")
    out = []
    for values in Job.objects.filter(
        service=service, parent__isnull=True, created_at__gte=_dt(since - 1)
    ).values_list(*fields):
        row = dict(zip(fields, values, strict=True))
        row["texts"] = len(row.pop("input").get("texts", []))
        for key in ("created_at", "started_at", "finished_at"):
            row[key] = row[key].timestamp() if row[key] else None
        out.append(row)
    return out


def sent_by(rs: list[dict], sender: Sender) -> list[dict]:
    """The rows of the jobs this sender's POSTs created (not the warm-up jobs before them)."""
    ids = set(sender.ids)
    return [r for r in rs if str(r["id"]) in ids]


def waits_ms(rs: list[dict]) -> list[float]:
    return [1000 * (r["started_at"] - r["created_at"]) for r in rs if r["started_at"]]


def wait_figures(rs: list[dict], plan: str) -> dict:
    w = waits_ms(rs)
    return {
        "plan": plan,
        "jobs": len(rs),
        "succeeded": sum(r["status"] == "succeeded" for r in rs),
        "wait_p50_ms": pct(w, 50),
        "wait_p99_ms": pct(w, 99),
        "wait_max_ms": max(w, default=float("nan")),
    }


def served_texts_s(rs: list[dict], start: float, end: float) -> float:
    """Texts of the jobs whose forward pass started in [start, end), per second: the work
    the worker did (each text is SLEEP_MS_PER_TEXT of it)."""
    texts = sum(r["texts"] for r in rs if r["started_at"] and start <= r["started_at"] < end)
    return texts / (end - start)


def batch_runs_ms(rs: list[dict], start: float, end: float) -> list[float]:
    """One run time per forward pass (jobs of one pass share worker and started_at)."""
    seen: dict[tuple, float] = {}
    for r in rs:
        if r["started_at"] and r["inference_ms"] is not None and start <= r["started_at"] < end:
            seen[(r["worker"], r["started_at"])] = r["inference_ms"]
    return list(seen.values())


def jain(values: list[float]) -> float:
    """Jain's fairness index: (Σx)² / (n Σx²); 1 when all equal, 1/n when one has all."""
    if not values or not any(values):
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def reset(service, tenants: list) -> None:
    """The phase's leftovers cancelled, the running ones finished, the queues emptied and the
    queues' fair-share tags forgotten."""
    from inference.dispatch.queues import service_queues
    from inference.models import Job
    from renq_site.shared_redis import shared_redis

    Job.objects.filter(service=service, tenant__in=tenants, status="queued").cancel()
    left = Job.objects.filter(service=service, status__in=["queued", "running"])
    deadline = time.time() + 60
    while left.exists() and time.time() < deadline:
        Job.objects.filter(service=service, status="queued").cancel()
        time.sleep(0.25)
    purge_queues(service_queues(SERVICE))
    client = shared_redis()
    keys = list(client.scan_iter(match=f"renq:fair:*{SERVICE}.*", count=1000))
    if keys:
        client.delete(*keys)
    time.sleep(0.5)


def bulk_beside_others(service, bulk_poster: JsonPoster, others: dict[str, JsonPoster]) -> dict:
    """One tenant's BULK_TEXTS-text bulk POST while the others each send BULK_OTHERS_JOBS
    single jobs (half realtime, half batch) to the same service: every answer counted."""
    from inference.dispatch.queues import service_queues
    from inference.models import Job

    purge_queues(service_queues(BULK_SERVICE))
    bulk_answer: dict = {}

    def post_bulk() -> None:
        body = {
            "service": BULK_SERVICE,
            "priority": "batch",
            "input": {"texts": [_text(f"bulk-{i}") for i in range(BULK_TEXTS)]},
        }
        started = time.time()
        status, _, answer = bulk_poster.post("/api/v1/jobs/bulk", body)
        bulk_answer.update(status=status, seconds=round(time.time() - started, 1))
        if status != 202:
            bulk_answer["error"] = answer[:300].decode(errors="replace")

    bulk = threading.Thread(target=post_bulk, daemon=True)
    t0 = time.time()
    bulk.start()
    statuses: dict[str, Counter] = {name: Counter() for name in others}
    # Paced over 10 s, then on until the bulk is in, so some land while its pieces go in.
    i = 0
    while i < BULK_OTHERS_JOBS or bulk.is_alive():
        time.sleep(max(0.0, t0 + i * 10 / BULK_OTHERS_JOBS - time.time()))
        for name, poster in others.items():
            tier = "realtime" if i % 2 else "batch"
            body = {"service": BULK_SERVICE, "priority": tier, "input": {"texts": [f"{name} {i}"]}}
            statuses[name][poster.post("/api/v1/jobs", body)[0]] += 1
        i += 1
        if i >= 10 * BULK_OTHERS_JOBS:
            break
    bulk.join(timeout=300)
    queued = Job.objects.filter(service=service, status="queued").count()
    Job.objects.filter(service=service, status__in=["queued", "running"]).cancel()
    purge_queues(service_queues(BULK_SERVICE))
    sent = sum(sum(c.values()) for c in statuses.values())
    refused = sum(n for c in statuses.values() for code, n in c.items() if code != 202)
    return {
        "bulk": bulk_answer,
        "queued_jobs_at_end": queued,
        "max_queue_size": BULK_QUEUE_SIZE,
        "others": {name: dict(c) for name, c in statuses.items()},
        "others_sent": sent,
        "others_refused": refused,
        "met": bulk_answer.get("status") == 202 and refused == 0,
    }


def eta_errors(rs: list[dict], *, flood: list[Sender], quiet: list[Sender]) -> dict:
    """|real start − predicted start| of the jobs read back while queued: p50 and p90, over
    all of them and per kind of tenant."""
    started = {str(r["id"]): r["started_at"] for r in rs if r["started_at"]}

    def errors(senders: list[Sender]) -> list[float]:
        return [
            1000 * abs(started[job_id] - predicted)
            for s in senders
            for job_id, predicted in s.predicted.items()
            if job_id in started
        ]

    def figures(errs: list[float]) -> dict:
        return {"jobs": len(errs), "error_p50_ms": pct(errs, 50), "error_p90_ms": pct(errs, 90)}

    flood_errs, quiet_errs = errors(flood), errors(quiet)
    waits = [
        1000 * (started[job_id] - r_created)
        for job_id, r_created in ((str(r["id"]), r["created_at"]) for r in rs)
        if job_id in started
    ]
    return {
        "read_back": sum(len(s.predicted) for s in flood + quiet),
        "all": figures(flood_errs + quiet_errs),
        "flooding_tenant": figures(flood_errs),
        "quiet_tenants": figures(quiet_errs),
        "wait_p50_ms": pct(waits, 50),
        "wait_p90_ms": pct(waits, 90),
    }


def backlog_sampler(service, tenant_ids: list[int], samples: list):
    """Queued jobs per tenant, one GROUP BY per call."""
    from django.db import connection

    def sample() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tenant_id, count(*) FROM inference_job WHERE service_id = %s "
                "AND status = 'queued' AND tenant_id = ANY(%s) GROUP BY 1",
                [service.pk, tenant_ids],
            )
            samples.append((time.time(), dict(cursor.fetchall())))

    return sample


def run(*, quick: bool) -> dict:
    from processes import ProcessGroup, free_port

    from bench.common import Ticker, keep_web_log
    from inference.config.plans import plan_weight
    from inference.dispatch.queues import service_queues
    from inference.models import Job

    service = tenants_service()
    bulk_service = tenants_service(BULK_SERVICE, max_queue_size=BULK_QUEUE_SIZE)
    phase_s = 10.0 if quick else 30.0
    quiet = {name: bench_tenant(name, plan="pro") for name in ("quiet-a", "quiet-b")}
    flood_t, flood_key = bench_tenant("flood-pro", plan="pro")
    ent_t, ent_key = bench_tenant("flood-enterprise", plan="enterprise")
    free_t, free_key = bench_tenant("flood-free", plan="free")
    pro_api_t, pro_api_key = bench_tenant("pro-api", plan="pro")
    everyone = [t for t, _ in quiet.values()] + [flood_t, ent_t, free_t, pro_api_t]
    purge_queues(service_queues(SERVICE))
    out: dict = {
        "service": {
            k: RUNTIME[k]
            for k in (
                "batch_size",
                "batch_timeout",
                "queue_timeout",
                "rate_limit",
                "max_total_tokens",
            )
        },
        "model": f"noop, {SLEEP_MS_PER_TEXT} ms per text",
        "phase_s": phase_s,
        "quiet_rate_jobs_s": QUIET_RATE,
        "flood": {
            "threads": FLOOD_THREADS,
            "texts_per_job": FLOOD_TEXTS,
            "offered_jobs_s": FLOOD_RATE,
            "times_a_quiet_tenant_jobs": FLOOD_RATE / QUIET_RATE,
            "times_a_quiet_tenant_texts": FLOOD_RATE * FLOOD_TEXTS / QUIET_RATE,
        },
        "plan_weights": {p: plan_weight(p) for p in ("enterprise", "pro", "free")},
    }
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=2)
        procs.worker("bench-tenants", service_queues(SERVICE))
        quiet_posters = {name: JsonPoster(url, key) for name, (_, key) in quiet.items()}
        for poster in quiet_posters.values():  # warm both web processes and the worker
            for i in range(4):
                poster.post("/api/v1/jobs", job_body(f"warm{i}", 1, "batch"))
        wait_finished(Job.objects.filter(service=service), 8, timeout_s=60)

        print(f"== tenants: two quiet pro tenants alone ({phase_s:.0f} s)", flush=True)
        senders = quiet_senders(quiet_posters)
        t0, t1 = run_senders(list(senders.values()), phase_s)
        wait_finished(
            Job.objects.filter(service=service, created_at__gte=_dt(t0)),
            sum(len(s.ids) for s in senders.values()),
            timeout_s=60,
        )
        rs = rows(service, t0)
        alone = {n: wait_figures(sent_by(rs, senders[n]), "pro") for n in quiet}
        alone_all = wait_figures([r for s in senders.values() for r in sent_by(rs, s)], "pro")
        out["alone"] = {"tenants": alone, "quiet": alone_all}
        print(out["alone"], flush=True)
        reset(service, everyone)

        flood_poster = JsonPoster(url, flood_key)
        print(f"== tenants: the pro flood alone ({phase_s:.0f} s)", flush=True)
        fs = flood_senders(
            flood_poster, "solo", rate=FLOOD_RATE, texts=FLOOD_TEXTS, priority="batch"
        )
        t0, t1 = run_senders(fs, phase_s)
        rs = rows(service, t0)
        solo = {
            "accepted": sum(len(s.ids) for s in fs),
            "statuses": dict(sum((s.statuses for s in fs), Counter())),
            # From 1 s in: the backlog has formed, the worker is never idle for want of work.
            "served_texts_s": served_texts_s(rs, t0 + 1, t1),
            "left_queued": sum(r["status"] == "queued" for r in rs),
        }
        out["flood_alone"] = solo
        print(solo, flush=True)
        reset(service, everyone)

        print(f"== tenants: the pro flood beside the quiet trickle ({phase_s:.0f} s)", flush=True)
        fs = flood_senders(
            flood_poster, "flood", rate=FLOOD_RATE, texts=FLOOD_TEXTS, priority="batch"
        )
        qs = quiet_senders(quiet_posters)
        t0, t1 = run_senders(fs + list(qs.values()), phase_s)
        quiet_ids = [i for s in qs.values() for i in s.ids]
        wait_finished(Job.objects.filter(pk__in=quiet_ids), len(quiet_ids), timeout_s=120)
        rs = rows(service, t0)
        beside = {n: wait_figures(sent_by(rs, qs[n]), "pro") for n in quiet}
        beside["flood-pro"] = wait_figures(
            [r for r in rs if r["tenant__name"] == "flood-pro"], "pro"
        )
        quiet_beside = wait_figures([r for s in qs.values() for r in sent_by(rs, s)], "pro")
        runs = batch_runs_ms(rs, t0, t1)
        one_batch = max(runs, default=float("nan"))
        target = 2 * alone_all["wait_p99_ms"] + one_batch
        served = served_texts_s(rs, t0 + 1, t1)
        flood_jobs = sum(len(s.ids) for s in fs)
        out["flood_beside_quiet"] = {
            "tenants": beside,
            "quiet": quiet_beside,
            "flood_accepted": flood_jobs,
            "flood_offered_jobs_s": flood_jobs / phase_s,
            "quiet_offered_jobs_s": len(quiet_ids) / len(qs) / phase_s,
            "batch_run_ms_p50": pct(runs, 50),
            "batch_run_ms_max": one_batch,
            "quiet_p99_target_ms": target,
            "quiet_p99_met": quiet_beside["wait_p99_ms"] <= target,
            "quiet_p99_vs_alone": quiet_beside["wait_p99_ms"] / alone_all["wait_p99_ms"],
            "served_texts_s": served,
            "throughput_vs_flood_alone": served / solo["served_texts_s"],
            "throughput_met": served >= 0.9 * solo["served_texts_s"],
            # Backlogged through the phase: only the flooding tenant (the quiet ones' demand is
            # far below their share); Jain's index over one tenant is 1 by definition, so the
            # index is measured in the contended phase, where several are.
            "backlogged_tenants": ["flood-pro"],
            "left_queued": sum(r["status"] == "queued" for r in rs),
        }
        print(out["flood_beside_quiet"], flush=True)
        reset(service, everyone)

        print(f"== tenants: position/ETA beside a {ETA_SEND_S:.0f} s flood", flush=True)
        fs = flood_senders(
            flood_poster, "eta", rate=ETA_FLOOD_RATE, texts=FLOOD_TEXTS, priority="batch",
            read_back=True,
        )  # fmt: skip
        qs = quiet_senders(quiet_posters, read_back=True)
        t0, t1 = run_senders(fs + list(qs.values()), ETA_SEND_S)
        sent = [i for s in fs + list(qs.values()) for i in s.ids]
        wait_finished(Job.objects.filter(pk__in=sent), len(sent), timeout_s=120)
        out["position_eta"] = eta_errors(rows(service, t0), flood=fs, quiet=list(qs.values()))
        print(out["position_eta"], flush=True)
        reset(service, everyone)

        print(f"== tenants: enterprise, pro and free all flood batch ({phase_s:.0f} s)", flush=True)
        # Rates: each tenant offers more than its weighted share of the worker (about
        # 1000 / SLEEP_MS_PER_TEXT texts/s), so all three stay backlogged.
        shapes = {
            "flood-enterprise": (ent_t, ent_key, "enterprise", 1, 200.0, 10),
            "flood-pro": (flood_t, flood_key, "pro", FLOOD_TEXTS, FLOOD_RATE, 1),
            "flood-free": (free_t, free_key, "free", 4, 40.0, 5),
        }
        senders_by: dict[str, list[Sender]] = {}
        requested: dict[str, str] = {}
        for name, (_, key, plan, texts, rate, per_post) in shapes.items():
            requested[name] = requested_for(plan, "batch")
            senders_by[name] = flood_senders(
                JsonPoster(url, key),
                name,
                rate=rate,
                texts=texts,
                priority=requested[name],
                threads=4,
                per_post=per_post,
            )
        samples: list = []
        sampler = Ticker(
            0.5, backlog_sampler(service, [t.pk for t, *_ in shapes.values()], samples)
        )
        sampler.start()
        t0, t1 = run_senders([s for ss in senders_by.values() for s in ss], phase_s)
        sampler.stop()
        rs = rows(service, t0)
        ids = {t.pk for t, *_ in shapes.values()}
        # Backlogged: every one of the three had queued jobs in consecutive samples; served work
        # counted over the longest such stretch.
        stretch, best = [], []
        for ts, counts in samples:
            if all(counts.get(i, 0) > 0 for i in ids):
                stretch.append(ts)
                if len(stretch) > len(best):
                    best = list(stretch)
            else:
                stretch = []
        contended: dict = {"requested_tier": requested, "tenants": {}}
        if len(best) >= 2:
            start, end = best[0], best[-1]
            xs = []
            for name, (_tenant, _, plan, texts, rate, _) in shapes.items():
                mine = [r for r in rs if r["tenant__name"] == name]
                texts_s = served_texts_s(mine, start, end)
                per_weight = texts_s / plan_weight(plan)
                xs.append(per_weight)
                contended["tenants"][name] = {
                    **wait_figures(mine, plan),
                    "texts_per_job": texts,
                    "offered_texts_s": rate * texts,
                    "served_texts_s": texts_s,
                    "served_per_weight": per_weight,
                    "served_tiers": dict(Counter(r["tier"] for r in mine)),
                }
            total = sum(v["served_texts_s"] for v in contended["tenants"].values())
            for fig in contended["tenants"].values():
                fig["served_share"] = fig["served_texts_s"] / total if total else float("nan")
            contended["backlogged_s"] = round(end - start, 1)
            contended["jain_index"] = jain(xs)
        else:
            contended["jain_index"] = float("nan")
            contended["note"] = "the three tenants were never backlogged together"
        out["contended"] = contended
        print(contended, flush=True)
        reset(service, everyone)

        print(f"== tenants: free realtime flood beside {PRO_API_JOBS} pro api jobs", flush=True)
        free_senders = [
            Sender(
                JsonPoster(url, free_key),
                0.0,
                lambda i, k=k: job_body(f"free-rt{k}.{i}", FLOOD_TEXTS, "realtime"),
            )
            for k in range(FLOOD_THREADS)
        ]
        api_seconds = max(phase_s, PRO_API_JOBS * 0.5)
        pro = Sender(
            JsonPoster(url, pro_api_key),
            api_seconds / PRO_API_JOBS,
            lambda i: job_body(f"pro-api.{i}", 1, "api"),
            offset_s=1.0,
        )
        t0 = time.time()
        for s in free_senders:
            s.t0, s.stop_at = t0, t0 + api_seconds + 1.0
            s.start()
        pro.t0, pro.stop_at = t0, t0 + 1.0 + api_seconds - 1e-3
        pro.start()
        for s in [*free_senders, pro]:
            s.join()
        wait_finished(Job.objects.filter(pk__in=pro.ids), len(pro.ids), timeout_s=60)
        rs = rows(service, t0)
        pro_rows = [r for r in rs if r["tenant__name"] == "pro-api"]
        free_rows = [r for r in rs if r["tenant__name"] == "flood-free"]
        timeout_ms = 1000 * RUNTIME["queue_timeout"]
        in_time = [
            r
            for r in pro_rows
            if r["status"] == "succeeded"
            and 1000 * (r["started_at"] - r["created_at"]) <= timeout_ms
        ]
        out["free_realtime_flood"] = {
            "free_accepted": sum(len(s.ids) for s in free_senders),
            "free_statuses": dict(Counter(r["status"] for r in free_rows)),
            "free_served_tiers": dict(Counter(r["tier"] for r in free_rows)),
            "pro": wait_figures(pro_rows, "pro"),
            "pro_sent": len(pro.ids),
            "pro_succeeded_within_queue_timeout": len(in_time),
            "pro_statuses": dict(Counter(r["status"] for r in pro_rows)),
            "queue_timeout_s": RUNTIME["queue_timeout"],
            "met": len(pro.ids) == PRO_API_JOBS and len(in_time) == PRO_API_JOBS,
        }
        print(out["free_realtime_flood"], flush=True)
        reset(service, everyone)

        print(f"== tenants: a {BULK_TEXTS:,}-text bulk beside two tenants' jobs", flush=True)
        out["bulk_beside_others"] = bulk_beside_others(
            bulk_service, JsonPoster(url, ent_key), quiet_posters
        )
        print(out["bulk_beside_others"], flush=True)

    out["web_log"] = keep_web_log("tenants")
    # What bench/report.py renders: per tenant plan, jobs and waits, and the index.
    out["tenants"] = {
        **{f"{n} (alone)": f for n, f in alone.items()},
        **{f"{n} (beside flood)": f for n, f in beside.items()},
        **{f"{n} (contended)": f for n, f in contended["tenants"].items()},
        "pro-api (beside free realtime flood)": out["free_realtime_flood"]["pro"],
    }
    # Per plan: the contended phase, where each plan has one backlogged tenant (the report
    # would otherwise pool the quiet and flooding phases' waits into one range).
    out["plans"] = {
        fig["plan"]: {k: fig[k] for k in ("jobs", "wait_p50_ms", "wait_p99_ms")}
        for fig in contended["tenants"].values()
    }
    out["jain_index"] = contended["jain_index"]
    print(summary(out), flush=True)
    return out


def summary(t: dict) -> str:
    b, c, f = t["flood_beside_quiet"], t["contended"], t["free_realtime_flood"]
    return "\n".join(
        [
            "tenants summary:",
            f"  quiet wait p99 alone {t['alone']['quiet']['wait_p99_ms']:.0f} ms, beside a "
            f"{b['flood_offered_jobs_s']:.0f} jobs/s flood {b['quiet']['wait_p99_ms']:.0f} ms "
            f"(target <= {b['quiet_p99_target_ms']:.0f} ms: "
            f"{'met' if b['quiet_p99_met'] else 'MISSED'})",
            f"  throughput beside quiet vs flood alone: {b['throughput_vs_flood_alone']:.3f} x "
            f"({'met' if b['throughput_met'] else 'MISSED'}, target >= 0.9)",
            f"  Jain's index, 3 backlogged tenants per plan weight: {c['jain_index']:.3f} "
            f"(target >= 0.9)",
            "  pro api jobs beside a free realtime flood: "
            f"{f['pro_succeeded_within_queue_timeout']} of {PRO_API_JOBS} "
            f"within {f['queue_timeout_s']} s",
            _eta_line(t.get("position_eta")),
            _bulk_line(t.get("bulk_beside_others")),
        ]
    )


def _bulk_line(bulk: dict | None) -> str:
    if not bulk:
        return "  bulk beside others: not measured"
    return (
        f"  a {BULK_TEXTS:,}-text bulk (answered {bulk['bulk'].get('status')} in "
        f"{bulk['bulk'].get('seconds')} s, {bulk['queued_jobs_at_end']:,} jobs queued against "
        f"max_queue_size {bulk['max_queue_size']}): the others' jobs refused "
        f"{bulk['others_refused']} of {bulk['others_sent']} "
        f"({'met' if bulk['met'] else 'MISSED'}, target 0)"
    )


def _eta_line(eta: dict | None) -> str:
    if not eta:
        return "  position/ETA: not measured"
    a = eta["all"]
    return (
        f"  position/ETA: predicted vs real start of {a['jobs']} queued jobs, error p50 "
        f"{a['error_p50_ms']:.0f} ms, p90 {a['error_p90_ms']:.0f} ms (their wait p50 "
        f"{eta['wait_p50_ms']:.0f} ms, p90 {eta['wait_p90_ms']:.0f} ms)"
    )
