"""Hosts as Linux network namespaces: each joined to the root namespace by a veth pair with
private addresses (10.213.<subnet>.1 on the root side, .2 inside the host), nothing routed
beyond them. Names carry a prefix derived from the test queue prefix, so two runs on one
machine with different prefixes never touch each other's hosts, and a crashed run's
leftovers are found by that prefix and removed before the next run builds its own."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from tests.conftest import TEST_QUEUE_PREFIX

# Interface names are limited to 15 characters: "rq<slot><host><side>" fits.
_SLOTS = 30
_HOSTS_PER_SLOT = 8


def _slot() -> int:
    return int(hashlib.sha1(TEST_QUEUE_PREFIX.encode()).hexdigest(), 16) % _SLOTS


SLOT = _slot()
NETNS_PREFIX = f"renqc{SLOT:02d}-"
LINK_PREFIX = f"rq{SLOT:02d}"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """One `ip` command, bounded in time; raises with its stderr when `check` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def privilege_problem() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to make network namespaces"
    if shutil.which("unshare") is None:
        return "needs util-linux's `unshare` to give each host its own hostname"
    if os.geteuid() != 0:
        return "needs root to make network namespaces and veth pairs (CI runs as root)"
    probe = f"{NETNS_PREFIX}probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class HostLink:
    """One host's namespace and its veth pair."""

    name: str  # "gpu1"
    netns: str
    root_if: str
    host_if: str
    root_address: str  # the root side: the host's proxies listen here
    address: str  # the host's own address, e.g. the web host's gunicorn

    @property
    def hostname(self) -> str:
        return self.netns


def namespace_pids(netns: str) -> list[int]:
    done = ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def signal_namespace(netns: str, sig: int) -> list[int]:
    """`sig` to every process in the namespace; the pids signalled."""
    pids = namespace_pids(netns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def _remove_namespace(netns: str) -> None:
    # Frozen processes must be woken for SIGKILL to end them at once.
    signal_namespace(netns, signal.SIGCONT)
    signal_namespace(netns, signal.SIGKILL)
    for _ in range(50):
        if not namespace_pids(netns):
            break
        time.sleep(0.1)
    # Removing the namespace destroys its veth end, and with it the root-side peer.
    ip("netns", "del", netns, check=False)


def remove_leftovers() -> list[str]:
    """A crashed run's namespaces and links (this run's prefix only); the names removed."""
    removed = []
    listed = ip("netns", "list", check=False).stdout.split("\n")
    for netns in (line.split()[0] for line in listed if line.strip()):
        if netns.startswith(NETNS_PREFIX):
            _remove_namespace(netns)
            removed.append(netns)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(LINK_PREFIX):
            ip("link", "del", name, check=False)
            removed.append(name)
    return removed


class HostNetwork:
    """The namespaces of one run; `remove()` takes them all down (idempotent)."""

    def __init__(self):
        self.hosts: dict[str, HostLink] = {}

    def add(self, name: str) -> HostLink:
        index = len(self.hosts)
        assert index < _HOSTS_PER_SLOT, "too many hosts for the address plan"
        subnet = SLOT * _HOSTS_PER_SLOT + index
        host = HostLink(
            name=name,
            netns=f"{NETNS_PREFIX}{name}",
            root_if=f"{LINK_PREFIX}{name}r",
            host_if=f"{LINK_PREFIX}{name}h",
            root_address=f"10.213.{subnet}.1",
            address=f"10.213.{subnet}.2",
        )
        self.hosts[name] = host  # before the commands: remove() cleans up a half-made host
        ip("netns", "add", host.netns)
        ip("link", "add", host.root_if, "type", "veth", "peer", "name", host.host_if,
           "netns", host.netns)  # fmt: skip
        ip("addr", "add", f"{host.root_address}/24", "dev", host.root_if)
        ip("link", "set", host.root_if, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.host_if)
        ip("-n", host.netns, "link", "set", host.host_if, "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def cut(self, name: str) -> None:
        """The host's link down: its packets go nowhere, its TCP connections hang (no RST),
        as in a real partition."""
        ip("link", "set", self.hosts[name].root_if, "down")

    def heal(self, name: str) -> None:
        ip("link", "set", self.hosts[name].root_if, "up")

    def heal_all(self) -> None:
        for name in self.hosts:
            self.heal(name)

    def remove(self) -> None:
        for host in self.hosts.values():
            _remove_namespace(host.netns)
            ip("link", "del", host.root_if, check=False)
        self.hosts.clear()
