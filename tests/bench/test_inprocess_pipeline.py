"""bench/inprocess_pipeline.py is what a GPU machine runs for issue 9's batch-512 figure: it
must run there with torch and transformers alone (no Django, no services)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

# Runs the script as `python bench/inprocess_pipeline.py …` does, then says which of the
# project's server-side packages it imported.
RUN_AND_LIST_IMPORTS = """
import json, runpy, sys
sys.argv = ["bench/inprocess_pipeline.py", *sys.argv[1:]]
try:
    runpy.run_path("bench/inprocess_pipeline.py", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
servers = {"django", "celery", "kombu", "redis", "psycopg2"}
loaded = sorted({name.split(".")[0] for name in sys.modules} & servers)
print("IMPORTED", json.dumps(loaded))
"""


def test_runs_without_django_on_a_minilm_shaped_encoder(tiny_models, tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_AND_LIST_IMPORTS,
            "--device",
            "cpu",
            "--batch",
            "8",
            "--texts",
            "32",
            "--minilm-shaped",
            str(tiny_models["tiny-reranker"]),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no DJANGO_SETTINGS_MODULE
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.rsplit("IMPORTED", 1)[1]) == []
    figures = json.loads(out.read_text())
    assert figures["model"] == "MiniLM-shaped, random weights"
    assert figures["batch"] == 8 and figures["texts"] == 32 and figures["traced_forward"]
    assert figures["raw_texts_s"] > 0 and figures["pipelined_texts_s"] > 0
    assert figures["passes"] == 4  # 32 one-text jobs in windows of 8
