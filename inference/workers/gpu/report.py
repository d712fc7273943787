"""What one run of the GPU worker's loop did."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchReport:
    """What one run did; returned by the task so Flower shows it."""

    ran: int = 0
    expired: int = 0
    dropped: int = 0
    failed: int = 0
    requeued: int = 0
    batches: int = 0
    continued: int = 0  # passes that left a generation unfinished, to continue in a later one
    handed_back: int = 0  # claimed jobs given back unstarted, for an idle peer to take
    tiers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return self.__dict__.copy()
