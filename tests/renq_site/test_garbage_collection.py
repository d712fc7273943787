"""Server processes freeze what they loaded at start out of garbage collection (each full
collection walked it all again), and still collect what they allocate afterwards."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from renq_site.garbage_collection import freeze_startup_objects

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def frozen_heap():
    try:
        yield
    finally:
        gc.unfreeze()


class _Node:
    pass


def test_after_freezing_new_reference_cycles_are_still_collected(frozen_heap):
    freeze_startup_objects()
    assert gc.get_freeze_count() > 0

    node = _Node()
    node.self = node  # a cycle: only the collector frees it
    gone = weakref.ref(node)
    del node
    gc.collect()
    assert gone() is None


def _freeze_count_in_new_process(code: str) -> int:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "renq_site.settings"}
    out = subprocess.run(
        [sys.executable, "-c", f"import gc\n{code}\nprint(gc.get_freeze_count())"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(out.stdout.split()[-1])


def test_the_web_process_freezes_its_startup_objects():
    # What gunicorn's worker imports (`make web`): the views are loaded and frozen too.
    assert _freeze_count_in_new_process("import renq_site.asgi") > 10_000


def test_a_worker_process_freezes_its_startup_objects_when_celery_starts_it():
    code = (
        "import django\ndjango.setup()\n"
        "import inference.tasks\n"
        "from celery.signals import worker_process_init\n"
        "worker_process_init.send(sender=None)"
    )
    assert _freeze_count_in_new_process(code) > 10_000
