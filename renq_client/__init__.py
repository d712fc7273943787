"""A Python client for renq's REST API: requests only, no Django needed to import it.

    from renq_client import RenqClient
    renq = RenqClient("http://127.0.0.1:8000", api_key=os.environ["RENQ_API_KEY"])
    job = renq.wait(renq.submit("embedding", {"texts": ["hello"]}, priority="realtime")["id"])
    ids = renq.bulk("embedding", [{"texts": [t]} for t in texts], priority="batch")
    for job in renq.results(ids):        # finished jobs, as they finish
        ...

429 (rate limit, quota) and 503 (queue full, a dependency down) are waited out as the answer's
retry-after-ms (or Retry-After) says, up to `max_wait_s` in all per call; `bulk` also halves
its request size after a 429, since a list of jobs is admitted or refused whole.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "expired", "cancelled"})
# The longest a read may wait on the server for its job to end (GET /api/v1/jobs/<id>?wait=).
MAX_READ_WAIT_S = 60.0
RETRYABLE_STATUSES = frozenset({429, 503})
# The API accepts up to 1,000 jobs per POST; smaller requests keep each transaction short.
DEFAULT_CHUNK = 100
# The most jobs one read names (GET /api/v1/jobs:batchGet).
BATCH_GET_IDS = 100
# How long `results` lets the server hold a read for the next job to finish, and how often it
# reads every pending job: a job that finishes out of order is found at most this late.
RESULTS_WAIT_S = 5.0
RESULTS_SWEEP_S = 5.0
# With 100 or fewer jobs pending, `results` reads as they finish, at most this often.
RESULTS_TAIL_GAP_S = 0.05


class RenqError(Exception):
    """An error answer from renq: `status`, `code` and `message` from its error body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: Any = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.body = status, code, message, body
        self.retry_after_s = retry_after_s


@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0  # 429/503 answers waited out
    waited_s: float = 0.0
    rejected: list[dict] = field(default_factory=list)  # per-item errors of list submissions


def _retry_after_s(response: requests.Response, default_s: float) -> float:
    """retry-after-ms where the answer has it (renq's and OpenAI's say it to the
    millisecond), else Retry-After's seconds."""
    for header, per_second in (("retry-after-ms", 1000.0), ("Retry-After", 1.0)):
        try:
            return max(0.0, float(response.headers[header]) / per_second)
        except (KeyError, ValueError):
            continue
    return default_s


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm  # only when a bar is wanted

    return tqdm(total=total, desc=desc, unit="job", file=sys.stderr, dynamic_ncols=True)


class RenqClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 30.0,
        max_wait_s: float = 600.0,
        session: requests.Session | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s
        self.session = session or requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {api_key}"})
        self.stats = ClientStats()

    # --- transport ------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, wait_on=RETRYABLE_STATUSES, **kwargs
    ) -> requests.Response:
        """One call, waiting out the `wait_on` statuses as Retry-After says (at most max_wait_s
        in all)."""
        waited = 0.0
        while True:
            self.stats.requests += 1
            response = self.session.request(
                method, f"{self.base_url}/api/v1/{path}", timeout=self.timeout_s, **kwargs
            )
            if response.status_code not in wait_on:
                break
            pause = _retry_after_s(response, default_s=1.0)
            if waited + pause > self.max_wait_s:
                break
            self.stats.retries += 1
            self.stats.waited_s += pause
            waited += pause
            time.sleep(pause)
        if response.status_code >= 400:
            raise self._error(response)
        return response

    @staticmethod
    def _error(response: requests.Response) -> RenqError:
        try:
            body = response.json()
            error = body.get("error", {}) if isinstance(body, dict) else {}
        except ValueError:
            body, error = response.text, {}
        return RenqError(
            response.status_code,
            error.get("code", "error"),
            error.get("message", response.reason),
            body,
            retry_after_s=_retry_after_s(response, default_s=1.0),
        )

    # --- one job ---------------------------------------------------------------------------------

    def submit(
        self,
        service: str,
        input: dict,
        *,
        priority: str | None = None,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict:
        """Submit one job; returns the 202 answer (id, status, …)."""
        body: dict[str, Any] = {"service": service, "input": input}
        if priority:
            body["priority"] = priority
        if deadline_ms is not None:
            body["deadline_ms"] = deadline_ms
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._request("POST", "jobs", json=body, headers=headers).json()

    def get(self, job_id: str) -> dict:
        return self._request("GET", f"jobs/{job_id}").json()

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued job; returns the job (RenqError 409 once a worker started it)."""
        return self._request("POST", f"jobs/{job_id}/cancel").json()

    def wait(self, job_id: str, *, timeout_s: float = 300.0, poll_s: float = 0.1) -> dict:
        """The job once final (succeeded, failed, expired, cancelled). Each read waits on the
        server for the job to end (`?wait=`, at most half the client's timeout), so the job is
        answered as it ends rather than found by polling; `poll_s` paces reads that come back
        early and unfinished (a server that does not wait)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left_s = deadline - time.monotonic()
            asked_s = max(0.05, min(left_s, self.timeout_s / 2, MAX_READ_WAIT_S))
            asked_at = time.monotonic()
            job = self._request("GET", f"jobs/{job_id}", params={"wait": f"{asked_s:.3f}"}).json()
            if job["status"] in TERMINAL_STATUSES:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s} s")
            if time.monotonic() - asked_at < asked_s:
                time.sleep(poll_s)

    def services(self) -> list[dict]:
        data = self._request("GET", "services").json()
        return data["results"] if isinstance(data, dict) else data

    # --- many jobs -------------------------------------------------------------------------------

    def submit_many(self, jobs: list[dict], *, wait_on=RETRYABLE_STATUSES) -> list[dict | None]:
        """One POST of up to 1,000 jobs ({service, input, priority}), admitted or refused whole;
        returns each item's 202 answer, or None where the item was rejected (see stats)."""
        answer = self._request("POST", "jobs", json=jobs, wait_on=wait_on).json()
        results = []
        for item in answer["jobs"]:
            if item and "error" in item:
                self.stats.rejected.append(item["error"])
                results.append(None)
            else:
                results.append(item)
        return results

    def bulk(
        self,
        service: str,
        inputs: Iterable[dict],
        *,
        priority: str | None = None,
        chunk: int = DEFAULT_CHUNK,
        progress: bool = False,
    ) -> list[str]:
        """Submit one job per input, `chunk` per request; returns the accepted job ids in input
        order. A 429 halves the request size (a list is admitted whole, so a chunk larger than
        the rate limit would never pass) and waits out Retry-After, up to max_wait_s."""
        items = [
            {"service": service, "input": input, **({"priority": priority} if priority else {})}
            for input in inputs
        ]
        bar = _progress(len(items), f"submit {service}", progress)
        ids: list[str] = []
        start = 0
        waited_s = 0.0
        try:
            while start < len(items):
                batch = items[start : start + chunk]
                try:
                    # 503 (queue full) is waited out; a 429 comes back here first.
                    answers = self.submit_many(batch, wait_on={503})
                except RenqError as exc:
                    if exc.status != 429 or waited_s > self.max_wait_s:
                        raise
                    # A list is admitted whole: a chunk above the rate limit never passes.
                    chunk = max(1, chunk // 2)
                    pause = exc.retry_after_s or 1.0
                    self.stats.retries += 1
                    self.stats.waited_s += pause
                    waited_s += pause
                    time.sleep(pause)
                    continue
                ids += [a["id"] for a in answers if a]
                start += len(batch)
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        return ids

    def get_many(self, job_ids: list[str], *, wait_s: float | None = None) -> list[dict]:
        """Up to 100 jobs in one read, each with its result, in the order named. `wait_s`: the
        server answers once one of them that was not final is (a long poll), or after that
        long. RenqError 404 for an id you have no job of."""
        params: dict[str, Any] = {"id": list(job_ids)}
        if wait_s is not None:
            params["wait"] = f"{wait_s:.3f}"
        return self._request("GET", "jobs:batchGet", params=params).json()["jobs"]

    def results(
        self,
        job_ids: Iterable[str],
        *,
        timeout_s: float = 3600.0,
        poll_s: float = 0.5,
        progress: bool = False,
    ) -> Iterator[dict]:
        """Yield each job once it is final, in the order they finish.

        Rounds `poll_s` apart read the pending jobs in the order given, 100 per request, and
        stop at the first hundred with none final: jobs mostly finish in the order submitted,
        so the rest would read as pending too. The first round, and one every
        `RESULTS_SWEEP_S`, reads them all: a job that finishes out of order is found at most
        that long and one waiting read (`RESULTS_WAIT_S`) late. After a round that found none
        final, and whenever 100 or fewer are pending, a round's first read waits on the server
        for one of its jobs to finish instead of sleeping: the last jobs are yielded as they
        finish (rounds at least `RESULTS_TAIL_GAP_S` apart)."""
        pending = list(dict.fromkeys(job_ids))
        bar = _progress(len(pending), "done", progress)
        deadline = time.monotonic() + timeout_s
        swept = float("-inf")
        idle = False  # the last round found no job final
        few = len(pending) <= BATCH_GET_IDS
        try:
            while pending:
                still: list[str] = []
                began = time.monotonic()
                sweep = began - swept >= RESULTS_SWEEP_S
                if sweep:
                    swept = began
                asked_s = 0.0
                for start in range(0, len(pending), BATCH_GET_IDS):
                    wait_s = None
                    if (idle or few) and start == 0 and not sweep:
                        left_s = min(deadline - time.monotonic(), self.timeout_s / 2)
                        wait_s = asked_s = max(0.05, min(left_s, RESULTS_WAIT_S))
                    chunk = pending[start : start + BATCH_GET_IDS]
                    final = 0
                    for job in self.get_many(chunk, wait_s=wait_s):
                        if job["status"] in TERMINAL_STATUSES:
                            final += 1
                            if bar is not None:
                                bar.update(1)
                            yield job
                        else:
                            still.append(job["id"])
                    if not final and not sweep:
                        still += pending[start + BATCH_GET_IDS :]
                        break
                idle = len(still) == len(pending)
                pending = still
                if not pending:
                    break
                if idle and time.monotonic() > deadline:
                    raise TimeoutError(f"{len(pending)} jobs not final after {timeout_s} s")
                took_s = time.monotonic() - began
                few = len(pending) <= BATCH_GET_IDS
                if (idle and asked_s and took_s < asked_s) or not (idle or few):
                    # Many jobs are finishing (or the server did not wait): a round per poll_s.
                    time.sleep(max(0.0, poll_s - took_s))
                elif few and not idle:
                    time.sleep(max(0.0, RESULTS_TAIL_GAP_S - took_s))
        finally:
            if bar is not None:
                bar.close()
