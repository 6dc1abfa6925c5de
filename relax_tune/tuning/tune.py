"""Wires the parts together: tasks -> search -> build -> run -> database.

``tune_tasks`` is the engine loop: it picks a task, asks its search for a batch, hands the
batch to the ``Measurer`` (``relax_tune.measure.measurer``: how candidates are built, timed,
checked and re-timed is decided there) and commits what comes back. ``tune_tir`` and
``tune_relax`` are the script-level entry points that extract tasks first and return the
database. What a person reads of a session -- ``TaskReport`` per task, the tuning table --
is ``relax_tune.report``'s; the bar and the log are ``relax_tune.progress``'s.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm

from ..config import TuneConfig, make_config
from ..cost_model import make_cost_model
from ..database import BASELINE_TRACE, Database, TuningRecord, is_baseline
from .extract import Task, extract_tasks
from ..measure import BuildResult, LocalBuilder, LocalRunner, Measured, Measurer, RunResult
from ..measure.measurer import Incumbent
from .progress import Progress
from ..report import TaskReport
from .scheduler import TaskProgress, make_scheduler
from ..search import Candidate, SearchContext, SearchStrategy, candidate_key, make_search
from ..utils import parse_target
from ..work_dir import check_work_dir, cost_model_dir, logs_dir, open_database, write_task_meta

logger = logging.getLogger(__name__)

BASELINE_KEY = candidate_key(BASELINE_TRACE)
"""The candidate key of the baseline record (``database.BASELINE_TRACE``)."""

RANKING_SHARE = 0.2
"""Share of ``max_time`` kept for ranking the dynamic-shape buckets' records as dispatched
(``dispatch_rank``), when there are such buckets."""

PLAN_SHARE = 0.2
"""Share of ``max_time`` kept for measuring the dynamic-shape dispatch (``dispatch_plan``),
when there are such buckets."""

__all__ = ["BASELINE_KEY", "TaskReport", "tune_relax", "tune_tasks", "tune_tir"]


@dataclass
class _TaskState:
    """Everything this session keeps of one task, around the one ``Task`` object: its
    report (which carries the task), the scheduler's view, its search (whose context carries
    the task) and the measurement protocol's state."""

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


def tune_tasks(tasks: Sequence[Task], work_dir: str | None = None,
               config: TuneConfig | None = None, *, database: Database | None = None,
               **options) -> list[TaskReport]:
    """Tune ``tasks`` and commit every measured candidate to the database.

    The session is described by ``config`` (a ``TuneConfig``) with ``options`` (any of its
    fields, e.g. ``max_trials_global=64``) replacing its values; an unknown or ill-typed
    option raises ``RelaxTuneError`` before anything runs. ``work_dir`` holds the session's
    database, cost model, logs and task names (``relax_tune.work_dir``); ``database``
    replaces its database files only.

    Budgets: ``max_trials_global`` trials shared by all tasks, at most
    ``max_trials_per_task`` each, batches of ``num_trials_per_iter``, and an optional
    wall-clock limit ``max_time`` (seconds; the batch in flight finishes). The
    ``task_scheduler`` ("gradient" or "round-robin") picks the task of each batch; every
    task gets its first batch before any task gets a second, most important first (share
    of the untuned model time; of the model's time at its own size for a dynamic-shape
    bucket), with the first round split evenly when the budget is small.
    After its first batch a task is judged by what it costs in the tuned model (weight x
    its best latency, re-estimated after every batch): below ``min_task_share`` of the
    model's estimated tuned time it waits at its best ("too cheap"), and gets trials again
    if the others' tuning raises its share. A task stops when its space is exhausted or
    when its best did not improve by 1% over its last ``convergence_window`` trials; its
    budget flows to the others.

    Resumption: records already in the database count against the budgets and are never
    measured again, so running twice with the same work_dir resumes instead of starting
    over. Each task's baseline is timed once and recorded (an empty trace), which is not
    counted as a trial: the untuned function, or on a GPU the target's default schedule
    (``relax_tune.measure.baseline``). A candidate that fails to build or run is
    recorded with run_secs [1e10]; it never stops tuning. ``strategy`` names a search
    (``relax_tune.search.search_names()``); ``cost_model`` ("xgb-prior", "xgb", "random",
    "none" or a CostModel; loaded from and saved to work_dir/cost_model) is handed to every task's
    search through its ``SearchContext``. Progress: a bar and a tuning table on a terminal
    (``progress_bar`` forces it on or off), the full log in ``work_dir/logs/tune.log``.

    Correctness (``check_correctness``, on by default): a candidate about to become its
    task's best is run once more on seeded inputs and compared with the task's baseline;
    a wrong one is recorded as failed ([1e10], never applied) and the next fastest is
    checked (``relax_tune.measure.verify``). The final best of every task has passed it.

    Head-to-head (``head_to_head_rounds``; 0 turns it off): a candidate that would become
    its task's best by less than 1.5x is timed again alternately with a reference kernel of
    the task (an earlier best), that many rounds, and recorded as the reference's time times
    the per-round ratios (``relax_tune.measure.head_to_head``). On a machine whose speed
    drifts, the best would otherwise be the candidate measured in the fastest moment, not
    the fastest candidate. The whole measurement protocol (these two, the early cut of slow
    candidates, the baseline's timing) is ``relax_tune.measure.measurer.Measurer``.

    Dynamic shapes (``dispatch_ranking``, with a work_dir): after the search, each bucket's
    few fastest records are timed again as ``ApplyDatabase`` runs them, replayed on the
    symbolic function, and the fastest there is the one applied
    (``relax_tune.dispatch_rank``); with ``max_time``, the last ``RANKING_SHARE`` of it is
    kept for that. Then (``dispatch_plan``, on by default) each dynamic-shape function's
    bucket kernels are timed at and between the hinted sizes, and each size goes to the one
    clearly fastest there (``relax_tune.dispatch_plan``); ``PLAN_SHARE`` of ``max_time``
    is kept for it.

    Returns one ``TaskReport`` per task, in the order given.
    """
    cfg = make_config(config, **options)
    if work_dir is not None:
        work_dir = check_work_dir(work_dir)
    db = open_database(work_dir, database)
    if work_dir is not None and tasks:
        write_task_meta(work_dir, tasks)
    scheduler = make_scheduler(cfg.task_scheduler, cfg.seed)
    per_task = cfg.per_task_budget
    runner = cfg.runner or LocalRunner()
    for kind_target in {t.target.kind.name: t.target for t in tasks}.values():
        runner.check_target(kind_target)  # e.g. cuda without a GPU: stop before any work
    builder = cfg.builder or LocalBuilder()  # after the check: it makes a temporary folder
    measurer = Measurer(builder, runner, cfg.check_correctness, cfg.head_to_head_rounds)
    model = make_cost_model(cfg.cost_model, work_dir)  # a name, or a CostModel passed through
    # the searches replay candidates in the builder's workers too while those idle
    replay_pool = _pool_of(builder)
    states = [_init_state(i, task, db, cfg.strategy, cfg.seed, model, replay_pool)
              for i, task in enumerate(tasks)]
    remaining = max(0, cfg.max_trials_global - sum(st.report.trials for st in states))
    progress = Progress(remaining, logs_dir(work_dir) if work_dir else None,
                        enable_bar=cfg.progress_bar)
    start = time.monotonic()
    dynamic_tasks = work_dir is not None and any(t.symbolic is not None for t in tasks)
    ranking = cfg.dispatch_ranking if dynamic_tasks else 0  # they keep their results there
    ranks = ranking > 0
    plans = cfg.dispatch_plan and dynamic_tasks
    kept = (RANKING_SHARE if ranks else 0) + (PLAN_SHARE if plans else 0)
    deadline = None if cfg.max_time is None else start + cfg.max_time * (1 - kept)
    if remaining > 0 and any(st.report.trials < per_task for st in states):
        measurer.start()  # worker start-up overlaps the first build
    try:
        if cfg.measure_baseline and remaining > 0:
            missing = [st for st in states if BASELINE_KEY not in st.measured]
            for i, st in enumerate(missing, 1):
                _measure(st, [None], db, measurer)
                progress.baseline(st.report, i, len(missing))
        _prioritise(states, per_task)
        rounds_since_table = 0
        while remaining > 0:
            if deadline is not None and time.monotonic() >= deadline:
                logger.info("max_time of %.0f s reached%s; stopping the search",
                            cfg.max_time, " (less the share kept for ranking the "
                            "dynamic-shape buckets)" if ranks else "")
                for st in states:
                    if st.progress.active:
                        st.report.status = "time"
                _warn_untried(states, cfg.max_time)
                break
            _judge_shares(states, cfg.min_task_share)
            index = scheduler.next_task([st.progress for st in states])
            if index is None:
                break
            st = states[index]
            n = min(cfg.num_trials_per_iter, per_task - st.report.trials, remaining)
            # tasks still waiting for their first batch, this one included (1 after its first)
            waiting = 1
            if st.progress.rounds == 0:  # a small budget is split over the first round
                waiting = sum(1 for t in states if t.progress.active and t.progress.rounds == 0)
                n = min(n, max(1, remaining // waiting))
            cands = st.search.next_candidates(n, exclude=st.measured)
            if not cands:
                _finish(st, "exhausted")
                continue
            for cand in cands:
                st.measured.add(cand.key)
            _measure(st, cands, db, measurer,
                     prepare=_may_get_another_batch(st, len(cands), remaining, per_task, waiting))
            remaining -= len(cands)
            _after_round(st, per_task, cfg.convergence_window)
            progress.advance(st.report, len(cands))
            rounds_since_table += 1
            if rounds_since_table >= sum(1 for t in states if t.progress.active) > 0:
                progress.table([t.report for t in states])
                rounds_since_table = 0
        if ranks:
            _rank_dispatch(tasks, db, measurer, work_dir, ranking,  # type: ignore[arg-type]
                           None if cfg.max_time is None else
                           start + cfg.max_time * (1 - (PLAN_SHARE if plans else 0)))
        if plans:
            _plan_dispatch(tasks, db, measurer, work_dir,  # type: ignore[arg-type]
                           None if cfg.max_time is None else start + cfg.max_time)
    finally:
        if model is not None and work_dir is not None:
            try:  # the next run on this work_dir starts from this model
                model.save(cost_model_dir(work_dir))
            except Exception as err:  # a full disk must not lose the tuning records
                logger.warning("cost model not saved to %s: %s", cost_model_dir(work_dir), err)
        for st in states:
            if st.report.status == "tuning":
                st.report.status = "budget" if st.report.trials >= per_task else "stopped"
        progress.table([st.report for st in states])
        progress.close()
        if cfg.builder is None:
            builder.shutdown()
        if cfg.runner is None:
            runner.shutdown()
    return [st.report for st in states]


def _rank_dispatch(tasks: Sequence[Task], db: Database, measurer: Measurer, work_dir: str,
                   per_bucket: int, deadline: float | None) -> None:
    """Rank the dynamic-shape buckets' records as dispatched (``dispatch_rank``); a failure
    there is logged and leaves the records as they are."""
    from ..dynamic.rank import rank_buckets

    try:
        rank_buckets(tasks, db, measurer, work_dir, per_bucket, deadline)
    except Exception:  # the records are written already; ApplyDatabase falls back on them
        logger.exception("ranking the dynamic-shape buckets' records failed; each bucket "
                         "runs its fastest static record")


def _plan_dispatch(tasks: Sequence[Task], db: Database, measurer: Measurer, work_dir: str,
                   deadline: float | None) -> None:
    """Measure which bucket serves which sizes (``dispatch_plan``); a failure there is logged
    and leaves each size to its nearest bucket."""
    from ..dynamic.plan import plan_dispatch

    try:
        plan_dispatch(tasks, db, measurer, work_dir, deadline)
    except Exception:  # the records are written already; ApplyDatabase falls back on them
        logger.exception("measuring the dynamic-shape dispatch failed; each size runs its "
                         "nearest bucket's kernel")


def _warn_untried(states: list[_TaskState], max_time: float) -> None:
    """Say which tasks the time limit left without a single measured candidate: they stay
    untuned (e.g. when building and timing the untuned baselines took the whole limit)."""
    untried = [st.report.task_name for st in states if st.report.trials == 0]
    if untried:
        shown = ", ".join(untried[:5]) + (f" and {len(untried) - 5} more"
                                           if len(untried) > 5 else "")
        logger.warning("max_time of %.0f s reached before any candidate of %d of %d tasks "
                       "was measured (%s): they stay untuned; raise max_time or tune fewer "
                       "tasks (op_names)", max_time, len(untried), len(states), shown)


def _prioritise(states: list[_TaskState], per_task: int) -> None:
    """Set each task's importance for the first round (share of the untuned model time, or
    of FLOPs while any baseline is missing, ``_shares``) and leave the tasks at budget
    inactive."""
    measured = all(st.report.baseline_secs for st in states)
    costs = [st.task.weight * (st.report.baseline_secs if measured else st.task.flops)
             for st in states]
    for st, (share, scale) in zip(states, _shares(states, costs)):
        st.progress.importance, st.progress.scale = share, scale
        if st.report.trials >= per_task:
            _finish(st, "budget")


def _shares(states: list[_TaskState], costs: list[float]) -> list[tuple[float, float]]:
    """``(share, scale)`` per task: its share of the model's time at its own size, and 1
    over that time (what one second of the task is worth).

    The buckets of dynamic-shape functions are sized groups (one per hinted size); a
    static task belongs to every group and takes its largest share. Without buckets there
    is one group, the whole model. Shares are per size because hinted sizes count evenly:
    judged by absolute time, the n=1 buckets (microseconds) would come after every n=1024
    one (milliseconds), and a time limit ended the first round before them (13 of the
    Llama block's 70 tasks untried in 300 s)."""
    keys = [tuple(sorted(st.task.shape.items())) if st.task.shape else None for st in states]
    groups = {k for k in keys if k is not None} or {None}
    totals = {g: sum(c for c, k in zip(costs, keys) if k is None or k == g) for g in groups}
    out = []
    for cost, key in zip(costs, keys):
        total = totals[key] if key is not None else min(totals.values())
        out.append((cost / total, 1.0 / total) if total > 0 else (1.0, 1.0))
    return out


def _judge_shares(states: list[_TaskState], min_share: float) -> None:
    """After its first batch, a task's importance is its share of the estimated tuned model
    time (weight x the latency ApplyDatabase would use; at the task's own size for a
    dynamic-shape bucket, ``_shares``); a task below ``min_share`` waits
    ("too cheap") and comes back when the others' tuning raises its share. Untuned time is
    no guide: untuned convolutions are 50-100x slower than tuned ones, so judged by it the
    cheap-looking tasks become the slowest kernels of the tuned model."""
    tried = [st for st in states if (st.progress.rounds > 0 or st.report.trials > 0)
             and st.report.applied_secs]
    if len(tried) < 2 or any(st.progress.active and st.progress.rounds == 0 for st in states):
        return  # the first round is not over
    costs = [st.task.weight * st.report.applied_secs for st in tried]
    for st, (share, scale) in zip(tried, _shares(tried, costs)):
        st.progress.importance, st.progress.scale = share, scale
        if st.progress.active and share < min_share:
            _finish(st, "too cheap")
            logger.info("%s: %.2f%% of the estimated tuned model time; waits at its best",
                        st.report.task_name, 100 * share)
        elif st.report.status == "too cheap" and share >= min_share:
            st.progress.active, st.report.status = True, "tuning"


def _finish(st: _TaskState, status: str) -> None:
    st.progress.active = False
    st.report.status = status
    if status == "exhausted":
        logger.info("%s: design space exhausted after %d trials", st.report.task_name,
                    st.report.trials)


def _after_round(st: _TaskState, per_task: int, window: int) -> None:
    """Record the round's best; stop the task at its budget or when it has converged."""
    st.progress.rounds += 1
    st.progress.best_per_round.append(st.report.best_secs or float("inf"))
    hist = st.best_history
    if st.report.trials >= per_task:
        _finish(st, "budget")
    elif window > 0 and len(hist) > window and hist[-1] > 0.99 * hist[-1 - window]:
        _finish(st, "converged")
        logger.info("%s: converged (no 1%% gain in %d trials)", st.report.task_name, window)


def _pool_of(builder: object) -> object:
    """The builder's worker pool, for the searches' replays (None: not a LocalBuilder)."""
    try:
        return builder.pool if isinstance(builder, LocalBuilder) else None
    except RuntimeError:  # shut down: its builds fail on their own, the replays stay here
        return None


def _init_state(index: int, task: Task, db: Database, strategy: str,
                seed: int, cost_model=None, replay_pool=None) -> _TaskState:
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
                                               replay_pool=replay_pool))
    return _TaskState(task, report, workload, search, measured,
                      progress=TaskProgress(weight=task.weight, importance=1.0),
                      incumbent=Incumbent(trace=best_trace))


def _may_get_another_batch(st: _TaskState, n: int, remaining: int, per_task: int,
                           waiting: int) -> bool:
    """Whether the task can be given a batch after this one of ``n``: not when it reaches
    its own budget, nor when this batch and the rest of the first round (``waiting`` tasks,
    this one included, about ``n`` each) take the whole budget left. It only decides
    whether the search grows its next pool while this batch builds; a wrong guess costs
    time, never candidates."""
    return st.report.trials + n < per_task and remaining - n * waiting > 0


def _measure(st: _TaskState, cands: list[Candidate | None], db: Database,
             measurer: Measurer, prepare: bool = True) -> None:
    """Measure one batch of one task (None: the untuned function) and commit it: one record
    per candidate, the report updated, the search told how its candidates did. With
    ``prepare``, the search grows its next pool while the builders work."""
    if st.task.symbolic is not None and None not in cands:
        cands, unusable = _symbolic_screen(st.task, cands)
        if unusable:
            _commit(st, [c for c, _ in unusable], [Measured(
                c.trace_json, BuildResult(None, why, 0.0), RunResult(None, why))
                for c, why in unusable], db)
        if not cands:
            return
    traces = [None if c is None else c.trace_json for c in cands]
    # the search grows its next pool while the builders work (before the first batch: while
    # the baseline builds)
    batch = measurer.measure(st.task, traces, st.incumbent, st.report.best_secs,
                             st.report.baseline_secs,
                             while_building=functools.partial(st.search.prepare, st.measured)
                             if prepare else None)
    _commit(st, cands, batch, db)


def _symbolic_screen(task: Task, cands: list[Candidate]
                     ) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """A bucket of a symbolic function: split the candidates into those whose schedule
    replays on the symbolic function (what ``ApplyDatabase`` will run) and those that do
    not, with why; the latter are recorded as failed without being built."""
    from ..dynamic import replay_symbolic

    usable, unusable = [], []
    for cand in cands:
        try:
            replay_symbolic(task.symbolic, cand.trace_json, task.shape, full_tiles=False)
            usable.append(cand)
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            unusable.append((cand, f"does not replay on the symbolic function: "
                                   f"{type(err).__name__} {first}"))
    return usable, unusable


def _commit(st: _TaskState, cands: list[Candidate | None], batch: list[Measured],
            db: Database) -> None:
    task, report = st.task, st.report
    measured_cands, measured_secs = [], []
    for cand, m in zip(cands, batch):
        db.commit_tuning_record(TuningRecord(
            trace_json=BASELINE_TRACE if m.trace is None else m.trace, workload=st.workload,
            run_secs=m.run_secs, target=task.target, args_info=task.args_info))
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


def tune_tir(mod: tvm.IRModule | tvm.tirx.PrimFunc, target=None, work_dir: str | None = None,
             config: TuneConfig | None = None, *, database: Database | None = None,
             **options) -> Database:
    """Tune every PrimFunc of a TIR module (or one PrimFunc) with one shared budget.

    ``config``/``options`` as in ``tune_tasks`` (``op_names`` filters the functions).
    Returns the database the records were written to (``JSONDatabase(work_dir)``).
    """
    cfg = make_config(config, **options)
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    target = parse_target(target)
    tasks = extract_tasks(mod, target, op_names=cfg.op_names, shape_hints=cfg.shape_hints)
    db = open_database(work_dir, database)
    tune_tasks(tasks, work_dir, cfg, database=db)
    return db


def tune_relax(mod: tvm.IRModule, params: dict | None, target=None,
               work_dir: str | None = None, config: TuneConfig | None = None, *,
               database: Database | None = None, **options) -> Database:
    """Tune the TIR functions called from a legalized Relax module; ``params`` are bound
    and what depends only on them folded first (``extract_tasks(params=)``), as
    ``TuneIRMod`` does. ``config``/``options`` as in ``tune_tasks``. Returns the database
    the records were written to."""
    cfg = make_config(config, **options)
    target = parse_target(target)
    tasks = extract_tasks(mod, target, op_names=cfg.op_names, params=params,
                          shape_hints=cfg.shape_hints)
    db = open_database(work_dir, database)
    tune_tasks(tasks, work_dir, cfg, database=db)
    return db
