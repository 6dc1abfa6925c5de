"""Wires the parts together: tasks -> search -> build -> run -> database.

``tune_tasks`` is the engine loop; ``tune_tir`` and ``tune_relax`` are the script-level
entry points that extract tasks first and return the database.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
from tvm.s_tir import analysis as s_analysis

from .database import Database, JSONDatabase, TuningRecord
from .extract import ExtractedTask, extract_tasks
from .measure import LocalBuilder, LocalRunner
from .search import Candidate, SearchContext, candidate_key, make_search
from .utils import FAILED_RUN_SECS, RelaxTuneError, args_info, parse_target

logger = logging.getLogger("relax_tune.tune")

BASELINE_TRACE: list = [[], []]
"""The empty trace: the function as it was before tuning (the task's baseline record)."""
BASELINE_KEY = candidate_key(BASELINE_TRACE)

_BASELINE_MAX_SECS = 1.0
"""A function slower than this per call is timed once, not repeatedly."""


@dataclass
class TaskReport:
    """What tuning one task produced (also what the demo and the tuning table print)."""

    task_name: str
    weight: int
    flops: float
    trials: int = 0
    failures: int = 0
    best_secs: float | None = None
    baseline_secs: float | None = None
    exhausted: bool = False
    new_trials: int = 0

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

    @property
    def gflops(self) -> float | None:
        """Throughput of the best schedule in GFLOP/s."""
        return self.flops / self.best_secs / 1e9 if self.best_secs and self.flops else None


@dataclass
class _TaskState:
    task: ExtractedTask
    report: TaskReport
    workload: object
    search: object
    measured: set[str] = field(default_factory=set)
    done: bool = False


def _flops(mod: tvm.IRModule) -> float:
    try:
        return float(s_analysis.estimate_tir_flops(mod))
    except Exception:  # estimate_tir_flops rejects some opaque functions; FLOPs are only for display
        return 0.0


def open_database(work_dir: str | None, database: Database | None) -> Database:
    """The database to use: the one given, the current ``with db:`` one, or work_dir's JSON files."""
    if database is not None:
        return database
    if work_dir is None:
        current = Database.current()
        if current is not None:
            return current
        raise RelaxTuneError("give work_dir=... (where tuning records are kept) or database=...")
    return JSONDatabase(work_dir=work_dir)


def tune_tasks(
    tasks: Sequence[ExtractedTask],
    work_dir: str | None = None,
    max_trials_global: int = 64,
    max_trials_per_task: int | None = None,
    *,
    database: Database | None = None,
    num_trials_per_iter: int = 16,
    builder: LocalBuilder | None = None,
    runner: LocalRunner | None = None,
    strategy: str = "replay",
    cost_model=None,
    seed: int = 1,
    measure_baseline: bool = True,
) -> list[TaskReport]:
    """Tune ``tasks`` and commit every measured candidate to the database.

    The budget is shared: tasks take turns (round robin) drawing ``num_trials_per_iter``
    candidates until ``max_trials_global`` trials are spent, each task stopping at
    ``max_trials_per_task`` or when its space is exhausted. Records already in the database
    count against the budgets and are never measured again, so running twice with the same
    work_dir resumes instead of starting over. Each task's untuned function is timed once
    and recorded as its baseline (an empty trace), which is not counted as a trial.
    A candidate that fails to build or run is recorded with run_secs [1e10]; it never
    stops tuning. ``strategy`` names a search (``relax_tune.search.search_names()``);
    ``cost_model`` is handed to every task's search through its ``SearchContext``.

    Returns one ``TaskReport`` per task, in the order given.
    """
    if max_trials_global < 0 or (max_trials_per_task is not None and max_trials_per_task < 0):
        raise RelaxTuneError("trial budgets must be >= 0")
    db = open_database(work_dir, database)
    per_task = max_trials_global if max_trials_per_task is None else max_trials_per_task
    own_builder, own_runner = builder is None, runner is None
    builder = builder or LocalBuilder()
    runner = runner or LocalRunner()
    states = [_init_state(i, task, db, strategy, seed, cost_model)
              for i, task in enumerate(tasks)]
    try:
        if measure_baseline:
            for st in states:
                if BASELINE_KEY not in st.measured:
                    _measure(st, [None], db, builder, runner)
        remaining = max_trials_global - sum(st.report.trials for st in states)
        start = time.perf_counter()
        while remaining > 0:
            active = [st for st in states if not st.done and st.report.trials < per_task]
            if not active:
                break
            for st in active:
                n = min(num_trials_per_iter, per_task - st.report.trials, remaining)
                if n <= 0:
                    continue
                cands = st.search.next_candidates(n, exclude=st.measured)
                if not cands:
                    st.done = st.report.exhausted = True
                    logger.info("%s: design space exhausted after %d trials",
                                st.report.task_name, st.report.trials)
                    continue
                for cand in cands:  # the search module may reuse keys it already gave; be safe
                    st.measured.add(cand.key)
                _measure(st, cands, db, builder, runner)
                remaining -= len(cands)
                _log_progress(st.report, max_trials_global - remaining, max_trials_global, start)
                if remaining <= 0:
                    break
    finally:
        if own_builder:
            builder.shutdown()
        if own_runner:
            runner.shutdown()
    return [st.report for st in states]


def _init_state(index: int, task: ExtractedTask, db: Database, strategy: str,
                seed: int, cost_model=None) -> _TaskState:
    workload = db.commit_workload(task.mod)
    records = db.get_records(workload)
    measured = {candidate_key(r.trace_json) for r in records}
    report = TaskReport(task.task_name, task.weight, _flops(task.mod))
    for rec in records:
        key = candidate_key(rec.trace_json)
        if key == BASELINE_KEY:
            if rec.is_valid:
                report.baseline_secs = rec.mean_run_secs
            continue
        report.trials += 1
        if rec.is_valid:
            if report.best_secs is None or rec.mean_run_secs < report.best_secs:
                report.best_secs = rec.mean_run_secs
        else:
            report.failures += 1
    task_seed = (seed * 1_000_003 + index * 7919) % (2**31 - 2) + 1
    warm = sorted(records, key=lambda r: r.mean_run_secs)
    search = make_search(strategy, task.mod, task.target, seed=task_seed,
                         context=SearchContext(cost_model=cost_model, records=warm,
                                               task_name=task.task_name))
    return _TaskState(task, report, workload, search, measured)


def _measure(st: _TaskState, cands: list[Candidate | None], db: Database,
             builder: LocalBuilder, runner: LocalRunner) -> None:
    """Build, run and commit one batch of one task (None: the untuned function); update its
    report and tell the search how its candidates did."""
    task, report = st.task, st.report
    info = args_info(task.mod)
    traces = [None if c is None else c.trace_json for c in cands]
    builds = builder.build(task.mod, task.target, traces)
    best = report.best_secs or report.baseline_secs
    # Cut losses on hopeless candidates: time them once when one call takes over twice the best
    # (or past a second: such a kernel is timed well enough by one call).
    max_secs = _BASELINE_MAX_SECS if best is None else min(max(2 * best, 1e-3),
                                                           _BASELINE_MAX_SECS)
    runs = runner.run([b.artifact_path for b in builds], info, task.target, max_secs=max_secs)
    measured_cands, measured_secs = [], []
    for cand, trace, build, run in zip(cands, traces, builds, runs):
        ok = build.error is None and run.error is None and run.run_secs
        run_secs = [float(x) for x in run.run_secs] if ok else [FAILED_RUN_SECS]
        if not ok:
            logger.debug("%s: candidate failed: %s", report.task_name, build.error or run.error)
        db.commit_tuning_record(TuningRecord(
            trace_json=BASELINE_TRACE if trace is None else trace, workload=st.workload,
            run_secs=run_secs, target=task.target, args_info=info))
        mean = sum(run_secs) / len(run_secs)
        if trace is None:
            st.measured.add(BASELINE_KEY)
            report.baseline_secs = mean if ok else None
            continue
        measured_cands.append(cand)
        measured_secs.append(mean)
        report.trials += 1
        report.new_trials += 1
        if not ok:
            report.failures += 1
        elif report.best_secs is None or mean < report.best_secs:
            report.best_secs = mean
    if measured_cands:
        st.search.update(measured_cands, measured_secs)


def _log_progress(report: TaskReport, done: int, total: int, start: float) -> None:
    elapsed = time.perf_counter() - start
    best = f"{report.best_secs * 1e3:.4f} ms" if report.best_secs else "n/a"
    logger.info("[%d/%d trials, %.0f s] %s: %d trials, best %s, %d failed",
                done, total, elapsed, report.task_name, report.trials, best, report.failures)


def tune_tir(
    mod: tvm.IRModule | tvm.tirx.PrimFunc,
    target=None,
    work_dir: str | None = None,
    max_trials_global: int = 64,
    max_trials_per_task: int | None = None,
    op_names: Sequence[str] | None = None,
    **kwargs,
) -> Database:
    """Tune every PrimFunc of a TIR module (or one PrimFunc) with one shared budget.

    Returns the database the records were written to (``JSONDatabase(work_dir)``).
    Extra keyword arguments go to ``tune_tasks``.
    """
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    target = parse_target(target)
    tasks = extract_tasks(mod, target, op_names=op_names)
    db = open_database(work_dir, kwargs.pop("database", None))
    tune_tasks(tasks, max_trials_global=max_trials_global, max_trials_per_task=max_trials_per_task,
               database=db, **kwargs)
    return db


def tune_relax(
    mod: tvm.IRModule,
    params: dict | None,
    target=None,
    work_dir: str | None = None,
    max_trials_global: int = 64,
    max_trials_per_task: int | None = None,
    op_names: Sequence[str] | None = None,
    **kwargs,
) -> Database:
    """Tune the TIR functions called from a legalized Relax module (see ``extract_tasks``).

    Returns the database the records were written to. Extra keyword arguments go to
    ``tune_tasks``.
    """
    target = parse_target(target)
    tasks = extract_tasks(mod, target, op_names=op_names, params=params)
    db = open_database(work_dir, kwargs.pop("database", None))
    tune_tasks(tasks, max_trials_global=max_trials_global, max_trials_per_task=max_trials_per_task,
               database=db, **kwargs)
    return db


def geomean_speedup(reports: Sequence[TaskReport]) -> float | None:
    """Geometric mean of the per-task speedups over the untuned functions."""
    ups = [r.speedup for r in reports if r.speedup]
    return math.exp(sum(math.log(u) for u in ups) / len(ups)) if ups else None
