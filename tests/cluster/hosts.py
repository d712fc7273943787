"""renq's processes spread over hosts (tests/cluster/network.py): each host reaches
PostgreSQL, RabbitMQ and Redis through its own fault proxies in the root namespace, listening
on the root side of its veth pair, so one host can be cut from one service while the others
keep it. Processes start inside their host (`ip netns exec`) with the host's name as their
hostname, so a job's `worker` (host:pid) says which host ran it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterable

import requests

from tests.chaos.cluster import REAL_PORTS, celery_worker_argv
from tests.chaos.tcp_proxy import FaultProxy
from tests.cluster.network import HostLink, HostNetwork, namespace_pids, signal_namespace
from tests.conftest import TEST_QUEUE_PREFIX, TEST_REDIS_URL
from tests.renq_site.helpers import RUN_DIR, VENV_BIN, ChildProcess, child_database_url

# Queues of their own, apart from the rest of the session's workers (as the chaos suite's).
CLUSTER_QUEUE_PREFIX = f"{TEST_QUEUE_PREFIX}cluster."
WEB_PORT = 8000  # inside the web host's namespace, where nothing else listens


class Host:
    """A namespace and its three fault proxies."""

    def __init__(self, link: HostLink):
        self.link = link
        self.name = link.name
        self.postgres = self._proxy("postgres")
        self.rabbitmq = self._proxy("rabbitmq")
        self.redis = self._proxy("redis")

    def _proxy(self, service: str) -> FaultProxy:
        return FaultProxy(
            REAL_PORTS[service],
            bind_host=self.link.root_address,
            name=f"{self.name}->{service}",
        )

    def proxies(self) -> list[FaultProxy]:
        return [self.postgres, self.rabbitmq, self.redis]

    def child_env(self) -> dict[str, str]:
        """Every service through this host's proxies."""
        address = self.link.root_address
        database = re.sub(r"@[^/@]*/", f"@{address}:{self.postgres.port}/", child_database_url())
        redis_db = TEST_REDIS_URL.rsplit("/", 1)[-1] or "0"
        redis_url = f"redis://{address}:{self.redis.port}/{redis_db}"
        return {
            "DATABASE_URL": database,
            "CELERY_BROKER_URL": f"amqp://guest:guest@{address}:{self.rabbitmq.port}//",
            "CELERY_RESULT_BACKEND": redis_url,
            "RENQ_REDIS_URL": redis_url,
        }


class HostCluster:
    """The hosts of one module and the processes on them. Every process runs in its own
    process group inside its host; `remove()` stops them all and takes the hosts down."""

    def __init__(self, network: HostNetwork, **env: str):
        self.network = network
        self.env = {
            "RENQ_QUEUE_PREFIX": CLUSTER_QUEUE_PREFIX,
            "RENQ_TORCH_THREADS": "1",
            "RENQ_LOG_LEVEL": "WARNING",
            **env,
        }
        self.hosts: dict[str, Host] = {}
        self.children: dict[str, tuple[Host, ChildProcess]] = {}
        self.web_url = ""

    def add_host(self, name: str) -> Host:
        host = Host(self.network.add(name))
        self.hosts[name] = host
        return host

    # --- processes -----------------------------------------------------------------------

    def _start(
        self, name: str, host: Host, argv: list[str], env: dict[str, str] | None = None
    ) -> ChildProcess:
        self.stop(name)
        hostname = host.link.hostname
        inside = [
            "ip", "netns", "exec", host.link.netns,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', hostname,
        ]  # fmt: skip
        env = {**self.env, **host.child_env(), **(env or {})}
        child = ChildProcess(f"cluster-{name}", inside + argv, env=env)
        self.children[name] = (host, child)
        return child

    def web(self, host: str = "web") -> str:
        place = self.hosts[host]
        address = place.link.address
        child = self._start(
            "web",
            place,
            [
                str(VENV_BIN / "gunicorn"),
                "renq_site.asgi:application",
                "-k",
                "uvicorn_worker.UvicornWorker",
                "-b",
                f"{address}:{WEB_PORT}",
                "-w",
                "1",
                "--timeout",
                "60",
            ],
            # The Host header the clients send is the namespace's address.
            env={"DJANGO_ALLOWED_HOSTS": f"127.0.0.1,localhost,{address}"},
        )
        self.web_url = f"http://{address}:{WEB_PORT}"
        child.wait_until(
            lambda: requests.get(f"{self.web_url}/healthz", timeout=1).ok, "cluster web", 90
        )
        return self.web_url

    def worker(
        self,
        name: str,
        host: str,
        queues: Iterable[str],
        *,
        concurrency: int = 1,
        pool: str = "prefork",
        beat: bool = False,
    ) -> ChildProcess:
        argv = celery_worker_argv(f"cluster-{name}", queues, concurrency, pool, beat=beat)
        return self._start(name, self.hosts[host], argv)

    def wait_ready(self, name: str, timeout_s: float = 120) -> None:
        _, child = self.children[name]
        child.wait_until(
            lambda: " ready." in child.log_path.read_text(errors="replace"),
            f"worker {name}",
            timeout_s,
        )

    def gpu_worker(self, host: str, services: Iterable[str]) -> ChildProcess:
        from inference.dispatch.queues import service_queues

        return self.worker(host, host, [q for s in services for q in service_queues(s)])

    def io_worker(self, host: str = "io") -> ChildProcess:
        from inference.dispatch.queues import io_queues

        return self.worker(host, host, io_queues(), concurrency=8, pool="threads")

    def control_worker(self, host: str = "ctl") -> ChildProcess:
        from inference.dispatch.queues import control_queue

        # As shipped: beat and the periodic tasks on 4 threads of one process.
        return self.worker(host, host, [control_queue()], pool="threads", concurrency=4, beat=True)

    def autoscaler(
        self, host: str, services: Iterable[str], *, watch_s: float = 1, minimum: int = 0
    ) -> ChildProcess:
        """`renq_autoscale --apply` on the host, so the workers it starts run there too."""
        argv = [str(VENV_BIN / "python"), "manage.py", "renq_autoscale", "--apply"]
        argv += ["--watch", str(watch_s), "--min", str(minimum)]
        for service in services:
            argv += ["--service", service]
        return self._start(f"autoscaler-{host}", self.hosts[host], argv)

    def running(self, name: str) -> bool:
        entry = self.children.get(name)
        return entry is not None and entry[1].proc.poll() is None

    def stop(self, name: str) -> None:
        entry = self.children.pop(name, None)
        if entry is not None:
            host, child = entry
            signal_namespace(host.link.netns, signal.SIGCONT)  # a frozen one cannot stop
            child.stop(grace_s=15)

    def stop_all(self, grace_s: float = 15) -> None:
        """SIGTERM to every process at once, then each waited for (SIGKILL past the grace)."""
        entries = list(self.children.values())
        self.children.clear()
        for host, child in entries:
            signal_namespace(host.link.netns, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, child in entries:
            child.stop(grace_s=max(0.1, deadline - time.monotonic()))

    # --- faults on a whole host --------------------------------------------------------------

    def hang(self, host: str) -> list[int]:
        """SIGSTOP to every process on the host: its connections stay open, nothing answers."""
        return signal_namespace(self.hosts[host].link.netns, signal.SIGSTOP)

    def wake(self, host: str) -> list[int]:
        return signal_namespace(self.hosts[host].link.netns, signal.SIGCONT)

    def kill(self, host: str) -> list[int]:
        """SIGKILL to every process on the host, as a machine that loses power."""
        netns = self.hosts[host].link.netns
        pids = signal_namespace(netns, signal.SIGKILL)
        for name, (place, child) in list(self.children.items()):
            if place.name == host:
                child.proc.wait(timeout=30)
                child.stop()
                del self.children[name]
        # Pool children that outlived their parent for a moment are reaped by init.
        deadline = time.monotonic() + 10
        while namespace_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not namespace_pids(netns), f"processes left on {host}"
        return pids

    def partition(self, host: str) -> None:
        self.network.cut(host)

    def heal(self, host: str) -> None:
        self.network.heal(host)

    def restore_all(self) -> None:
        """Every link up, every proxy passing, every process running (not frozen)."""
        self.network.heal_all()
        for host in self.hosts.values():
            for proxy in host.proxies():
                proxy.restore()
            signal_namespace(host.link.netns, signal.SIGCONT)

    def remove(self) -> None:
        try:
            self.stop_all()
        finally:
            for host in self.hosts.values():
                for proxy in host.proxies():
                    proxy.stop()
            self.hosts.clear()
            self.network.remove()
            for path in RUN_DIR.glob(f"cluster-beat-{os.getpid()}*"):
                path.unlink(missing_ok=True)
