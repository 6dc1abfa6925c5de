"""The whole model against the sum of its tasks, both timed in the same moments.

The tuning database's times were taken while the session ran, minutes before the whole
model is timed, and this machine's speed moves by tens of percent within minutes (one
300 s ResNet-18 ran 20.3 ms in one process and 28.4 ms in the benchmark's rounds an hour
apart, AMD EPYC Zen 3). A quotient of the two says as much about the machine as about the
model. Here each task's applied schedule (the work_dir's measured best, as ``ApplyDatabase``
takes it, else its predicted schedule, else the untuned function) is built and timed alone
by the tuner's own builder and runner, in rounds interleaved with calls of the whole model;
a round's quotient is the whole model's time over the sum of its tasks' (weight x time),
and the figure is the median of the rounds' quotients.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.contenders import Row, time_once


@dataclass
class TaskSum:
    """Rounds of the whole model and of the sum of its tasks timed alone."""

    whole: list[float]
    sums: list[float]
    tasks: int
    per_task: dict[str, list[float]]

    @property
    def ratio(self) -> float:
        """Median over rounds of the whole model's time over the sum of its tasks'."""
        return statistics.median(w / s for w, s in zip(self.whole, self.sums))


def applied_trace(db, predicted, task, target) -> list | None:
    """The plain-JSON trace of the schedule the pipeline applies to ``task`` from a
    work_dir's database ``db`` (measured), else from its ``predicted`` schedules (None when
    it has none); None: the untuned function."""
    from relax_tune.utils import trace_to_json

    sch = db.query_schedule(task.mod, target, "main")
    if sch is None and predicted is not None:
        sch = predicted.query_schedule(task.mod, target)
    return None if sch is None else trace_to_json(sch.trace)


def time_task_sum(row: Row, work_dir: str, tasks, target, rounds: int = 3) -> TaskSum:
    """``rounds`` rounds of: the whole model (``row``, one ``time_once``), then every task's
    applied schedule alone (built once; timed by a ``LocalRunner`` as in tuning)."""
    from relax_tune.measure import LocalBuilder, LocalRunner
    from relax_tune.work_dir import WorkDir

    wd = WorkDir.of(work_dir)
    db, predicted = wd.open_for_apply(), wd.open_predicted()  # read once, not per task
    builder, runner = LocalBuilder(), LocalRunner()
    try:
        built = []
        for task in tasks:
            trace = applied_trace(db, predicted, task, target)
            (result,) = builder.build(task.mod, target, [trace])
            if result.ok:
                built.append((task, result.artifact_path))
        out = TaskSum([], [], len(built), {t.task_name: [] for t, _ in built})
        for _ in range(rounds):
            out.whole.append(time_once(row))
            total = 0.0
            for task, artifact in built:
                (res,) = runner.run([artifact], task.args_info, target)
                secs = statistics.median(res.run_secs) if res.ok else float("nan")
                out.per_task[task.task_name].append(secs)
                total += task.weight * secs
            out.sums.append(total)
        return out
    finally:
        builder.shutdown()
        runner.shutdown()
