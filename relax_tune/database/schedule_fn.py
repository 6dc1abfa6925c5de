"""ScheduleFnDatabase: a hand-written schedule function posing as a database."""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from ..utils import RelaxTuneError
from .base import Database
from .records import TuningRecord, Workload

logger = logging.getLogger("relax_tune.database")


class ScheduleFnDatabase(Database):
    """Answers queries by running ``schedule_fn`` on a fresh Schedule of the query's module.

    ``schedule_fn(sch) -> bool`` schedules ``sch`` in place and returns True when it handled
    the workload (False: no record). As in MetaSchedule, the schedule's module carries a
    ``task_name`` attribute with the query's ``workload_name``. An exception in ``schedule_fn``
    is logged and counts as no record. It stores nothing: reads are empty, commits are refused.
    """

    def __init__(self, schedule_fn: Callable[[Schedule], bool],
                 module_equality: str = "structural") -> None:
        super().__init__(module_equality)
        if not callable(schedule_fn):
            raise RelaxTuneError(f"schedule_fn must be callable, not {schedule_fn!r}")
        self.schedule_fn = schedule_fn

    def __repr__(self) -> str:
        return f"ScheduleFnDatabase({getattr(self.schedule_fn, '__name__', self.schedule_fn)})"

    def _schedule(self, mod: tvm.IRModule, workload_name: str) -> Schedule | None:
        sch = Schedule(mod.with_attr("task_name", workload_name))
        try:
            handled = self.schedule_fn(sch)
        except Exception as err:  # a user callback must not break a compilation
            logger.warning("schedule function %s failed on workload %r: %s: %s",
                           getattr(self.schedule_fn, "__name__", self.schedule_fn),
                           workload_name, type(err).__name__, err)
            return None
        return sch if handled else None

    def _answer(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                replay: bool, raw: tvm.IRModule | None = None,
                ) -> tuple[TuningRecord, Schedule | None] | None:
        """``schedule_fn``'s schedule of the normalised ``mod`` and a record of its trace (no
        run times: in a UnionDatabase any measured record beats it), or None."""
        sch = self._schedule(mod, workload_name)
        if sch is None:
            return None
        return TuningRecord(sch.trace, Workload(mod), None, target, None), sch

    def has_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> bool:
        """Always False: nothing is stored."""
        return False

    def commit_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> Workload:
        """Refused: nothing is stored."""
        raise RelaxTuneError("ScheduleFnDatabase stores nothing: commit to a JSONDatabase or "
                             "MemoryDatabase")

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Refused: nothing is stored."""
        raise RelaxTuneError("ScheduleFnDatabase stores nothing: commit to a JSONDatabase or "
                             "MemoryDatabase")

    def get_top_k(self, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
        """Always empty: nothing is stored."""
        return []

    def get_records(self, workload: Workload) -> list[TuningRecord]:
        """Always empty: nothing is stored."""
        return []

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Always empty: nothing is stored."""
        return []

    def __len__(self) -> int:
        """Always 0: nothing is stored."""
        return 0
