"""A RabbitMQ restart under load, as a new user runs renq: the README's processes (`make web`'s
gunicorn, `make worker`'s GPU worker, the control worker), the shipped configuration in the
`renq` database, three `pro` tenants. Two flood single-text api jobs from four keep-alive REST
clients each (waiting out 429/503 per Retry-After), one posts every 0.5 s; 40 s in all, with
`rabbitmqctl stop_app`, 4 s, `start_app` 12 s in. Then it waits for every accepted job to be
final and writes the HTTP answers, the final statuses per tenant and, per second of acceptance,
how many succeeded and expired.

Stops the machine's real RabbitMQ: run it by hand, never beside tests.

    .venv/bin/python bench/broker_restart.py LABEL   # /tmp/renq-broker-restart/LABEL, logs in .run/
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

SECONDS, CUT_AT_S, DOWN_S = 40.0, 12.0, 4.0
TIERS = ("realtime", "api", "batch", "offline")
FLOOD_CLIENTS = 4
QUIET_PAUSE_S = 0.5
SETTLE_S = 60.0
OUT = Path("/tmp/renq-broker-restart")


def psql(query: str) -> str:
    """Runs on stdin: the job ids would overflow an argument list."""
    command = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "renq", "-At"]
    return subprocess.run(command, input=query, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("label")
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    repo, out = Path(args.repo), OUT / args.label
    out.mkdir(parents=True, exist_ok=True)
    venv = repo / ".venv" / "bin"
    run = str(int(time.time()))

    def tenant(name: str) -> str:
        made = subprocess.run(
            [venv / "python", "manage.py", "create_tenant", name, "--plan", "pro"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        )
        return made.stdout.strip().splitlines()[-1].split()[-1]

    keys = {name: tenant(f"br{args.label}{name}{run}") for name in ("floodA", "floodB", "quiet")}
    # That checkout's process starter: the processes run its code, as `make web`, `make worker`
    # and the README's control worker start them (logs under its .run/).
    sys.path.insert(0, str(repo / "scripts"))
    from processes import CONTROL_WORKER_OPTIONS, ProcessGroup

    with ProcessGroup() as group:
        group.web(8000)
        group.worker(f"embedding{run}", [f"embedding.{tier}" for tier in TIERS])
        group.worker(f"control{run}", ["renq.control"], beat=True, extra=CONTROL_WORKER_OPTIONS)
        summary = _load_through_a_restart(keys)
    summary["label"] = args.label
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "by_second"}, indent=1))


def _ready() -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", 8000, timeout=2)
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except OSError:
        return False


def _load_through_a_restart(keys: dict[str, str]) -> dict:
    waited = time.monotonic()
    while not _ready() and time.monotonic() - waited < 90:
        time.sleep(0.5)
    answers: list[tuple[str, int, str | None]] = []
    lock = threading.Lock()
    started = time.time()

    def client(name: str, pause_s: float) -> None:
        connection, i = None, 0
        while time.time() - started < SECONDS:
            i += 1
            body = {"service": "embedding", "priority": "api",
                    "input": {"texts": [f"{name} {i} {time.time()} words here"]}}  # fmt: skip
            headers = {"Authorization": f"Bearer {keys[name]}",
                       "Content-Type": "application/json"}  # fmt: skip
            try:
                connection = connection or http.client.HTTPConnection("127.0.0.1", 8000, timeout=10)
                connection.request("POST", "/api/v1/jobs", json.dumps(body), headers)
                response = connection.getresponse()
                data, status = response.read(), response.status
                job_id = json.loads(data).get("id") if status in (200, 202) else None
                retry_after = response.getheader("Retry-After")
            except OSError:
                connection, status, job_id, retry_after = None, -1, None, None
            with lock:
                answers.append((name, status, job_id))
            if status in (429, 503) and retry_after:
                time.sleep(min(float(retry_after), 2.0))
            elif pause_s or status == -1:
                time.sleep(pause_s or 0.2)

    threads = [
        threading.Thread(target=client, args=(name, 0.0))
        for name in ("floodA", "floodB")
        for _ in range(FLOOD_CLIENTS)
    ]
    threads.append(threading.Thread(target=client, args=("quiet", QUIET_PAUSE_S)))
    for thread in threads:
        thread.start()
    time.sleep(CUT_AT_S)
    cut_at = time.time() - started
    subprocess.run(["rabbitmqctl", "stop_app"], capture_output=True)
    time.sleep(DOWN_S)
    subprocess.run(["rabbitmqctl", "start_app"], capture_output=True)
    back_at = time.time() - started
    for thread in threads:
        thread.join()

    ids = ",".join(f"'{job_id}'" for _, _, job_id in answers if job_id)
    by_tenant = (
        "select t.name, j.status, count(*) from inference_job j join inference_tenant t "
        f"on t.id = j.tenant_id where j.id in ({ids}) group by 1, 2 order by 1, 2"
    )
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and any(
        waiting in psql(by_tenant) for waiting in ("|queued|", "|running|")
    ):
        time.sleep(2)
    by_second = (
        f"select floor(extract(epoch from created_at) - {started})::int, status, count(*) "
        f"from inference_job where id in ({ids}) group by 1, 2 order by 1, 2"
    )
    return {
        "cut_at_s": round(cut_at, 1),
        "broker_back_s": round(back_at, 1),
        "http": dict(Counter(status for _, status, _ in answers)),
        "statuses": psql(by_tenant),
        "by_second": psql(by_second),
    }


if __name__ == "__main__":
    main()
