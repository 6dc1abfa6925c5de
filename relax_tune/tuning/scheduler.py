"""Task schedulers: which task gets the next batch of trials.

A scheduler sees each task's ``TaskProgress`` and picks one index. Both schedulers
first give every task that matters its first batch, most important first, so a small
budget is never spent on one task while another heavy task gets nothing; after that,
``round-robin`` takes turns and ``gradient`` picks the task whose next trials are expected
to cut the weighted end-to-end latency most (Ansor / MetaSchedule's gradient rule).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..utils import RelaxTuneError


@dataclass
class TaskProgress:
    """What a scheduler knows about one task.

    Attributes:
        weight: call sites of the task in the model.
        importance: the task's estimated share of end-to-end time (weight x measured
            untuned time, or weight x FLOPs before any measurement).
        best_per_round: best latency after each of the task's rounds (seconds; inf while
            nothing valid was measured).
        rounds: batches the task got in this run.
        active: False once the task hit its budget, converged or exhausted its space.
        scale: what one second of the task's latency is worth: 1 over the estimated model
            time at the task's own size (``loop._shares``; 1.0 when all tasks are static,
            where only the order of tasks matters).
    """

    weight: int
    importance: float
    best_per_round: list[float] = field(default_factory=list)
    rounds: int = 0
    active: bool = True
    scale: float = 1.0


class TaskScheduler:
    """Base class: ``next_task(tasks)`` returns the index of the task to tune next, or None."""

    name = "base"

    def next_task(self, tasks: Sequence[TaskProgress]) -> int | None:
        """Index of the next task to get a batch (None when no task is active)."""
        first = self._first_round(tasks)
        if first is not None:
            return first
        active = [i for i, t in enumerate(tasks) if t.active]
        return self._pick(tasks, active) if active else None

    @staticmethod
    def _first_round(tasks: Sequence[TaskProgress]) -> int | None:
        """The most important active task that has not had a batch yet."""
        waiting = [i for i, t in enumerate(tasks) if t.active and t.rounds == 0]
        return max(waiting, key=lambda i: tasks[i].importance) if waiting else None

    def _pick(self, tasks: Sequence[TaskProgress], active: list[int]) -> int:
        raise NotImplementedError


class RoundRobinScheduler(TaskScheduler):
    """Tasks take turns: the active task with the fewest rounds goes next."""

    name = "round-robin"

    def _pick(self, tasks: Sequence[TaskProgress], active: list[int]) -> int:
        return min(active, key=lambda i: (tasks[i].rounds, -tasks[i].importance))


class GradientScheduler(TaskScheduler):
    """The task whose next batch is expected to save the most weighted latency.

    For a task with best latencies ``b`` per round, the expected gain of one more round is
    ``alpha * (b[-1-w] - b[-1]) / w + (1 - alpha) * b[-1] / len(b)``: the recent
    improvement per round (backward window ``w``) blended with an optimistic share of the
    current latency; times the task's weight and its ``scale`` (so a dynamic-shape bucket's
    gain counts relative to the model's time at its own size). A task with nothing valid
    measured yet comes first. Ties are broken at random (seeded).
    """

    name = "gradient"

    def __init__(self, alpha: float = 0.2, window: int = 3, seed: int = 1) -> None:
        self.alpha, self.window = alpha, window
        self.rng = random.Random(seed)

    def gain(self, task: TaskProgress) -> float:
        """Expected weighted latency saved by one more round of ``task`` (seconds)."""
        best = task.best_per_round
        if not best or best[-1] == float("inf"):
            return float("inf")
        w = self.window
        backward = (best[-1 - w] - best[-1]) / w if len(best) > w else 0.0
        optimistic = best[-1] / len(best)
        return task.scale * task.weight * (self.alpha * backward +
                                           (1 - self.alpha) * optimistic)

    def _pick(self, tasks: Sequence[TaskProgress], active: list[int]) -> int:
        gains = {i: self.gain(tasks[i]) for i in active}
        top = max(gains.values())
        return self.rng.choice([i for i in active if gains[i] == top])


_SCHEDULERS = {"gradient": GradientScheduler, "round-robin": RoundRobinScheduler}


def scheduler_names() -> list[str]:
    """The task scheduler names ``make_scheduler`` accepts."""
    return sorted(_SCHEDULERS)


def make_scheduler(name: str | TaskScheduler, seed: int = 1) -> TaskScheduler:
    """A scheduler by name ("gradient", "round-robin"), or the given instance."""
    if isinstance(name, TaskScheduler):
        return name
    if name == "gradient":
        return GradientScheduler(seed=seed)
    if name in _SCHEDULERS:
        return _SCHEDULERS[name]()
    raise RelaxTuneError(f"unknown task scheduler {name!r}: use one of {sorted(_SCHEDULERS)}")
