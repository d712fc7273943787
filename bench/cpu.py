"""CPU time of the stack's processes over a run, from /proc (Linux), by role:

- web, worker, control: the process groups the bench started (each is its own session), all
  their processes, plus what their reaped children used (cutime/cstime);
- postgres: the server's auxiliary processes, the live backends connected to the bench
  database, and the backends reaped during the run (the postmaster's cutime/cstime: those
  are short-lived connections of *any* database, so another user's work on this server would
  be counted too; `pg_sessions` says how many the bench's database opened);
- rabbitmq (beam.smp, erl_child_setup, epmd, inet_gethost), redis (redis-server): the whole
  server, shared with whatever else uses it;
- client: the bench process itself (load generator and pollers); not part of the stack.

`machine_busy_s` (all CPUs, /proc/stat) shows how much else ran: machine − stack − client.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
RABBITMQ_COMMS = {"beam.smp", "erl_child_setup", "epmd", "inet_gethost"}
REDIS_COMMS = {"redis-server"}
STACK_ROLES = ("web", "worker", "postgres", "rabbitmq", "redis")


@dataclass(frozen=True)
class ProcSample:
    pid: int
    comm: str
    session: int
    own_s: float  # utime + stime
    children_s: float  # cutime + cstime (reaped children)
    started: int  # start time in ticks since boot: tells a reused pid apart
    cmdline: str


def _read(pid: int) -> ProcSample | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcSample(
        pid=pid,
        comm=comm,
        session=int(fields[3]),
        own_s=(int(fields[11]) + int(fields[12])) * TICK_S,
        children_s=(int(fields[13]) + int(fields[14])) * TICK_S,
        started=int(fields[19]),
        cmdline=cmdline.strip(),
    )


def _all() -> list[ProcSample]:
    samples = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            sample = _read(int(name))
            if sample is not None:
                samples.append(sample)
    return samples


def machine_busy_s() -> float:
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)
    return (sum(cpu[:8]) - idle) * TICK_S


def _postgres_database(sample: ProcSample) -> str | None:
    """'postgres: 15/main: user db host state' → db; None for auxiliary processes."""
    parts = sample.cmdline.split(": ", 2)
    if len(parts) < 3:
        return None
    words = parts[2].split()
    return words[1] if len(words) >= 3 else None


@dataclass
class CpuMeter:
    """meter = CpuMeter(db_name, {"web": pid, "worker": pid}); meter.start(); ...;
    meter.stop() → {"web_s": ..., "worker_s": ..., ...}."""

    db_name: str
    sessions: dict[str, int]  # role → session id (the pid of a process started in a new session)
    _start: dict[tuple[int, int], ProcSample] = field(default_factory=dict)
    _machine0: float = 0.0
    _boot_ticks: int = 0

    def _role(self, sample: ProcSample) -> str | None:
        for role, session in self.sessions.items():
            if sample.session == session:
                return role
        if sample.pid == os.getpid():
            return "client"
        if sample.comm == "postgres" or sample.cmdline.startswith("postgres:"):
            database = _postgres_database(sample)
            return "postgres" if database in (None, self.db_name) else None
        if sample.comm in RABBITMQ_COMMS:
            return "rabbitmq"
        if sample.comm in REDIS_COMMS:
            return "redis"
        return None

    def _is_postmaster(self, sample: ProcSample) -> bool:
        return sample.comm == "postgres" and not sample.cmdline.startswith("postgres:")

    def start(self) -> None:
        self._start = {(s.pid, s.started): s for s in _all() if self._role(s)}
        self._machine0 = machine_busy_s()

    def stop(self) -> dict[str, float]:
        machine = machine_busy_s() - self._machine0
        totals = {role: 0.0 for role in (*STACK_ROLES, "control", "client")}
        for sample in _all():
            role = self._role(sample)
            if role is None:
                continue
            before = self._start.get((sample.pid, sample.started))
            own = sample.own_s - (before.own_s if before else 0.0)
            # Reaped children: a role's own helpers, or the postmaster's connections.
            children = 0.0
            if role != "postgres" or self._is_postmaster(sample):
                children = sample.children_s - (before.children_s if before else 0.0)
            totals[role] = totals.get(role, 0.0) + own + children
        result = {f"{role}_s": round(seconds, 3) for role, seconds in totals.items()}
        result["stack_s"] = round(sum(totals[r] for r in (*STACK_ROLES, "control")), 3)
        result["machine_busy_s"] = round(machine, 3)
        result["other_s"] = round(machine - result["stack_s"] - totals["client"], 3)
        return result


def pg_sessions(db_name: str) -> int:
    """Sessions the database has opened since its statistics were reset (PostgreSQL ≥ 14)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [db_name])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def pg_connections(db_name: str) -> int:
    """Connections open to the database now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [db_name])
        return int(cursor.fetchone()[0])


SERVER_COMMS = {"postgres"} | RABBITMQ_COMMS | REDIS_COMMS


def server_threads() -> list[int]:
    """Thread ids of the machine's PostgreSQL, RabbitMQ and Redis processes."""
    tids = []
    for sample in _all():
        if sample.comm in SERVER_COMMS:
            try:
                tids += [int(tid) for tid in os.listdir(f"/proc/{sample.pid}/task")]
            except FileNotFoundError:
                pass  # exited meanwhile
    return tids


class ServerAffinity:
    """Keeps the machine's PostgreSQL, RabbitMQ and Redis on given CPUs for a while, then puts
    every thread of theirs back where it was (threads started meanwhile, such as new Postgres
    backends forked from the pinned postmaster, back to `restore_to`)."""

    def __init__(self, restore_to: frozenset[int]):
        self.restore_to = restore_to
        self.before: dict[int, set[int]] = {}

    def pin(self, cpus: frozenset[int]) -> int:
        """How many threads were moved (0 without the permission to move them)."""
        for tid in server_threads():
            try:
                before = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
            except OSError:  # exited meanwhile, or not ours to move
                continue
            self.before[tid] = before
        return len(self.before)

    def restore(self) -> None:
        for tid in server_threads():
            try:
                os.sched_setaffinity(tid, self.before.get(tid, self.restore_to))
            except OSError:
                continue
        self.before.clear()
