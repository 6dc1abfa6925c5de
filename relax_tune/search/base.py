"""What every search strategy shares: the candidate value object, its key, the base class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm.s_tir import Schedule

from ..utils import schedule_from_json


class Candidate:
    """One scheduled candidate, ready to build.

    Attributes:
        trace_json: ``utils.trace_to_json(sch.trace)``: replayable with
            ``utils.schedule_from_json`` on the workload, postprocessing included.
        key: ``candidate_key(trace_json)``.
        sch: the scheduled (traced) schedule in this process. A candidate replayed in a
            worker process is given ``mod`` instead, and its schedule is rebuilt from
            ``trace_json`` the first time it is asked for (the tuner never asks: it builds
            from the JSON).
    """

    def __init__(self, sch: Schedule | None = None, trace_json: list | None = None,
                 key: str = "", mod: tvm.IRModule | None = None) -> None:
        if sch is None and mod is None:
            raise ValueError("a Candidate needs its schedule or its workload")
        self._sch = sch
        self._mod = mod
        self.trace_json = trace_json
        self.key = key

    @property
    def sch(self) -> Schedule:
        """The candidate's schedule (rebuilt from ``trace_json`` when it came from a worker)."""
        if self._sch is None:
            self._sch = schedule_from_json(self._mod, self.trace_json)
        return self._sch

    def __repr__(self) -> str:
        return f"Candidate(key={self.key!r})"


@dataclass
class SearchContext:
    """What the tuner shares with a task's search strategy.

    Attributes:
        cost_model: the session's cost model (one per tuning session, shared by all tasks),
            or None for strategies that do not use one.
        records: the task's tuning records already in the database (warm start; failures
            included), best first.
        task_name: the task's name, for logs (the task's when only ``task`` is given).
        task: the task being searched (``relax_tune.tuning.extract.Task``: name, weight, workload),
            or None when a search is used on its own.
        replay_pool: the builder's workers (``LocalBuilder.replay_pool``), which replay
            the search's candidates when idle and started (``replayer.Replayer``); None:
            all in this process.
        pool_secs: seconds the search may spend growing one pool (None: no limit). A
            session with a time limit gives each task a share of it, so that a large
            model's first pools do not take the whole limit before any candidate is built.
        pool_replays: candidates the search may replay growing one pool (None: no limit):
            the no-measurement compile's budget, which gives the same pool in every run.
        transfer: a ``relax_tune.transfer.TransferSource``: the best schedules of alike
            workloads, refitted, join the first pool and lead the first batch (None: none).
    """

    cost_model: Any = None
    records: list = field(default_factory=list)
    task_name: str = ""
    task: Any = None
    replay_pool: Any = None
    pool_secs: float | None = None
    pool_replays: int | None = None
    transfer: Any = None

    def __post_init__(self) -> None:
        if not self.task_name and self.task is not None:
            self.task_name = self.task.task_name


class SearchStrategy:
    """A source of candidates for one task.

    ``next_candidates(n, exclude)`` returns up to ``n`` new candidates, never one returned
    before or whose key is in ``exclude``; fewer (possibly none) when the space is exhausted.
    ``update(candidates, run_secs)`` tells the strategy how measured candidates did (a no-op
    for strategies that do not learn). ``prepare(exclude)`` is called while a batch builds:
    a strategy may do there the work of its next call that needs no measurement.
    """

    name = "base"

    def next_candidates(self, n: int, exclude: set[str] | frozenset[str] = frozenset()
                        ) -> list[Candidate]:
        """Up to ``n`` new valid candidates (see the class docstring)."""
        raise NotImplementedError

    def update(self, candidates: list[Candidate], run_secs: list[float]) -> None:
        """Measured results of earlier candidates (mean seconds; failures as a large value)."""
        return None

    def best_predicted(self, exclude: set[str] | frozenset[str] = frozenset(),
                       accept=None, lookahead: int = 64, fits=None) -> Candidate | None:
        """The candidate the strategy's cost model ranks first, without measuring it (the
        no-measurement compile, ``tuning.predict``), preferring one of its ``lookahead``
        best that passes ``accept``, or a transferred schedule that passes ``fits``; None
        for a strategy without a model."""
        return None

    def prepare(self, exclude: set[str] | frozenset[str] = frozenset()) -> None:
        """Work ahead for the next ``next_candidates`` while a batch builds (default: none)."""
        return None
