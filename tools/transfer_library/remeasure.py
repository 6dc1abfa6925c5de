"""This CPU's record of each library workload: the fastest here of every target's record.

The library keeps one record per workload and target, and a task prefers its own target's
(``relax_tune.transfer.source``). With no measurement, that record is applied as it is, so
it should be the fastest schedule *on that CPU* among those the library holds, not merely the
best its own short tuning session found (on the Zen 3, 24 of 171 workloads had another
CPU's schedule 6% to 2.3x faster there than their own, docs/design/transfer.md).
``remeasure`` builds and times, on this machine, each workload's records of every target,
its own among them, and keeps the fastest as this target's record
(``build_library --remeasure``).
"""

from __future__ import annotations

import statistics

from relax_tune.database import TuningRecord
from relax_tune.database.records import is_baseline
from relax_tune.space import space_for_target
from relax_tune.utils import schedule_from_json

MIN_GAIN = 1.05
"""Another target's schedule replaces this target's own record only when it runs at least this
much faster here: two timings of one kernel in one run differ by a few percent on a virtual
machine."""


def _median(secs: list[float] | None) -> float | None:
    return statistics.median(secs) if secs else None


def _replays(space, mod, trace_json) -> bool:
    """Whether a schedule is one of this target's design space (its postprocessing takes it:
    an AVX-512 register tile is not one of an AVX2 target's), as a task's would be."""
    try:
        return space.replay(mod, schedule_from_json(mod, trace_json).trace).ok
    except Exception:  # noqa: BLE001 - does not even replay on the workload
        return False


def remeasure(db, target, builder, runner, log=print) -> list[TuningRecord]:
    """For every workload of ``db`` (the library's database) with a record of a target
    other than ``target``: build and time each target's best record of it for ``target``
    with ``builder`` and ``runner`` (this machine), own record included. Returns a record
    for ``target`` of each workload whose fastest schedule here is another target's (or
    that has no record of ``target``), timed here; a schedule that does not build or run
    here, or that this target's design space does not take, is left out."""
    key = str(target)
    space = space_for_target(target)
    chosen: list[TuningRecord] = []
    for wl in db.get_all_workloads():
        best: dict[str, TuningRecord] = {}
        for rec in db.get_top_k(wl, 64):
            if rec.is_valid and not is_baseline(rec.trace_json):
                best.setdefault(str(rec.target), rec)  # fastest first
        if not best or set(best) == {key}:
            continue
        order = [t for t in sorted(best, key=lambda t: t != key)  # this target's own first
                 if t == key or _replays(space, wl.mod, best[t].trace_json)]
        if order in ([], [key]):
            continue
        recs = [best[t] for t in order]
        built = builder.build(wl.mod, target, [r.trace_json for r in recs])
        results = runner.run([b.artifact_path for b in built], recs[0].args_info, target)
        builder.discard([b.artifact_path for b in built])
        secs = [_median(r.run_secs) if b.ok and r.error is None else None
                for b, r in zip(built, results)]
        here = [(s, i) for i, s in enumerate(secs) if s is not None]
        if not here:
            continue
        fastest, i = min(here)
        own = secs[0] if order[0] == key else None
        if order[i] == key or (own is not None and own < fastest * MIN_GAIN):
            continue
        chosen.append(TuningRecord(
            trace_json=recs[i].trace_json, workload=wl, run_secs=results[i].run_secs,
            target=target, args_info=recs[i].args_info))
        log(f"workload {wl.shash}: {recs[i].target.attrs.get('mcpu', '?')}'s schedule runs "
            f"{fastest * 1e6:.1f} us here, this target's own "
            + ("none" if own is None else f"{own * 1e6:.1f} us"))
    return chosen
