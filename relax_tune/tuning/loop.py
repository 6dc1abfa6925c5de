"""The tuning loop: pick a task, ask its search for a batch, have the ``Measurer`` build,
time and check it, commit what comes back; until the budget, the time or every task's
space is spent.

The task scheduler picks the task (``scheduler.py``); how candidates are measured is the
``Measurer``'s (``relax_tune.measure.measurer``); what a batch goes through before it is
built is the hooks' ``screen`` (``hooks.py``). Nothing here knows of dynamic shapes, saved
models or reports.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

from ..config import TuneConfig
from ..database import Database
from ..measure import BuildResult, Measured, Measurer, RunResult
from ..measure.base import ERROR_NOT_BUILT
from ..search import Candidate
from .hooks import SessionHook
from .progress import Progress
from .scheduler import TaskScheduler
from .state import BASELINE_KEY, TaskState, commit

logger = logging.getLogger(__name__)


def run_loop(states: list[TaskState], db: Database, measurer: Measurer, cfg: TuneConfig,
             scheduler: TaskScheduler, hooks: Sequence[SessionHook], progress: Progress,
             remaining: int, deadline: float | None) -> None:
    """Spend ``remaining`` trials on the tasks of ``states``, stopping at ``deadline``
    (time.monotonic) when given. A task's untuned baseline (when ``cfg.measure_baseline``)
    is measured with its first batch, built beside its candidates (``Measurer.measure``),
    so the limit counts it and it never delays another task's first candidates."""
    per_task = cfg.per_task_budget
    missing = sum(1 for st in states if BASELINE_KEY not in st.measured) \
        if cfg.measure_baseline else 0
    baselines = 0  # of the missing, measured so far
    _prioritise(states, per_task)
    rounds_since_table = 0
    pace = _Pace()
    while remaining > 0:
        # candidates a batch can hold and still finish by the limit (None: no limit)
        fit = None if deadline is None else pace.fits(deadline)
        if fit == 0:
            logger.info("max_time of %.0f s reached%s%s; stopping the search", cfg.max_time,
                        " (less the share kept for what runs after the search)"
                        if any(h.time_share for h in hooks) else "",
                        "" if time.monotonic() >= deadline else
                        f" (no candidate can be built and timed in the "
                        f"{deadline - time.monotonic():.1f} s left)")
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
            if deadline is not None:  # and a time limit over the first round
                n = min(n, pace.first_batch(deadline, waiting))
        if fit is not None:  # a batch the limit cuts is dropped unmeasured
            n = min(n, fit)
        batch_start = time.monotonic()
        cands = st.search.next_candidates(n, exclude=st.measured)
        if not cands:
            finish(st, "exhausted")
            continue
        for cand in cands:
            st.measured.add(cand.key)
        with_baseline = cfg.measure_baseline and BASELINE_KEY not in st.measured
        _measure(st, [None, *cands] if with_baseline else cands, db, measurer, hooks,
                 while_building=_while_building(states, st, len(cands), remaining, per_task,
                                                waiting),
                 deadline=deadline)
        if with_baseline and BASELINE_KEY in st.measured:  # not cut by the deadline
            baselines += 1
            progress.baseline(st.report, baselines, missing)
        remaining -= len(cands)
        pace.record(time.monotonic() - batch_start, len(cands))
        _after_round(st, per_task, cfg.convergence_window)
        progress.advance(st.report, len(cands))
        rounds_since_table += 1
        if rounds_since_table >= sum(1 for t in states if t.progress.active) > 0:
            progress.table([t.report for t in states])
            rounds_since_table = 0


class _Pace:
    """How long a trial takes in this session (batch wall time over its candidates, the
    search's pool, the builds, the timing and a first batch's baseline included), to size
    the first round's batches under a time limit: every task gets its first candidates
    within ``FIRST_ROUND_SHARE`` of the time left, the most important ones first."""

    FIRST_ROUND_SHARE = 0.6
    FIRST_GUESS_SECS = 1.0  # per trial, until a batch was timed
    MIN_BATCH = 4
    """A first batch's least candidates: one candidate is the model's first choice, which
    the task has as its predicted schedule already (``predict.py``); measuring it alone
    buys little, and the tasks the time does not reach keep their predicted schedules."""

    def __init__(self) -> None:
        self.secs, self.trials = 0.0, 0

    def record(self, secs: float, trials: int) -> None:
        """A batch of ``trials`` candidates took ``secs``."""
        self.secs += secs
        self.trials += trials

    def per_trial(self) -> float:
        """Seconds a trial has taken in this session (``FIRST_GUESS_SECS`` before any)."""
        return self.secs / self.trials if self.trials else self.FIRST_GUESS_SECS

    def first_batch(self, deadline: float, waiting: int) -> int:
        """Candidates of the next first batch (at least ``MIN_BATCH``), ``waiting`` tasks
        (this one included) still waiting for theirs."""
        share = self.FIRST_ROUND_SHARE * max(0.0, deadline - time.monotonic()) / waiting
        return max(self.MIN_BATCH, int(share / self.per_trial()))

    def fits(self, deadline: float) -> int:
        """Candidates a batch can hold and still be built and timed by ``deadline`` (0: not
        one). A batch still building at the deadline is dropped unmeasured, its seconds
        lost and the session past its limit: at 60 s, three of four real models' sessions
        started a last batch (of 16 twice) under a second before the deadline and ran 2-5 s
        over for nothing (Zen 3, 020ea8b)."""
        return int(max(0.0, deadline - time.monotonic()) / self.per_trial())


def _warn_untried(states: list[TaskState], max_time: float) -> None:
    """Say which tasks the time limit left without a single measured candidate: they keep
    their predicted schedules (``predict.py``) or, without one, their untuned code."""
    untried = [st.report for st in states if st.report.trials == 0]
    if not untried:
        return
    predicted = [r.task_name for r in untried if r.predicted]
    untuned = [r.task_name for r in untried if not r.predicted]
    parts = [f"{len(names)} keep their {what} ({_names(names)})"
             for names, what in ((predicted, "predicted schedules"), (untuned, "untuned code"))
             if names]
    logger.warning("max_time of %.0f s reached before any candidate of %d of %d tasks was "
                   "measured: %s; raise max_time or tune fewer tasks (op_names)", max_time,
                   len(untried), len(states), "; ".join(parts))


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _prioritise(states: list[TaskState], per_task: int) -> None:
    """Set each task's importance for the first round (share of the untuned model time, or
    of the tasks' estimated cost while any baseline is missing: ``Task.cost``, FLOPs and
    bytes moved; ``_shares``) and leave the tasks at budget inactive."""
    measured = all(st.report.baseline_secs for st in states)
    costs = [st.task.weight * (st.report.baseline_secs if measured else st.task.cost)
             for st in states]
    for st, (share, scale) in zip(states, _shares(states, costs)):
        st.progress.importance, st.progress.scale = share, scale
        if st.report.trials >= per_task:
            finish(st, "budget")


def _shares(states: list[TaskState], costs: list[float]) -> list[tuple[float, float]]:
    """``(share, scale)`` per task: its share of the model's time at its own size, and 1
    over that time (what one second of the task is worth).

    Tasks with a ``shape`` (the buckets of a dynamic-shape function, one per hinted size)
    form sized groups; a task without one belongs to every group and takes its largest
    share. Without sized tasks there is one group, the whole model. Shares are per size
    because hinted sizes count evenly: judged by absolute time, the small sizes'
    buckets would come after every large one, and a time limit would end the first round
    before them."""
    keys = [tuple(sorted(st.task.shape.items())) if st.task.shape else None for st in states]
    groups = {k for k in keys if k is not None} or {None}
    totals = {g: sum(c for c, k in zip(costs, keys) if k is None or k == g) for g in groups}
    out = []
    for cost, key in zip(costs, keys):
        total = totals[key] if key is not None else min(totals.values())
        out.append((cost / total, 1.0 / total) if total > 0 else (1.0, 1.0))
    return out


def _judge_shares(states: list[TaskState], min_share: float) -> None:
    """After its first batch, a task's importance is its share of the estimated tuned model
    time (weight x the latency ApplyDatabase would use; at the task's own size for a sized
    task, ``_shares``); a task below ``min_share`` waits ("too cheap") and comes back when
    the others' tuning raises its share. Untuned time is no guide: untuned convolutions
    are far slower than tuned ones, so judged by it the cheap-looking tasks become the
    slowest kernels of the tuned model."""
    tried = [st for st in states if (st.progress.rounds > 0 or st.report.trials > 0)
             and st.report.applied_secs]
    if len(tried) < 2 or any(st.progress.active and st.progress.rounds == 0 for st in states):
        return  # the first round is not over
    costs = [st.task.weight * st.report.applied_secs for st in tried]
    for st, (share, scale) in zip(tried, _shares(tried, costs)):
        st.progress.importance, st.progress.scale = share, scale
        if st.progress.active and share < min_share:
            finish(st, "too cheap")
            logger.info("%s: %.2f%% of the estimated tuned model time; waits at its best",
                        st.report.task_name, 100 * share)
        elif st.report.status == "too cheap" and share >= min_share:
            st.progress.active, st.report.status = True, "tuning"


def finish(st: TaskState, status: str) -> None:
    """Stop tuning the task, saying why (``TaskReport.status``)."""
    st.progress.active = False
    st.report.status = status
    if status == "exhausted":
        logger.info("%s: design space exhausted after %d trials", st.report.task_name,
                    st.report.trials)


def _after_round(st: TaskState, per_task: int, window: int) -> None:
    """Record the round's best; stop the task at its budget or when it has converged."""
    st.progress.rounds += 1
    st.progress.best_per_round.append(st.report.best_secs or float("inf"))
    hist = st.best_history
    if st.report.trials >= per_task:
        finish(st, "budget")
    elif window > 0 and len(hist) > window and hist[-1] > 0.99 * hist[-1 - window]:
        finish(st, "converged")
        logger.info("%s: converged (no 1%% gain in %d trials)", st.report.task_name, window)


def _may_get_another_batch(st: TaskState, n: int, remaining: int, per_task: int,
                           waiting: int) -> bool:
    """Whether the task can be given a batch after this one of ``n``: not when it reaches
    its own budget, nor when this batch and the rest of the first round (``waiting`` tasks,
    this one included, about ``n`` each) take the whole budget left. It only decides
    whether the search grows its next pool while this batch builds; a wrong guess costs
    time, never candidates."""
    return st.report.trials + n < per_task and remaining - n * waiting > 0


def _while_building(states: list[TaskState], st: TaskState, n: int, remaining: int,
                    per_task: int, waiting: int) -> Callable[[], None] | None:
    """What the search does while ``st``'s batch of ``n`` builds: grow the pool of the batch
    that comes next. In the first round that is the next waiting task's first batch (the
    scheduler gives them out most important first), not ``st``'s second: under a time limit
    most tasks of a model get one batch, and ``st``'s second pool, grown beside its first
    builds, went unused (MobileNetV2 at 60 s: half the search's replays) while the next
    task's first pool was grown after the builds, holding up its batch. Later, ``st``'s own
    next pool when it may get another batch (``_may_get_another_batch``)."""
    if st.progress.rounds == 0:
        others = [t for t in states
                  if t is not st and t.progress.active and t.progress.rounds == 0]
        if others:
            following = max(others, key=lambda t: t.progress.importance)
            return functools.partial(following.search.prepare, following.measured)
    if _may_get_another_batch(st, n, remaining, per_task, waiting):
        return functools.partial(st.search.prepare, st.measured)
    return None


def _measure(st: TaskState, cands: list[Candidate | None], db: Database, measurer: Measurer,
             hooks: Sequence[SessionHook],
             while_building: Callable[[], None] | None = None,
             deadline: float | None = None) -> None:
    """Measure one batch of one task (None: the untuned function, first when in the batch)
    and commit it: one record per candidate, the report updated, the search told how its
    candidates did. The hooks screen the batch's candidates first (those they drop are
    recorded as failed, unbuilt).
    ``while_building`` runs while the builders work (a search growing its next pool)."""
    baseline = [None] if None in cands else []
    tried = [c for c in cands if c is not None]
    for hook in hooks:
        if not tried:
            break
        tried, unusable = hook.screen(st.task, tried)
        if unusable:
            commit(st, [c for c, _ in unusable], [Measured(
                c.trace_json, BuildResult(None, why, 0.0), RunResult(None, why))
                for c, why in unusable], db)
    cands = baseline + tried
    if not cands:
        return
    traces = [None if c is None else c.trace_json for c in cands]
    batch = measurer.measure(st.task, traces, st.incumbent, st.report.best_secs,
                             st.report.baseline_secs, while_building=while_building,
                             deadline=deadline)
    # what the limit stopped mid-build was never measured: no record, measurable next time
    cut = [i for i, m in enumerate(batch) if m.error == ERROR_NOT_BUILT]
    for i in cut:
        st.measured.discard(BASELINE_KEY if cands[i] is None else cands[i].key)
    if cut:
        logger.info("%s: a build still running at max_time: the batch of %d was dropped "
                    "unmeasured (timing beside running builds is wrong)",
                    st.report.task_name, len(cut))
    commit(st, [c for i, c in enumerate(cands) if i not in cut],
           [m for i, m in enumerate(batch) if i not in cut], db)
