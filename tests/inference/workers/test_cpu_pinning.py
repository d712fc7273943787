"""RENQ_MODEL_CPUS: forward passes on the model's cores, the rest of the worker off them."""

from __future__ import annotations

import os
import threading

import pytest

from inference.workers.cpu_pinning import keep_off_model_cores, parse_cpu_list
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
