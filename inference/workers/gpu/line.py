"""The line of claimed jobs waiting in the worker to run, and whose turn comes next."""

from __future__ import annotations

from collections import deque

from inference.jobs.tiers import Tier
from inference.workers.gpu.held import Held
from inference.workers.tier_reader import WeightedShare


class Line:
    """Claimed jobs that are not running yet.

    The front — claimed realtime jobs, a formed batch that yielded to realtime work — runs
    before anything else. Claimed jobs of the tiers below realtime that did not
    fit the batch they were pulled for, and chunked generations to continue, wait for their
    tier's turn in the weighted share, which charges them when they run, so the jobs of one
    message (or the passes of one generation) do not run back to back ahead of the other
    tiers' work.
    """

    def __init__(self, share: WeightedShare):
        self.share = share
        self.front: deque[Held] = deque()
        self._waiting: dict[Tier, deque[Held]] = {tier: deque() for tier in WeightedShare.TIERS}

    @property
    def holding(self) -> bool:
        """Claimed jobs wait here to run (they are run before the task returns)."""
        return bool(self.front) or self.tiers_waiting

    @property
    def tiers_waiting(self) -> bool:
        """Claimed jobs wait here for their tier's turn."""
        return any(self._waiting.values())

    def wait_for_turn(self, held: Held, tier: Tier) -> None:
        """The job waits for its tier's turn (a tier below realtime)."""
        self._waiting[tier].append(held)

    def put_first(self, held: list[Held]) -> None:
        """These, in this order, ahead of everything else."""
        self.front.extendleft(reversed(held))

    def tiers_ahead_of_waiting(self) -> list[Tier]:
        """Realtime, then the tiers below it in the share's order up to the first one with
        claimed jobs waiting here: the queues to pull from before those jobs run."""
        ahead = [Tier.REALTIME]
        for tier in self.share.order():
            if self._waiting[tier]:
                break
            ahead.append(tier)
        return ahead

    def next_waiting(self) -> tuple[Tier, Held]:
        """The next claimed job of the first tier (in the share's order) that has any."""
        tier = next(t for t in self.share.order() if self._waiting[t])
        return tier, self._waiting[tier][0]

    def take_unstarted(self) -> list[Held]:
        """Every claimed job here that no pass has started (a chunked generation, a job run in
        parts, stays to its end): the worker hands them back rather than hold what an idle
        peer could start."""
        unstarted = [h for h in self.front if not h.started]
        self.front = deque(h for h in self.front if h.started)
        for tier, waiting in self._waiting.items():
            unstarted.extend(h for h in waiting if not h.started)
            self._waiting[tier] = deque(h for h in waiting if h.started)
        return unstarted

    def take_waiting(self, tier: Tier) -> Held:
        """The tier's next waiting job runs: its tier is charged for it."""
        held = self._waiting[tier].popleft()
        self.share.served(tier, 1)
        return held
