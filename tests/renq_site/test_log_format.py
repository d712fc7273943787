"""RENQ_LOG_FORMAT=json: one JSON object per line, with the job's context where passed."""

from __future__ import annotations

import json
import logging
import types

from inference.metrics.log_fields import job_fields
from renq_site.log_format import JsonFormatter


def test_json_lines_carry_job_context():
    job = types.SimpleNamespace(
        pk="0b9f", tenant=types.SimpleNamespace(name="acme"), tenant_id=1,
        service=types.SimpleNamespace(name="embedding"), service_id=1, tier="batch",
    )  # fmt: skip
    record = logging.LogRecord("inference.workers.gpu", logging.ERROR, __file__, 1,
                               "job %s failed", ("0b9f",), None)  # fmt: skip
    for key, value in job_fields(job, backend="local-embedding", batch_id="b1").items():
        setattr(record, key, value)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job 0b9f failed" and line["level"] == "ERROR"
    assert {k: line[k] for k in ("job_id", "tenant", "service", "tier", "backend", "batch_id")} == {
        "job_id": "0b9f", "tenant": "acme", "service": "embedding", "tier": "batch",
        "backend": "local-embedding", "batch_id": "b1",
    }  # fmt: skip


def test_plain_records_have_no_context_keys():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
    assert set(json.loads(JsonFormatter().format(record))) == {
        "ts", "level", "logger", "message", "process",
    }  # fmt: skip
