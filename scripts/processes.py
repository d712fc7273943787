"""Starts and stops renq's processes (web, workers, Flower) for the demo and the bench."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
RUN_DIR = ROOT / ".run"
VENV_BIN = Path(sys.executable).parent


# The control worker runs beat and the periodic tasks on a few threads, so that a sweep that
# takes a second or more never holds back the every-second aging and expiry runs
# (docker/docker-compose.yml and the README start it the same way).
CONTROL_WORKER_OPTIONS = ["--pool", "threads", "--concurrency", "4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessGroup:
    """Child processes with logs under .run/, all stopped on exit (even on Ctrl-C)."""

    def __init__(self, env: dict[str, str] | None = None):
        RUN_DIR.mkdir(exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Path:
        log = RUN_DIR / f"{name}.log"
        self.procs[name] = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return log

    def web(self, port: int, workers: int = 2) -> str:
        """The web server as `make web` runs it (no access log)."""
        self.start(
            "web",
            [
                str(VENV_BIN / "gunicorn"),
                # ASGI: the /v1/ front door waits for jobs without a thread per request; the
                # REST API's sync views run on a thread per request as under WSGI.
                "renq_site.asgi:application",
                "-k",
                "uvicorn_worker.UvicornWorker",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                str(workers),
            ],
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{url}/api/schema/", timeout=1).ok, "web server")
        return url

    def worker(
        self,
        name: str,
        queues: list[str],
        concurrency: int = 1,
        threads: int = 0,
        beat: bool = False,
        extra: list[str] | None = None,
    ) -> Path:
        argv = [
            str(VENV_BIN / "celery"),
            "-A",
            "renq_site",
            "worker",
            "-n",
            f"{name}@%h",
            "-Q",
            ",".join(queues),
            "--concurrency",
            str(concurrency),
            "-l",
            "info",
        ]
        if beat:
            argv.append("-B")
        extra = extra or []
        argv += extra
        env = {"RENQ_TORCH_THREADS": str(threads)} if threads else None
        started = time.time()
        log = self.start(name, argv, env)
        wait_until(lambda: " ready." in log.read_text(), f"worker {name}", timeout_s=120)
        # Celery says " ready." before its pool processes have loaded their models: what is
        # sent before then waits for the load (a bench would time it). Prefork pool processes
        # load them; a beat started with the worker is a child that loads none.
        pool = extra[extra.index("--pool") + 1] if "--pool" in extra else "prefork"
        if pool == "prefork" and not beat:
            wait_until(
                lambda: self._pool_warm(name, started), f"worker {name}'s models", timeout_s=120
            )
        return log

    def _pool_warm(self, name: str, since: float) -> bool:
        """Every pool process of the worker wrote its readiness file (inference.workers.
        readiness) after `since`."""
        main = self.procs[name].pid
        children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
        ready_dir = Path(self.env.get("RENQ_READY_DIR") or RUN_DIR / "ready")
        for pid in children:
            try:
                state = json.loads((ready_dir / f"{pid}.json").read_text())
            except (OSError, ValueError):
                return False
            if state.get("at", 0) < since:
                return False
        return True

    def flower(self, port: int, basic_auth: str) -> str:
        """Flower on 127.0.0.1 behind basic auth ("user:password"), passed in the environment
        (Flower reads FLOWER_<option>) so it is not in the process list."""
        self.start(
            "flower",
            [
                str(VENV_BIN / "celery"),
                "-A",
                "renq_site",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
            ],
            env={"FLOWER_BASIC_AUTH": basic_auth},
        )
        url = f"http://127.0.0.1:{port}"
        # /healthcheck is Flower's one page without auth.
        wait_until(lambda: requests.get(f"{url}/healthcheck", timeout=1).ok, "flower")
        return url

    def upstream(self, port: int) -> str:
        """The OpenAI-compatible fake upstream (tests/routing/fake_upstream.py): the demo's
        stand-in for the free and paid cloud APIs, which this machine cannot reach."""
        self.start(
            "upstream",
            [
                sys.executable,
                str(ROOT / "tests" / "routing" / "fake_upstream.py"),
                "--port",
                str(port),
            ],
        )
        url = f"http://127.0.0.1:{port}"
        log = RUN_DIR / "upstream.log"
        wait_until(lambda: "READY" in log.read_text(), "fake upstream")
        return url

    def kill(self, name: str) -> None:
        """SIGKILL, as when a machine or its GPU dies: no warm shutdown, nothing handed back
        but what RabbitMQ redelivers."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_one(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(check, what: str, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up in {timeout_s}s ({last}); see {RUN_DIR}/")
