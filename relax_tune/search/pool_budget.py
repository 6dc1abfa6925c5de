"""What a search's pool may spend growing: seconds (``SearchContext.pool_secs``), replays
(``SearchContext.pool_replays``) or both, and how many replays fit in what is left."""

from __future__ import annotations

import math
import time

MIN_TIMED_POOL = 8
"""Fresh samples a pool gets even when its budget is spent (16 made MobileNetV2's 34 first
pools take a whole 30 s session on 2 cores)."""

FIRST_REPLAY_SECS = 0.04
"""A replay's seconds before a search has timed its own (one sample of a convolution's
space on this 2-core machine: 37-52 ms)."""

MAX_CHUNK = 32
"""Jobs replayed together (shared with the builder's workers; those past a stop are wasted)."""


class PoolBudget:
    """The budget of the pool being grown: a deadline, a number of replays, both (the larger
    of the two: at least the replays, more while the time lasts) or none.

    A budget in replays makes the pool, and so the model's choice from it, the same in every
    run with the same seed (the no-measurement compile); one in seconds holds a time limit
    whatever the machine's speed, and the pool then depends on it. A measuring session's
    first pools have both: as large as the no-measurement compile's, so that the schedules
    it predicts are no worse (EfficientNet-B0 tuned 30 s, its first pools in 9 s of seconds
    alone, predicted schedules up to 7x slower than the no-measurement compile's and read
    0.95x ONNX Runtime against 1.07x with no measurement; AMD EPYC Zen 4)."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # time.monotonic()
        self.replays_left: int | None = None

    def start(self, secs: float | None, replays: int | None = None) -> None:
        """A pool starts growing, with ``secs`` and ``replays`` to do it in (None: no limit)."""
        self.deadline = None if secs is None else time.monotonic() + secs
        self.replays_left = replays

    def stop(self) -> None:
        """The pool is grown."""
        self.deadline = None
        self.replays_left = None

    def spend(self, replays: int) -> None:
        """``replays`` jobs were replayed for the pool."""
        if self.replays_left is not None:
            self.replays_left = max(0, self.replays_left - replays)

    def spent(self) -> bool:
        """Whether the pool being grown has used its budget (with both, its time and its
        replays)."""
        if self.replays_left is None and self.deadline is None:
            return False
        return (self.replays_left is None or self.replays_left <= 0) and \
            (self.deadline is None or time.monotonic() >= self.deadline)

    def chunk(self, wanted: int, floor: int, replays: int, replay_secs: float) -> int:
        """Jobs to replay together: ``wanted``, at most ``MAX_CHUNK``; under a budget no more
        than fit in what is left of it (at least ``floor``; with both, of the larger): the
        replays left, and before a deadline as many as its seconds hold at the search's own
        seconds per replay so far (``replay_secs`` over ``replays``). A whole chunk started
        just before the time ran out cost a MobileNetV2 task's timed pool 32 replays (1.3 s)
        where 8 were due."""
        limits = []
        if self.replays_left is not None:
            limits.append(max(floor, self.replays_left))
        if self.deadline is not None:
            per_job = replay_secs / replays if replays else FIRST_REPLAY_SECS
            left = max(0.0, self.deadline - time.monotonic())
            limits.append(max(floor, math.ceil(left / max(per_job, 1e-4))))
        size = min(MAX_CHUNK, wanted)
        return max(1, min(size, max(limits)) if limits else size)
