"""What a tuning session keeps per task: ``TaskReport`` (what tuning the task produced, for
the caller and the tuning table) and ``TaskState`` (the report plus the scheduler's view,
the task's search and the measurement protocol's state), made from the records already in
the database (``init_state``) and updated from every measured batch (``commit``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..database import BASELINE_TRACE, Database, TuningRecord, candidate_key, is_baseline
from ..database.records import measured_run_secs
from ..measure import Measured
from ..measure.measurer import Incumbent
from ..search import Candidate, SearchContext, SearchStrategy, make_search
from .extract import Task
from .scheduler import TaskProgress

BASELINE_KEY = candidate_key(BASELINE_TRACE)
"""The candidate key of the baseline record (``database.BASELINE_TRACE``)."""


class AppliedLatency:
    """What ApplyDatabase will run for a task, from its ``best_secs`` (best tuned schedule)
    and ``baseline_secs`` (untuned function); shared by ``TaskReport`` (a session's task)
    and ``report.WorkloadSummary`` (a work_dir's workload)."""

    best_secs: float | None
    baseline_secs: float | None

    @property
    def applied_secs(self) -> float | None:
        """Time of what ApplyDatabase will use: the best tuned schedule, or the untuned
        function when no tuned schedule beats it."""
        known = [x for x in (self.best_secs, self.baseline_secs) if x]
        return min(known) if known else None

    @property
    def tuned_applied(self) -> bool:
        """True when a tuned schedule beats the untuned function (or no baseline is known)."""
        return bool(self.best_secs) and (not self.baseline_secs
                                         or self.best_secs <= self.baseline_secs)

    @property
    def speedup(self) -> float | None:
        """Untuned time over the applied time (>= 1: the untuned function is kept otherwise)."""
        if self.applied_secs and self.baseline_secs:
            return self.baseline_secs / self.applied_secs
        return None


@dataclass
class TaskReport(AppliedLatency):
    """What tuning one task produced (also what the demo and the tuning table print).

    ``task`` is the extracted ``Task`` itself; ``task_name``, ``weight`` and ``flops`` are
    read from it."""

    task: Task = field(repr=False)
    trials: int = 0
    failures: int = 0
    best_secs: float | None = None
    baseline_secs: float | None = None
    new_trials: int = 0
    status: str = "tuning"
    """Why the task stopped: budget, converged, exhausted, too cheap, time, stopped; with
    nothing measured (``measure=False``): predicted or untuned; ``twin`` for a task that
    differs from an earlier one only in its constants and takes that one's schedule
    (``tuning.twins``)."""
    predicted: bool = False
    """The task has a predicted schedule (``tuning.predict``), used where nothing of it was
    measured."""

    @property
    def task_name(self) -> str:
        """The task's name."""
        return self.task.task_name

    @property
    def weight(self) -> int:
        """The task's call sites in the model."""
        return self.task.weight

    @property
    def flops(self) -> float:
        """Estimated FLOPs of one call of the task's workload."""
        return self.task.flops

    @property
    def gflops(self) -> float | None:
        """Throughput of the best schedule in GFLOP/s."""
        return self.flops / self.best_secs / 1e9 if self.best_secs and self.flops else None

    def __repr__(self) -> str:
        return (f"TaskReport(task_name={self.task_name!r}, weight={self.weight}, "
                f"trials={self.trials}, failures={self.failures}, best_secs={self.best_secs}, "
                f"baseline_secs={self.baseline_secs}, new_trials={self.new_trials}, "
                f"status={self.status!r})")


@dataclass
class TaskState:
    """Everything a session keeps of one task, around the one ``Task`` object: its report
    (which carries the task), the scheduler's view, its search (whose context carries the
    task) and the measurement protocol's state."""

    task: Task
    report: TaskReport
    workload: object
    search: SearchStrategy
    measured: set[str] = field(default_factory=set)
    """Keys of the candidates in the database (the baseline's is ``BASELINE_KEY``)."""
    progress: TaskProgress = None  # type: ignore[assignment]
    incumbent: Incumbent = field(default_factory=Incumbent)
    """What the measurement protocol keeps of the task between batches."""
    best_history: list[float] = field(default_factory=list)
    """Best latency after each trial measured in this run (inf until one is valid)."""


def init_state(index: int, task: Task, db: Database, strategy: str, seed: int,
               cost_model=None, replay_pool=None, pool_secs: float | None = None,
               transfer=None, pool_replays: int | None = None) -> TaskState:
    """The state of task number ``index`` from the records already in ``db`` (they count
    as trials and are never measured again), with its search seeded per task and given
    ``pool_secs`` and ``pool_replays`` per pool (``SearchContext``) and the schedules of
    alike workloads from ``transfer`` (``SearchContext.transfer``)."""
    workload = db.commit_workload(task.mod)
    records = db.get_records(workload)
    measured = {candidate_key(r.trace_json) for r in records}
    report = TaskReport(task)
    best_trace = None
    for rec in records:
        if is_baseline(rec):
            if rec.is_valid:
                report.baseline_secs = rec.mean_run_secs
            continue
        report.trials += 1
        if rec.is_valid:
            if report.best_secs is None or rec.mean_run_secs < report.best_secs:
                report.best_secs = rec.mean_run_secs
                best_trace = rec.trace_json
        else:
            report.failures += 1
    task_seed = (seed * 1_000_003 + index * 7919) % (2**31 - 2) + 1
    warm = sorted(records, key=lambda r: r.mean_run_secs)
    search = make_search(strategy, task.mod, task.target, seed=task_seed,
                         context=SearchContext(cost_model=cost_model, records=warm, task=task,
                                               replay_pool=replay_pool, pool_secs=pool_secs,
                                               pool_replays=pool_replays, transfer=transfer))
    return TaskState(task, report, workload, search, measured,
                     progress=TaskProgress(weight=task.weight, importance=1.0),
                     incumbent=Incumbent(trace=best_trace))


def commit(st: TaskState, cands: list[Candidate | None], batch: list[Measured],
           db: Database) -> None:
    """One record per measured candidate (None: the task's baseline) into ``db``; the
    report updated and the search told how its candidates did."""
    task, report = st.task, st.report
    measured_cands, measured_secs = [], []
    for cand, m in zip(cands, batch):
        db.commit_tuning_record(TuningRecord(
            trace_json=BASELINE_TRACE if m.trace is None else m.trace, workload=st.workload,
            run_secs=measured_run_secs(m.run_secs), target=task.target,
            args_info=task.args_info))
        mean = m.mean_secs
        if m.trace is None:
            st.measured.add(BASELINE_KEY)
            report.baseline_secs = mean if m.ok else None
            continue
        measured_cands.append(cand)
        measured_secs.append(mean)
        report.trials += 1
        report.new_trials += 1
        if not m.ok:
            report.failures += 1
        elif report.best_secs is None or mean < report.best_secs:
            report.best_secs = mean
        st.best_history.append(report.best_secs or float("inf"))
    if measured_cands:
        st.search.update(measured_cands, measured_secs)
