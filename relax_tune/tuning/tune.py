"""Tuning entry points: ``tune_tasks`` assembles a session's parts (database, measurer,
cost model, per-task state, hooks, progress) and runs the loop (``loop.py``);
``tune_tir`` and ``tune_relax`` extract the tasks first and return the database."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import tvm

from ..config import UNLIMITED_TRIALS, TuneConfig, make_config
from ..cost_model import make_cost_model
from ..database import Database
from ..dynamic.tuning import dynamic_hooks
from ..measure import LocalBuilder, LocalRunner, Measurer
from ..search.pool_budget import MIN_TIMED_POOL
from ..transfer import TransferSource, library_database
from ..utils import RelaxTuneError, parse_target
from ..work_dir import WorkDir, open_database
from .extract import Task, extract_tasks
from .hooks import SaveCostModel, Session, run_after_search, run_at_end, search_deadline
from .loop import run_loop
from .predict import choose_here, predict_schedules
from .predict_pool import WorkerChoices, worker_session
from .progress import Progress
from .scheduler import make_scheduler
from .state import TaskReport, init_state
from .twins import Family, share_with_twins, twin_families

logger = logging.getLogger(__name__)

__all__ = ["TaskReport", "tune_relax", "tune_tasks", "tune_tir"]


def tune_tasks(tasks: Sequence[Task], work_dir: WorkDir | str | None = None,
               config: TuneConfig | None = None, *, database: Database | None = None,
               **options) -> list[TaskReport]:
    """Tune ``tasks`` and commit every measured candidate to the database.

    The session is described by ``config`` (a ``TuneConfig``) with ``options`` (any of its
    fields, e.g. ``max_trials_global=64``) replacing its values; an unknown or ill-typed
    option raises ``RelaxTuneError`` before anything runs. ``work_dir`` holds the session's
    database, cost model, logs and task names (a ``WorkDir`` or its path); ``database``
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

    What runs around the search is the session's hooks (``hooks.py``): for dynamic shapes
    (``relax_tune.dynamic.tuning``) a screen of each bucket's candidates, and after the
    search the dispatch ranking (``dispatch_ranking``) and plan (``dispatch_plan``), each
    with its share of ``max_time``; at the end the cost model is saved into the work_dir.

    Returns one ``TaskReport`` per task, in the order given.
    """
    start = time.monotonic()
    cfg = make_config(config, **options)
    wd = WorkDir.maybe(work_dir)
    if wd is not None:
        wd.check_writable()  # a read-only work_dir: one line before any work
    db = open_database(wd, database)
    if wd is not None and tasks:
        wd.write_task_meta(tasks)
    families = _families(tasks, wd)
    if not cfg.measure:
        return _predict_only(tasks, families, wd, db, cfg, start)
    tuned = [fam.leader for fam in families]
    runner = cfg.runner or LocalRunner()
    for kind_target in {t.target.kind.name: t.target for t in tasks}.values():
        runner.check_target(kind_target)  # e.g. cuda without a GPU: stop before any work
    # after the check: it makes a temporary folder
    builder = cfg.builder or LocalBuilder(timeout_sec=build_timeout(cfg.max_time))
    measurer = Measurer(builder, runner, cfg.check_correctness, cfg.head_to_head_rounds)
    model = make_cost_model(cfg.cost_model, wd)  # a name, or a CostModel passed through
    # the searches replay candidates in the builder's workers too while those idle
    replay_pool = _pool_of(builder)
    # under a time limit the first pools get the no-measurement compile's replays at least:
    # the schedules predicted for the tasks left unmeasured are then no worse than its
    states = _states(tuned, db, cfg, model, replay_pool, cfg.max_time,
                     None if cfg.max_time is None else PREDICT_REPLAYS * len(tuned))
    hooks = [*dynamic_hooks(tuned, cfg, wd), SaveCostModel()]
    session = Session(tuned, db, measurer, wd, cfg, model)
    per_task = cfg.per_task_budget
    remaining = max(0, cfg.trial_budget - sum(st.report.trials for st in states))
    progress = Progress(remaining, wd.log_file if wd else None, enable_bar=cfg.progress_bar,
                        timeline_file=wd.timeline_file if wd else None,
                        max_time=cfg.max_time if cfg.trial_budget >= UNLIMITED_TRIALS else None)
    deadline = search_deadline(hooks, start, cfg.max_time)
    if remaining > 0 and any(st.report.trials < per_task for st in states):
        measurer.start()  # worker start-up overlaps the first build
    try:
        if wd is not None and remaining > 0:  # the fallback of the tasks left unmeasured
            spec = worker_session(db, wd, cfg, builder)
            # the workers idle until the first batch: they choose whole tasks meanwhile
            predict_schedules(states, wd.open_predicted(create=True), deadline,
                              WorkerChoices(replay_pool, spec, states) if spec else choose_here,
                              progress.predicted)
        run_loop(states, db, measurer, cfg, make_scheduler(cfg.task_scheduler, cfg.seed),
                 hooks, progress, remaining, deadline)
        run_after_search(hooks, session, start, cfg.max_time)
    finally:
        run_at_end(hooks, session)
        for st in states:
            if st.report.status == "tuning":
                st.report.status = "budget" if st.report.trials >= per_task else "stopped"
        progress.table([st.report for st in states])
        progress.close()
        if cfg.builder is None:
            builder.shutdown()
        if cfg.runner is None:
            runner.shutdown()
        reports = _share(tasks, families, states, wd, db)
    return reports


def _families(tasks: Sequence[Task], wd: WorkDir | None) -> list[Family]:
    """The session's families of twin tasks (``twins.py``): one search each. Without a
    work_dir there is nowhere to keep the members' schedules, so every task is tuned."""
    if wd is None:
        return [Family(leader=task, first=task) for task in tasks]
    return twin_families(tasks)


def _share(tasks: Sequence[Task], families: list[Family], states: list,
           wd: WorkDir | None, db: Database) -> list[TaskReport]:
    """The twins given their leaders' schedules; one report per task of ``tasks``, in their
    order (a member's says ``twin``, and ``predicted`` when it got its leader's schedule)."""
    reports = {id(fam.first): st.report for fam, st in zip(families, states)}
    members = [m for fam in families for m in fam.members]
    if members and wd is not None:
        shared = {id(m) for m in share_with_twins(families, db, wd.open_predicted(create=True))}
        for member in members:
            reports[id(member)] = TaskReport(member, status="twin",
                                             predicted=id(member) in shared)
    return [reports[id(task)] for task in tasks if id(task) in reports]


def _predict_only(tasks: Sequence[Task], families: list[Family], wd: WorkDir | None,
                  db: Database, cfg: TuneConfig, start: float) -> list[TaskReport]:
    """The no-measurement compile's session (``measure=False``): each family leader's
    top-ranked candidate recorded as its predicted schedule (``predict.py``) and shared with
    its twins, nothing built or timed. The builder's workers choose whole tasks beside this
    process (``predict_pool``) where they can rebuild the session, else the searches replay
    their pools there too; the pools share ``PREDICT_REPLAYS`` replays per task (a number,
    not seconds: the same pools in every run), and ``max_time`` stops the choosing."""
    if wd is None:
        raise RelaxTuneError("measure=False needs a work_dir: the predicted schedules are "
                             "kept there for ApplyDatabase")
    if tasks and all(t.target.kind.name != "llvm" for t in tasks):
        # the pre-trained model ranks CPU schedules and the shipped library holds CPU
        # records: on a GPU nothing would be predicted (18 of 18 ResNet-18 tasks untuned)
        logger.warning("measure=False on %s: the pre-trained model and the shipped library "
                       "are for CPUs, so the %d kernels keep their default schedules "
                       "(dlight's); tune with max_time to make them faster",
                       tasks[0].target.kind.name, len(tasks))
        return [TaskReport(task, status="untuned") for task in tasks]
    builder = cfg.builder or LocalBuilder()
    model = make_cost_model(cfg.cost_model, wd)
    leaders = [fam.leader for fam in families]
    progress = Progress(0, wd.log_file, enable_bar=False)
    session = worker_session(db, wd, cfg, builder)
    try:
        # whole tasks go to the workers where they can rebuild the session, else replays
        states = _states(leaders, db, cfg, model, None if session else _pool_of(builder),
                         None, PREDICT_REPLAYS * len(leaders))  # the same pools every run
        # after the searches are made: workers booting beside them slowed them by half
        # (the shipped library read 0.9 -> 1.9 s); the replays use them once they are up
        builder.start()
        deadline = None if cfg.max_time is None else start + cfg.max_time
        choices = WorkerChoices(_pool_of(builder), session, states) if session else None
        count = predict_schedules(states, wd.open_predicted(create=True), deadline,
                                  choices or choose_here, progress.predicted)
        for st in states:
            st.report.status = "predicted" if st.report.predicted else "untuned"
        logger.info("no-measurement compile: predicted schedules for %d of %d tasks in %.1f s "
                    "(%d chosen in the builder's workers; the others keep their untuned code)",
                    count, len(leaders), time.monotonic() - start,
                    choices.in_workers if choices else 0)
        progress.table([st.report for st in states])
    finally:
        progress.close()
        if cfg.builder is None:
            builder.shutdown()
    return _share(tasks, families, states, wd, db)


def _states(tasks: Sequence[Task], db: Database, cfg: TuneConfig, model, replay_pool,
            secs: float | None, replays: int | None = None) -> list:
    """Each task's state, its search given its share of ``secs`` and of ``replays`` per
    pool (``pool_time``, ``pool_replays``) and, with ``cfg.transfer``, the schedules of
    alike workloads in ``db`` and the shipped library (``relax_tune.transfer``)."""
    transfer = TransferSource([db, library_database()], own=db) if cfg.transfer else None
    return [init_state(i, task, db, cfg.strategy, cfg.seed, model, replay_pool, share,
                       transfer, count)
            for i, (task, share, count) in enumerate(zip(
                tasks, pool_time(tasks, secs), pool_replays(tasks, replays)))]


PREDICT_REPLAYS = 24
"""Candidates per task a no-measurement session replays into its pools (shared as
``pool_shares``), and a measuring session under a time limit at least into its first pools:
a number, not seconds, so that the same model compiles to the same schedules in every run.
In seconds (1.5 per task), ShuffleNetV2's convolutions picked schedules up to 5 ms apart in
two compiles of one process (docs/design/time-budget.md)."""


def build_timeout(max_time: float | None) -> float:
    """Seconds one candidate's build may take in a session of our own builder: 60, and a
    tenth of a time limit (never under 10). An unscheduled-looking candidate can keep LLVM
    busy for most of a minute (a ResNet-18 classifier matmul candidate: 39 s and 44 s in two
    sessions of 60 s and 120 s), holding the batch, and the session, that long."""
    return 60.0 if max_time is None else min(60.0, max(10.0, max_time / 10))


POOL_SHARE = 0.3
"""Of a session's ``max_time``, the share its tasks' searches may spend growing one pool
each, split half evenly and half by each task's share of the model's FLOPs."""


def pool_time(tasks: Sequence[Task], max_time: float | None) -> list[float | None]:
    """Seconds each task's search may spend growing one pool (``SearchContext.pool_secs``)
    under a time limit (None each without one). Unbounded, a ResNet-18's 37 first pools
    ranked by the pre-trained model (about 600 replays each) took 260 s on 2 cores, and a
    60 s limit ended before any candidate was built (docs/results/one-minute-tuning.md)."""
    if max_time is None:
        return [None] * len(tasks)
    return [POOL_SHARE * max_time * share for share in pool_shares(tasks)]


def pool_replays(tasks: Sequence[Task], total: int | None) -> list[int | None]:
    """Replays each task's search may spend growing one pool, of ``total`` for all of them
    (None each: no limit), at least ``MIN_TIMED_POOL``."""
    if total is None:
        return [None] * len(tasks)
    return [max(MIN_TIMED_POOL, round(total * share)) for share in pool_shares(tasks)]


def pool_shares(tasks: Sequence[Task]) -> list[float]:
    """Each task's share of the pools' budget: half split evenly, half by its share of the
    model's estimated cost (``Task.cost``, weighted by calls)."""
    costs = [t.weight * max(t.cost, 1.0) for t in tasks]
    total = sum(costs)
    return [0.5 / len(tasks) + 0.5 * c / total for c in costs]


def _pool_of(builder: object) -> object:
    """The builder's workers, for the searches' replays (None: not a LocalBuilder). Nothing
    starts here; a builder shut down later leaves the replays here (``Replayer``)."""
    return builder.replay_pool() if isinstance(builder, LocalBuilder) else None


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
    wd = WorkDir.maybe(work_dir)
    db = open_database(wd, database)
    tune_tasks(tasks, wd, cfg, database=db)
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
    wd = WorkDir.maybe(work_dir)
    db = open_database(wd, database)
    tune_tasks(tasks, wd, cfg, database=db)
    return db
