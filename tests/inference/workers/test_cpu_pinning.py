"""RENQ_MODEL_CPUS: forward passes on the model's cores, the rest of the worker off them.
RENQ_MODEL_NICE, when set: a worker whose model leaves a core to the rest runs ahead of it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inference.workers import cpu_pinning
from inference.workers.cpu_pinning import (
    host_cores,
    keep_off_model_cores,
    parse_cpu_list,
    raise_model_priority,
)
from inference.workers.gpu.runner import BatchRunner

needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs to split"
)


def test_cpu_lists_read_as_the_kernel_writes_them():
    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0-3") == {0, 1, 2, 3}
    assert parse_cpu_list(" 2, 4-5 ") == {2, 4, 5}


@pytest.mark.parametrize("spec", ["a", "3-1", "-1", "1-x"])
def test_a_cpu_list_it_cannot_read_is_refused_naming_the_part(spec):
    with pytest.raises(ValueError, match=f"RENQ_MODEL_CPUS: '{spec}'"):
        parse_cpu_list(spec)


def _affinity_of_a_thread(target) -> set[int]:
    seen: list[set[int]] = []

    def run() -> None:
        target()
        seen.append(os.sched_getaffinity(0))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


@needs_two_cpus
def test_forward_passes_run_on_the_model_cores_and_the_loop_keeps_off_them(settings):
    model_cpu = min(os.sched_getaffinity(0))
    settings.RENQ_MODEL_CPUS = str(model_cpu)
    runner = BatchRunner(readers=None)
    try:
        in_model_thread = runner._model_thread.submit(os.sched_getaffinity, 0).result()
    finally:
        runner._model_thread.shutdown()
    assert in_model_thread == {model_cpu}

    # As a worker process starts: its threads, started after, keep off the model's core.
    loop_cpus = _affinity_of_a_thread(keep_off_model_cores)
    assert model_cpu not in loop_cpus
    assert loop_cpus == os.sched_getaffinity(0) - {model_cpu}


def test_without_model_cpus_nothing_is_pinned(settings):
    settings.RENQ_MODEL_CPUS = ""
    runner = BatchRunner(readers=None)
    try:
        in_model_thread = runner._model_thread.submit(os.sched_getaffinity, 0).result()
    finally:
        runner._model_thread.shutdown()
    assert in_model_thread == os.sched_getaffinity(0)
    assert _affinity_of_a_thread(keep_off_model_cores) == os.sched_getaffinity(0)


# A worker process's start, in a session of its own (the nice it sets is its session's too): the
# nice of its main thread, of a thread it starts afterwards, and of its session.
_WORKER_START = """
import json, os, threading, django
django.setup()
from inference.workers.cpu_pinning import raise_model_priority
raise_model_priority(int(os.environ["MODEL_THREADS"]))
started = []
thread = threading.Thread(target=lambda: started.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
group = open("/proc/self/autogroup").read() if os.path.exists("/proc/self/autogroup") else ""
print(json.dumps({"main": os.getpriority(os.PRIO_PROCESS, 0), "thread": started[0],
                  "session": group}))
"""


def _start_worker_process(nice: str, model_threads: int) -> dict:
    env = {**os.environ, "RENQ_MODEL_NICE": nice, "MODEL_THREADS": str(model_threads)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_START],
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


may_raise_priority = pytest.mark.skipif(
    os.geteuid() != 0, reason="lowering a nice below 0 needs root (CAP_SYS_NICE)"
)


@needs_two_cpus
@may_raise_priority
def test_a_model_worker_that_leaves_a_core_runs_ahead_of_the_rest_of_the_host():
    started = _start_worker_process("-7", model_threads=1)
    assert started["main"] == -7
    assert started["thread"] == -7  # its model, loop and store threads, started afterwards
    if started["session"]:
        assert started["session"].split()[-1] == "-7"  # its session against the others


@needs_two_cpus
def test_a_model_on_every_core_keeps_the_priority_it_was_started_with():
    started = _start_worker_process("-7", model_threads=len(os.sched_getaffinity(0)))
    assert started["main"] == started["thread"] == os.getpriority(os.PRIO_PROCESS, 0)
    if started["session"]:
        assert started["session"].split()[-1] == "0"


@needs_two_cpus
def test_without_the_privilege_the_worker_runs_as_started_and_says_why(
    settings, monkeypatch, caplog
):
    settings.RENQ_MODEL_NICE = -10

    def refused(*_args) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(cpu_pinning.os, "setpriority", refused)
    with caplog.at_level(logging.WARNING, logger=cpu_pinning.__name__):
        raise_model_priority(1)
    assert "needs CAP_SYS_NICE" in caplog.text
    assert "RENQ_MODEL_NICE=0" in caplog.text


@needs_two_cpus
def test_a_session_nice_it_cannot_set_leaves_the_threads_raised(settings, monkeypatch, caplog):
    settings.RENQ_MODEL_NICE = -5
    raised: list[int] = []
    monkeypatch.setattr(cpu_pinning.os, "setpriority", lambda _which, _who, n: raised.append(n))

    class ReadOnly:
        def exists(self) -> bool:
            return True

        def write_text(self, _text: str) -> None:
            raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cpu_pinning, "AUTOGROUP", ReadOnly())
    with caplog.at_level(logging.INFO, logger=cpu_pinning.__name__):
        raise_model_priority(1)
    assert raised == [settings.RENQ_MODEL_NICE]
    assert "session keeps its nice" in caplog.text


@needs_two_cpus
def test_a_pinned_model_on_its_cores_leaves_the_others_to_the_host(settings):
    """Priority counts the model's cores against the host's, not against what the worker's
    loop keeps once it stepped off them."""
    cores = os.sched_getaffinity(0)
    settings.RENQ_MODEL_CPUS = str(min(cores))
    seen: list[frozenset[int]] = []

    def step_off_then_count() -> None:
        keep_off_model_cores()
        seen.append(host_cores())

    thread = threading.Thread(target=step_off_then_count)
    thread.start()
    thread.join()
    assert seen == [frozenset(cores)]
