"""Schedules chosen without measurement: each task's candidate the cost model ranks first.

A work_dir keeps them apart from its measurements, in a database of their own
(``work_dir/predicted/``, MetaSchedule's two files) whose records have ``run_secs`` null:
chosen, never timed. So nothing that ranks measured records (``ApplyDatabase``'s query, the
reports, ``relax-tune db``, a resumed session's budget) ever counts one as a measurement.
``ApplyDatabase`` uses a task's predicted schedule only where the work_dir has no measured
record of the task; the latest prediction of a workload wins.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from ..utils import normalize_mod
from .base import Database, query_target_config, replay_on, target_compatible
from .records import TuningRecord


class PredictedSchedules:
    """The predicted schedules of one database (see the module doc)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def __len__(self) -> int:
        return len(self.database)

    def add(self, mod: tvm.IRModule, trace_json: list, target: tvm.target.Target,
            args_info: list | None = None) -> None:
        """Record ``trace_json`` as the predicted schedule of the workload ``mod``."""
        workload = self.database.commit_workload(mod)
        self.database.commit_tuning_record(TuningRecord(
            trace_json=trace_json, workload=workload, run_secs=None, target=target,
            args_info=args_info))

    def query_schedule(self, mod: tvm.IRModule | tirx.PrimFunc,
                       target: tvm.target.Target | dict | str | None = None
                       ) -> Schedule | None:
        """The latest predicted schedule of ``mod`` for ``target`` replayed on it, or None."""
        for record, matched in self._latest_first(mod, target):
            sch = replay_on(record, matched)
            if sch is not None:
                return sch
        return None

    def query_tuning_record(self, mod: tvm.IRModule | tirx.PrimFunc,
                            target: tvm.target.Target | dict | str | None = None
                            ) -> TuningRecord | None:
        """The latest predicted record of ``mod`` for ``target``, or None (as a database's
        best record: what ``relax_tune.dynamic.apply`` reads for each bucket)."""
        return next((record for record, _ in self._latest_first(mod, target)), None)

    def has_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> bool:
        """False: a predicted schedule has no ranked alternatives (one record counts)."""
        return False

    def _latest_first(self, mod, target):
        raw = mod if isinstance(mod, tvm.IRModule) else tvm.IRModule({"main": mod})
        found = self.database._find_workload(normalize_mod(mod), raw)
        if found is None:
            return
        workload, matched = found
        config = query_target_config(target)
        for record in reversed(self.database.get_records(workload)):
            if target_compatible(record.target_config, config):
                yield record, matched
