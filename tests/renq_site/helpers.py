"""Real processes (gunicorn, Flower, a Celery worker) for the operational tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import requests

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = ROOT / ".run"
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_database_url() -> str:
    """DATABASE_URL of pytest-django's test database (valid once django_db_setup has run), so
    child processes see what the test commits."""
    from django.db import connection

    db = connection.settings_dict
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{quote(db['USER'], safe='')}{password}@{host}:{port}/{db['NAME']}"


class ChildProcess:
    """A child in its own process group, logging to .run/<name>.log; stop() always kills it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None):
        RUN_DIR.mkdir(exist_ok=True)
        self.log_path = RUN_DIR / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what}: process exited\n{self.log_tail()}")
            try:
                if check():
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last_error = exc
            time.sleep(0.2)
        raise RuntimeError(f"{what}: not within {timeout_s} s ({last_error})\n{self.log_tail()}")

    def stop(self, grace_s: float = 10) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@contextmanager
def asgi_web_server(
    name: str, *, timeout_s: float = 60, env: dict[str, str] | None = None
) -> Iterator[str]:
    """gunicorn with a uvicorn worker, as `make web` runs it, on the test database and a free
    port; yields its URL once /healthz answers, stops it afterwards. `env` adds to (and may
    override) the process's environment."""
    port = free_port()
    web = ChildProcess(
        name,
        [
            str(VENV_BIN / "gunicorn"),
            "renq_site.asgi:application",
            "-k",
            "uvicorn_worker.UvicornWorker",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "1",
        ],
        env={"DATABASE_URL": child_database_url(), **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        web.wait_until(lambda: requests.get(f"{url}/healthz", timeout=1).ok, name, timeout_s)
        yield url
    finally:
        web.stop()
