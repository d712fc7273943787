"""Plain Celery's producer for the fast-path bench: threads calling `apply_async` on a no-op
task (bench.plain_celery: Celery's defaults, its producer pool, results in Redis), run as its
own process so its CPU is measured apart from the bench's.

    python bench/plain_producer.py <threads> <seconds> <queue>
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402, F401  (the bench's own stores)
from bench.plain_celery import plain_noop  # noqa: E402


def main() -> None:
    threads, seconds, queue = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    deadline = time.time() + seconds
    sent = [0] * threads

    def produce(k: int) -> None:
        while time.time() < deadline:
            plain_noop.apply_async(args=[sent[k]], queue=queue)
            sent[k] += 1

    workers = [threading.Thread(target=produce, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(sum(sent), flush=True)


if __name__ == "__main__":
    main()
