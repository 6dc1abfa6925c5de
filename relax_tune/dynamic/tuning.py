"""The tuning session's dynamic-shape hooks (``relax_tune.tuning.hooks``).

The tuning loop knows nothing of dynamic shapes; ``dynamic_hooks`` gives it what a session
with symbolic functions' buckets needs: a screen that records a bucket's candidates that do
not replay on the symbolic function as failed without building them (``ApplyDatabase``
could never run them), and after the search the dispatch ranking (``rank``, opt-in) and
the dispatch plan (``plan``), each with its share of ``max_time``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..tuning.hooks import Session, SessionHook
from .replay import replay_symbolic

if TYPE_CHECKING:
    from ..config import TuneConfig
    from ..search import Candidate
    from ..tuning.extract import Task
    from ..work_dir import WorkDir

logger = logging.getLogger(__name__)

RANKING_SHARE = 0.2
"""Share of ``max_time`` kept for ranking the dynamic-shape buckets' records as dispatched
(``rank``), when there are such buckets."""

PLAN_SHARE = 0.2
"""Share of ``max_time`` kept for measuring the dynamic-shape dispatch (``plan``), when
there are such buckets."""


def dynamic_hooks(tasks: Sequence["Task"], config: "TuneConfig",
                  work_dir: "WorkDir | None") -> list[SessionHook]:
    """The hooks a session of ``tasks`` needs for its dynamic-shape buckets (none without
    such buckets): the replay screen; the dispatch ranking when ``config.dispatch_ranking``
    is above 0, and the dispatch plan when ``config.dispatch_plan`` is on, both only with a
    ``work_dir`` (they keep their results there). In the order they must run."""
    if not any(t.symbolic is not None for t in tasks):
        return []
    hooks: list[SessionHook] = [SymbolicScreen()]
    if work_dir is not None and config.dispatch_ranking > 0:
        hooks.append(DispatchRanking(config.dispatch_ranking))
    if work_dir is not None and config.dispatch_plan:
        hooks.append(DispatchPlan())
    return hooks


class SymbolicScreen(SessionHook):
    """A bucket of a symbolic function builds only the candidates whose schedule replays on
    the symbolic function (what ``ApplyDatabase`` will run)."""

    def screen(self, task: "Task", cands: list["Candidate"]
               ) -> tuple[list["Candidate"], list[tuple["Candidate", str]]]:
        """Split the candidates of ``task`` into those that replay on its symbolic function
        and those that do not, with why (every candidate of a static task is kept)."""
        if task.symbolic is None:
            return cands, []
        usable, unusable = [], []
        for cand in cands:
            if cand is None:  # the untuned function
                usable.append(cand)
                continue
            try:
                replay_symbolic(task.symbolic, cand.trace_json, task.shape, full_tiles=False)
                usable.append(cand)
            except Exception as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                unusable.append((cand, f"does not replay on the symbolic function: "
                                       f"{type(err).__name__} {first}"))
        return usable, unusable


class DispatchRanking(SessionHook):
    """After the search, each bucket's ``per_bucket`` fastest records timed again as
    ``ApplyDatabase`` runs them, into the work_dir (``rank.rank_buckets``)."""

    time_share = RANKING_SHARE

    def __init__(self, per_bucket: int) -> None:
        self.per_bucket = per_bucket

    def after_search(self, session: Session, deadline: float | None) -> None:
        """Rank the buckets' records as dispatched; a failure there is logged and leaves the
        records as they are."""
        from .rank import rank_buckets

        try:
            rank_buckets(session.tasks, session.db, session.measurer, session.work_dir,
                         self.per_bucket, deadline)
        except Exception:  # the records are written already; ApplyDatabase falls back on them
            logger.exception("ranking the dynamic-shape buckets' records failed; each bucket "
                             "runs its fastest static record")


class DispatchPlan(SessionHook):
    """After the search (and the ranking), which bucket serves which sizes, measured into
    the work_dir (``plan.plan_dispatch``)."""

    time_share = PLAN_SHARE

    def after_search(self, session: Session, deadline: float | None) -> None:
        """Measure the dispatch; a failure there is logged and leaves each size to its
        nearest bucket."""
        from .plan import plan_dispatch

        try:
            plan_dispatch(session.tasks, session.db, session.measurer, session.work_dir,
                          deadline)
        except Exception:  # the records are written already; ApplyDatabase falls back on them
            logger.exception("measuring the dynamic-shape dispatch failed; each size runs its "
                             "nearest bucket's kernel")
