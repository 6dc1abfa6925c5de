"""What runs around the search, as hooks the loop calls: the loop itself knows nothing of
dynamic shapes, saved cost models or reports.

A hook may screen a batch before it is built (``screen``: a dynamic-shape bucket drops the
candidates that do not replay on its symbolic function), run after the search with a share
of ``max_time`` kept for it (``after_search``: the dispatch ranking and plan of dynamic
shapes) and run at the end of the session whatever happened (``at_end``: the cost model
saved for the next run). ``tune_tasks`` assembles the hooks of a session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import TuneConfig
    from ..database import Database
    from ..measure import Measurer
    from ..search import Candidate
    from ..work_dir import WorkDir
    from .extract import Task

logger = logging.getLogger(__name__)


@dataclass
class Session:
    """What a hook gets of the session: its tasks, database, measurer, work_dir, options
    and cost model."""

    tasks: Sequence["Task"]
    db: "Database"
    measurer: "Measurer"
    work_dir: "WorkDir | None"
    config: "TuneConfig"
    cost_model: Any = None


class SessionHook:
    """A part of a tuning session outside the search loop; every method is optional."""

    time_share: float = 0.0
    """Share of ``max_time`` kept for ``after_search`` (the search stops earlier by it)."""

    def screen(self, task: "Task", cands: list["Candidate"]
               ) -> tuple[list["Candidate"], list[tuple["Candidate", str]]]:
        """Split a batch of ``task`` into the candidates to build and those to record as
        failed without building, with why."""
        return cands, []

    def after_search(self, session: Session, deadline: float | None) -> None:
        """Run after the search loop, before ``deadline`` (time.monotonic; None: no limit)."""

    def at_end(self, session: Session) -> None:
        """Run when the session ends, also after an error or an interrupt."""


class SaveCostModel(SessionHook):
    """The next run on the work_dir starts from this session's cost model."""

    def at_end(self, session: Session) -> None:
        """Save the cost model into the work_dir; a failure (a full disk) is logged."""
        if session.cost_model is None or session.work_dir is None:
            return
        path = session.work_dir.cost_model_dir
        try:
            session.cost_model.save(path)
        except Exception as err:  # a full disk must not lose the tuning records
            logger.warning("cost model not saved to %s: %s", path, err)


def search_deadline(hooks: Sequence[SessionHook], start: float,
                    max_time: float | None) -> float | None:
    """When the search must stop so that the hooks get their shares of ``max_time``."""
    if max_time is None:
        return None
    return start + max_time * (1 - sum(h.time_share for h in hooks))


def run_after_search(hooks: Sequence[SessionHook], session: Session, start: float,
                     max_time: float | None) -> None:
    """Each hook's ``after_search`` in order, each until the end of its share of
    ``max_time``; a failing hook is logged and the next one runs (the records are written
    already)."""
    kept = sum(h.time_share for h in hooks)
    for hook in hooks:
        kept -= hook.time_share
        deadline = None if max_time is None else start + max_time * (1 - kept)
        try:
            hook.after_search(session, deadline)
        except Exception:
            logger.exception("%s failed after the search; the records stay as they are",
                             type(hook).__name__)


def run_at_end(hooks: Sequence[SessionHook], session: Session) -> None:
    """Each hook's ``at_end``; a failing one is logged and the others still run."""
    for hook in hooks:
        try:
            hook.at_end(session)
        except Exception:
            logger.exception("%s failed at the end of the session", type(hook).__name__)
