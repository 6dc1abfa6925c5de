"""The time a search's pool may take to grow (``SearchContext.pool_secs``), and how many
replays fit in what is left of it."""

from __future__ import annotations

import math
import time

MIN_TIMED_POOL = 8
"""Fresh samples a pool gets even when its time is spent (16 made MobileNetV2's 34 first
pools take a whole 30 s session on 2 cores)."""

FIRST_REPLAY_SECS = 0.04
"""A replay's seconds before a search has timed its own (one sample of a convolution's
space on this 2-core machine: 37-52 ms)."""

MAX_CHUNK = 32
"""Jobs replayed together (shared with the builder's workers; those past a stop are wasted)."""


class PoolClock:
    """The deadline of the pool being grown (none: no limit)."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # time.monotonic()

    def start(self, secs: float | None) -> None:
        """A pool starts growing, with ``secs`` to do it in (None: no limit)."""
        self.deadline = None if secs is None else time.monotonic() + secs

    def stop(self) -> None:
        """The pool is grown."""
        self.deadline = None

    def out_of_time(self) -> bool:
        """Whether the pool being grown has used its time."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def chunk(self, wanted: int, floor: int, replays: int, replay_secs: float) -> int:
        """Jobs to replay together: ``wanted``, at most ``MAX_CHUNK``, and under a deadline
        no more than fit in what is left (at least ``floor``), at the search's own seconds
        per replay so far (``replay_secs`` over ``replays``). A whole chunk started just
        before the time ran out cost a MobileNetV2 task's timed pool 32 replays (1.3 s)
        where 8 were due."""
        size = min(MAX_CHUNK, wanted)
        if self.deadline is None:
            return size
        per_job = replay_secs / replays if replays else FIRST_REPLAY_SECS
        left = max(0.0, self.deadline - time.monotonic())
        return max(1, min(size, max(floor, math.ceil(left / max(per_job, 1e-4)))))
