"""JSON-lines logs (RENQ_LOG_FORMAT=json): one object per line with the time, level, logger,
message and, where the log call passed them with `extra=`, the job id, tenant, service, tier,
backend and batch id — what a log pipeline (Loki, Elasticsearch, CloudWatch) filters on.

Django's LOGGING uses JsonFormatter for the web; Celery replaces the root logger's handlers
in workers, so its after_setup_logger signals put the same formatter on them.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

from celery.signals import after_setup_logger, after_setup_task_logger

# The `extra=` keys renq's log sites pass (inference.metrics.log_fields.job_fields).
CONTEXT_FIELDS = ("job_id", "tenant", "service", "tier", "backend", "batch_id", "worker")


def json_logs_enabled() -> bool:
    return os.environ.get("RENQ_LOG_FORMAT", "").strip().lower() == "json"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = str(value)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_celery_logs(logger: logging.Logger, **_kwargs) -> None:
    if json_logs_enabled():
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())
