"""Which bucket's kernel serves which sizes of a dynamic-shape function: measured.

Without a plan, ``ApplyDatabase`` sends each size to the nearest tuned bucket (log scale).
But a bucket's record is tuned at its one size; replayed at another, its tiles pad and its
parallel loop may deal uneven work to the threads, and another bucket's record can be
much faster there (measured: docs/design/dispatch-plan.md). So after the search,
``plan_dispatch`` builds each bucket's record as ``ApplyDatabase`` replays it, serving
every size, and times all of them (and the untuned function) at each hinted size and at
one probe size inside each stretch between neighbouring hinted sizes (four stretches per
gap, one split where the nearest bucket changes; ``stretches``). A stretch (or hinted
size) goes to the fastest there when it is clearly faster (``MARGIN``) than the nearest
bucket, stays so timed alternately with it (``head_to_head``), and computes the right
result at the probe; sizes above the largest go to the kernel that serves the largest
(``served_ranges``).

The plan is kept in ``work_dir/dispatch_plan.json`` with the record each bucket was timed
with; ``ApplyDatabase`` follows it (``served_ranges``) only while every bucket still
applies that record. Planning is resumable (a function whose records did not change is
not timed again) and optional (``TuneConfig.dispatch_plan``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import tvm

from ..database import Database, candidate_key, is_baseline
from ..measure.head_to_head import head_to_head
from ..utils import args_info, normalize_mod, structural_hash
from ..work_dir import PLAN_FILE, WorkDir
from .buckets import specialize
from .dispatch import dispatch_workload, upper_limit
from .rank import BUCKET_ALTERNATIVES, bucket_records, ranking_for, read_rankings

logger = logging.getLogger(__name__)

__all__ = ["MARGIN", "MIN_GAIN_SECS", "PLAN_FILE", "UNTUNED_WITHIN", "plan_dispatch",
           "read_plans", "served_ranges", "stretches"]

MARGIN = 1.1
"""How much faster than the nearest bucket another kernel must be at a stretch's probe to
serve that stretch (two-thread timings move a few per cent between runs)."""

MIN_GAIN_SECS = 5e-6
"""Nor is a stretch moved for less than this (a kernel of a few microseconds is timed
with more noise than ``MARGIN``)."""

UNTUNED_WITHIN = 2.0
"""The untuned function is timed in a stretch only when, at a bucket next to it, it ran
within this factor of the bucket's best record."""


def stretches(hinted: Sequence[int], per_gap: int = 4
              ) -> list[tuple[int, int, int, int | None]]:
    """``(low, high, probe, nearest bucket or None)`` for every size up to the largest of
    the ``hinted`` ones: each hinted size alone (its own probe), each gap between neighbours
    split into ``per_gap`` stretches of equal ratio and where the nearest bucket changes
    (``upper_limit``), the part below the smallest one whole; the probe is a
    stretch's geometric middle.

    Why that fine: how a kernel pads its tiles changes along a stretch, and with two
    stretches per gap one probe (n=363) decided for all of n=257..512. Why the hinted sizes:
    timed with the cache flushed, a bucket's own record is not always the fastest kernel at
    its size; a hinted size moves only when the other kernel also wins timed warm
    (``_Planner``). Measured: docs/design/dispatch-plan.md."""
    sizes = sorted({int(s) for s in hinted})
    out = []

    def add(low: int, high: int, owner: int | None) -> None:
        if low <= high:
            probe = min(high, max(low, round(math.sqrt(low * high))))
            out.append((low, high, probe, owner))

    if sizes and sizes[0] > 1:
        add(1, sizes[0] - 1, sizes[0])
    for a, b in zip(sizes, sizes[1:]):
        middle = upper_limit(a, sizes)
        add(a, a, a)
        cuts = sorted({a} | {max(a, min(b - 1, round(a * (b / a) ** (k / per_gap))))
                             for k in range(1, per_gap) if 2 * k != per_gap} | {middle, b - 1})
        for low, high in zip(cuts, cuts[1:]):
            add(low + 1, high, a if high <= middle else b)
    if sizes:
        add(sizes[-1], sizes[-1], sizes[-1])
    return out


def read_plans(work_dir: WorkDir | str | None) -> dict[str, dict[str, Any]]:
    """``{symbolic function's structural hash: plan}`` from ``work_dir``'s plan file
    (``PLAN_FILE``), or {} (none, or unreadable: logged)."""
    work_dir = WorkDir.maybe(work_dir)
    if work_dir is None:
        return {}
    return work_dir.read_entries(PLAN_FILE, "dynamic shapes dispatch to the nearest bucket")


def served_ranges(plans: dict[str, dict[str, Any]], base: tvm.IRModule,
                  branches: Sequence[tuple[dict[str, int], Any]],
                  keys: Sequence[str | None], label: str) -> list[list[list[int]]] | None:
    """``dispatch.dispatch_function``'s ``served`` for the symbolic function ``base`` whose
    buckets apply ``branches`` (``(sizes, function or None)``) with the records ``keys``
    (None: untuned), from its plan; None (nearest bucket) without a plan, or when the
    plan was measured with other records. Sizes above the largest bucket go, unbounded
    (``[largest + 1, None]``), to the kernel the plan gives the largest bucket's size."""
    plan = plans.get(str(structural_hash(base)))
    if not plan:
        return None
    applied = {str(int(next(iter(sizes.values())))): key
               for (sizes, _), key in zip(branches, keys) if len(sizes) == 1}
    if applied != plan.get("records"):
        logger.info("%s: its dispatch plan was measured with other records; the nearest "
                    "bucket serves each size", label)
        return None
    try:
        served: list[list[list[int | None]]] = []
        bucket_sizes = [int(next(iter(sizes.values()))) for sizes, _ in branches]
        for size in bucket_sizes:
            own = [] if any(int(low) <= size <= int(high) for low, high, _ in plan["ranges"]) \
                else [[size, size]]  # plans before hinted sizes were timed
            served.append(own + [[int(low), int(high)] for low, high, owner in plan["ranges"]
                                 if owner == size])
        # above the largest bucket: the kernel that serves the largest (unbounded)
        top = max(bucket_sizes)
        server = next((i for i, ranges in enumerate(served)
                       if any(low <= top <= high for low, high in ranges)), None)
        if server is not None:
            served[server].append([top + 1, None])
    except (KeyError, TypeError, ValueError) as err:  # a plan file edited by hand
        logger.warning("%s: its dispatch plan is malformed (%s: %s); the nearest bucket "
                       "serves each size", label, type(err).__name__, err)
        return None
    return served


def plan_dispatch(tasks: Sequence[Any], db: Database, measurer: Any, work_dir: WorkDir | str,
                  deadline: float | None = None) -> int:
    """Measure the dispatch of each dynamic-shape function of ``tasks`` (one symbolic
    variable, at least two tuned buckets) into ``work_dir``'s plan file, the most costly
    functions first, until ``deadline`` (``time.monotonic()``). Returns the number planned
    now."""
    groups: dict[str, list[Any]] = {}
    for task in tasks:
        symbolic = getattr(task, "symbolic", None)
        if symbolic is not None and len(task.shape) == 1:
            groups.setdefault(str(structural_hash(symbolic)), []).append(task)
    work_dir = WorkDir.of(work_dir)
    plans = read_plans(work_dir)
    rankings = read_rankings(work_dir)
    todo = []
    for shash, group in groups.items():
        group.sort(key=_size)
        orders = [_bucket_order(t, db, rankings) for t in group]
        firsts = {str(_size(t)): candidate_key(o[0].trace_json) if o else None
                  for t, o in zip(group, orders)}
        if sum(bool(o) for o in orders) < 2 or plans.get(shash, {}).get("first") == firsts:
            continue  # nothing to choose between, or planned with these records already
        cost = sum(t.weight * o[0].mean_run_secs for t, o in zip(group, orders) if o)
        todo.append((cost, shash, group, orders, firsts))
    todo.sort(key=lambda item: -item[0])
    done = 0
    for _, shash, group, orders, firsts in todo:
        if deadline is not None and time.monotonic() >= deadline:
            logger.info("time limit: %d of %d dynamic-shape functions' dispatch measured; the "
                        "others dispatch to the nearest bucket", done, len(todo))
            break
        plan = _plan_one(group, orders, measurer, _untuned_contends(group, db))
        if plan is not None:
            plans[shash] = dict(plan, first=firsts)
            work_dir.write_json(PLAN_FILE, plans)
            done += 1
    return done


def _size(task: Any) -> int:
    return int(next(iter(task.shape.values())))


def _bucket_order(task: Any, db: Database, rankings: dict) -> list:
    """The records ``ApplyDatabase`` tries for the bucket of ``task``, in order (empty:
    the untuned function serves it)."""
    record = db.query_tuning_record(task.mod, task.target)
    if record is None or is_baseline(record):
        return []
    return bucket_records(db, task.mod, task.target, record,
                          ranking_for(rankings, task.mod, dict(task.shape)), task.task_name)


def _untuned_contends(group: list[Any], db: Database) -> set[int]:
    """The bucket sizes of ``group`` whose untuned function ran within ``UNTUNED_WITHIN`` of
    their best record (timed statically during the search): only next to these is the
    untuned function timed (elsewhere one call of it can take seconds)."""
    out = set()
    for task in group:
        try:
            records = db.get_top_k(db.commit_workload(task.mod), BUCKET_ALTERNATIVES + 1,
                                   task.target)
        except Exception:  # noqa: BLE001 - a database without top-k: assume it contends
            out.add(_size(task))
            continue
        base = next((r for r in records if is_baseline(r)), None)
        if not records or is_baseline(records[0]) or (
                base is not None and base.mean_run_secs < UNTUNED_WITHIN *
                records[0].mean_run_secs):
            out.add(_size(task))
    return out


def _plan_one(group: list[Any], orders: list[list], measurer: Any,
              untuned_near: set[int]) -> dict[str, Any] | None:
    """The plan of one symbolic function whose buckets are the tasks ``group`` (smallest
    first), each with its records in ``ApplyDatabase``'s order (``orders``), the untuned
    function timed only next to the buckets ``untuned_near``; None when fewer than two
    buckets build."""
    name = group[0].task_name.split("[")[0]
    (var,) = group[0].shape
    sizes = [_size(t) for t in group]
    symbolic, target = group[0].symbolic, group[0].target
    start = time.monotonic()
    # the untuned function is a contender next to the buckets it ran close to, and where a
    # bucket has no record to serve with
    untuned = bool(untuned_near) or not all(orders)
    built = _build(group, orders, symbolic, target, {var: sizes}, [[1, sizes[-1]]], measurer,
                   untuned)
    if len([k for k in built if k is not None]) < 2:
        measurer.builder.discard([b[0] for b in built.values()])
        return None
    planner = _Planner(name, var, sizes, symbolic, target, measurer, built, untuned_near)
    try:
        with _cache_flushed(measurer.runner):
            ranges = [[low, high, planner.owner(low, high, probe, nearest)]
                      for low, high, probe, nearest in stretches(sizes)]
    finally:
        measurer.builder.discard([b[0] for b in built.values()])
    records = {str(s): None for s in sizes}
    records.update({str(k): v[1] for k, v in built.items() if k is not None})
    logger.info("%s: dispatch measured in %.1f s", name, time.monotonic() - start)
    return {"task": name, "var": var, "records": records, "ranges": ranges,
            "probes": planner.probes}


class _Planner:
    """The kernels of one symbolic function's buckets (``built``: ``{bucket size, None for
    the untuned function: (artifact, record key, workload)}``) and what was measured."""

    def __init__(self, name: str, var: str, sizes: list[int], symbolic: tvm.IRModule,
                 target: Any, measurer: Any, built: dict, untuned_near: set[int]) -> None:
        self.name, self.var, self.sizes = name, var, sizes
        self.symbolic, self.target, self.measurer = symbolic, target, measurer
        self.built, self.untuned_near = built, untuned_near
        self.probes: dict[str, dict[str, float]] = {}  # probe: {kernel: seconds}
        self.verdicts: dict[int, bool] = {}  # bucket: right at the probe it was checked

    def owner(self, low: int, high: int, probe: int, nearest: int | None) -> int | None:
        """The bucket (None: the untuned function) to serve ``low..high``, timed at
        ``probe``: the fastest there when clearly faster than the ``nearest`` bucket's and
        right (at a hinted size, clearly faster timed warm too), else the nearest."""
        owner = nearest if nearest in self.built else None
        info = args_info(normalize_mod(specialize(self.symbolic["main"], {self.var: probe})))
        around = {max((b for b in self.sizes if b < low), default=None),
                  min((b for b in self.sizes if b > high), default=None)} | \
            {b for b in self.sizes if low <= b <= high}  # a hinted size's own bucket
        contenders = {k: v for k, v in self.built.items()
                      if k is not None or owner is None or around & self.untuned_near}
        times = _time_at(contenders, owner, info, self.target, self.measurer)
        self.probes[str(probe)] = {str(k): t for k, t in times.items()}
        best = min(times, key=lambda k: times[k], default=owner)
        if best == owner or owner not in times or times[best] * MARGIN >= times[owner] \
                or times[owner] - times[best] < MIN_GAIN_SECS:
            return owner
        if not self._confirmed(best, owner, info):
            return owner
        if low == high == owner and not self._faster_warm(best, owner, info):
            return owner  # a hinted size keeps the kernel tuned for it unless clearly beaten
        if best not in self.verdicts:  # once per kernel: at large sizes a check is slow
            self.verdicts[best] = _is_right(best, self.built,
                                            f"{self.name}@{self.var}={probe}", info,
                                            self.measurer, self.target)
        if not self.verdicts[best]:
            return owner
        logger.info("%s: %s=%d..%d served by %s (%.3g ms at %d; nearest bucket %s: %.3g ms)",
                    self.name, self.var, low, high,
                    "the untuned function" if best is None else f"bucket {best}",
                    times[best] * 1e3, probe, owner, times[owner] * 1e3)
        return best

    def _confirmed(self, best: int | None, owner: int | None, info: list) -> bool:
        """Whether ``best``'s kernel stays clearly faster than ``owner``'s timed alternately
        (``head_to_head``, median of the rounds). The probe times the nearest bucket first
        and the others after it, and the machine's speed drifts between the two, enough to
        pick a kernel that is not faster (docs/design/dispatch-plan.md, "The side-by-side
        confirmation")."""
        ratios = head_to_head(self.measurer.runner, self.built[owner][0],
                              self.built[best][0], info, self.target)
        confirmed = ratios is not None and statistics.median(ratios) * MARGIN < 1.0
        if not confirmed:
            logger.debug("%s: %s not confirmed against bucket %s side by side (ratios %s)",
                         self.name, "the untuned function" if best is None else
                         f"bucket {best}", owner, ratios)
        return confirmed

    def _faster_warm(self, best: int | None, owner: int | None, info: list) -> bool:
        """Whether ``best``'s kernel is also clearly faster than ``owner``'s timed warm (and
        alternately, as ``_confirmed``). At a small hinted size the model finds the weights
        in the outer cache, and flushed timing alone moved such sizes to kernels slower in
        the model (docs/design/dispatch-plan.md, "The warm check at hinted sizes")."""
        with _cache_flushed(self.measurer.runner, False):
            return self._confirmed(best, owner, info)


def _build(group: list[Any], orders: list[list], symbolic: tvm.IRModule, target: Any,
           hinted: dict[str, list[int]], serves: list[list[int]], measurer: Any,
           untuned: bool) -> dict[int | None, tuple[str, str | None, tvm.IRModule]]:
    """``{bucket size (None: the untuned function, when ``untuned``): (artifact, record
    key, workload)}``: each bucket's first record that builds as its dispatch serving
    ``serves``, tried in ``ApplyDatabase``'s order (``orders``), the buckets built side by
    side."""
    marked = {_size(t): dispatch_workload(symbolic, t.shape, hinted, serves)
              for t in group}
    marked[None] = marked[_size(group[0])]  # built without a trace: the untuned function
    todo = {_size(t): list(records) for t, records in zip(group, orders) if records}
    built: dict[int | None, tuple[str, str | None, tvm.IRModule]] = {}
    pending = [(None, None, measurer.builder.submit(marked[None], target, [None]))] \
        if untuned else []
    while todo or pending:
        for size, records in list(todo.items()):
            record = records.pop(0)
            pending.append((size, record, measurer.builder.submit(
                marked[size], target, [record.trace_json])))
            if not records:
                del todo[size]
        for size, record, job in pending:
            result = job.result()[0]
            if result.ok and size not in built:
                key = None if record is None else candidate_key(record.trace_json)
                built[size] = (result.artifact_path, key, marked[size])
                todo.pop(size, None)  # as ApplyDatabase: the first that replays
            elif result.ok:
                measurer.builder.discard([result.artifact_path])
        pending = []
    return built


@contextlib.contextmanager
def _cache_flushed(runner: Any, flushed: bool = True):
    """``runner`` flushing the CPU cache before each timed call while in the block (or not,
    ``flushed=False``), where it can. In a model a kernel finds its weights in the outer
    caches or memory, not in the L2 its own timing loop leaves them in, and which bucket's
    kernel is faster can differ between the two (measured: docs/design/dispatch-plan.md,
    "Flushed timing")."""
    if not hasattr(runner, "enable_cpu_cache_flush"):
        yield
        return
    before = runner.enable_cpu_cache_flush
    runner.enable_cpu_cache_flush = flushed
    try:
        yield
    finally:
        runner.enable_cpu_cache_flush = before


def _time_at(built: dict, owner: int | None, info: list, target: Any,
             measurer: Any) -> dict[int | None, float]:
    """Seconds of each built kernel on arguments ``info``; the others after the nearest
    bucket's (``owner``) and cut short at twice its time (a cut one counts its one slow
    call)."""
    first = measurer.runner.run([built[owner][0]], info, target) if owner in built else []
    times = {owner: first[0].mean_secs} if first and first[0].ok else {}
    others = [k for k in built if k != owner]
    limit = 2 * times[owner] if times else None
    runs = measurer.runner.run([built[k][0] for k in others], info, target, max_secs=limit)
    times.update((k, r.mean_secs) for k, r in zip(others, runs) if r.ok)
    return times


def _is_right(best: int | None, built: dict, where: str, info: list, measurer: Any,
              target: Any) -> bool:
    """Whether the kernel of bucket ``best`` computes what the untuned function computes on
    arguments ``info`` (logged when not); the untuned function always does."""
    if best is None or measurer.checker is None:
        return True
    artifact, _, marked = built[best]
    error = measurer.checker.check(f"plan:{where}", marked, target, info, artifact)
    if error is not None:
        logger.warning("%s: bucket %s's kernel is wrong there (%s); not used", where, best,
                       error)
    return error is None
