"""Which record of a dynamic-shape bucket runs fastest where it runs: on the symbolic function.

A bucket's candidates are timed as static kernels (fast to build, what the search needs),
but ``ApplyDatabase`` runs each bucket's record replayed on the *symbolic* function, with
predicated tiles and intermediates sized for the largest size the bucket serves. The two
can differ by several times, and not in the same order (measured:
docs/design/dispatch-plan.md, "The ranking"). So after the search, ``rank_buckets`` builds
each bucket's few fastest records (and the untuned function) exactly as ``ApplyDatabase``
will (``dispatch_workload``), times them at the bucket's size and at the largest size it
serves, checks them against the untuned function, and keeps the result in
``work_dir/dispatch_ranking.json``; ``ApplyDatabase`` then runs the record that ranked
fastest (``ranking_for``). Ranking is resumable (what is ranked is never timed again) and
optional: without a ranking the fastest static record runs, as before.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import tvm

from ..database import Database, candidate_key, is_baseline
from ..utils import args_info, normalize_mod, structural_hash
from ..work_dir import RANKING_FILE, WorkDir
from .buckets import specialize
from .dispatch import dispatch_workload, upper_limit

logger = logging.getLogger(__name__)

__all__ = ["BUCKET_ALTERNATIVES", "RANKING_FILE", "UNTUNED", "bucket_records", "rank_buckets",
           "ranking_for", "read_rankings"]

UNTUNED = "untuned"
"""The ranking key of a bucket's untuned function."""


BUCKET_ALTERNATIVES = 8
"""Records of a bucket tried, fastest first, until one replays on the symbolic function."""


def _bucket_id(shash: int, sizes: dict[str, int]) -> str:
    return f"{int(shash)}:" + ",".join(f"{k}={int(v)}" for k, v in sorted(sizes.items()))


def read_rankings(work_dir: WorkDir | str | None) -> dict[str, dict[str, Any]]:
    """``{bucket id: {"key": {record key: score or None (failed)}, ...}}`` from
    ``work_dir``'s ranking file (``RANKING_FILE``), or {} (none, or unreadable: logged)."""
    work_dir = WorkDir.maybe(work_dir)
    if work_dir is None:
        return {}
    return work_dir.read_entries(RANKING_FILE,
                                 "dynamic-shape buckets run their fastest static record")


def ranking_for(rankings: dict[str, dict[str, Any]], workload: tvm.IRModule,
                sizes: dict[str, int]) -> dict[str, float | None]:
    """``{record key: score}`` of the bucket of ``workload`` (a specialised workload) at
    ``sizes``: seconds as dispatched (the geometric mean over the bucket's size and the
    largest size it serves), None for a record that failed there; ``UNTUNED`` is the
    untuned function. {} when the bucket was not ranked."""
    entry = rankings.get(_bucket_id(structural_hash(workload), sizes))
    return dict(entry.get("scores", {})) if entry else {}


def rank_buckets(tasks: Sequence[Any], db: Database, measurer: Any, work_dir: WorkDir | str,
                 per_bucket: int, deadline: float | None = None) -> int:
    """Rank the ``per_bucket`` fastest static records (those faster than the untuned
    function) of each dynamic-shape task in ``tasks`` by their time as dispatched, into
    ``work_dir``'s ranking file; the most costly buckets (weight x best time) first, until
    ``deadline`` (``time.monotonic()``). Records ranked before are not timed again.
    Returns the number of buckets ranked now."""
    dyn = [t for t in tasks if getattr(t, "symbolic", None) is not None and t.shape]
    if not dyn or per_bucket <= 0:
        return 0
    work_dir = WorkDir.of(work_dir)
    rankings = read_rankings(work_dir)
    hinted = _hinted_sizes(dyn)
    todo = []
    for task in dyn:
        workload = db.commit_workload(task.mod)
        faster = itertools.takewhile(lambda r: not is_baseline(r),
                                     db.get_top_k(workload, per_bucket, task.target))
        records = list(faster)
        if not records:
            continue  # no tuned record beats the untuned function: nothing to choose
        scores = rankings.get(_bucket_id(task.shash, task.shape), {}).get("scores", {})
        new = [r for r in records if candidate_key(r.trace_json) not in scores]
        if new:
            todo.append((task.weight * records[0].mean_run_secs, task, new))
    todo.sort(key=lambda item: -item[0])
    done = 0
    for _, task, records in todo:
        if deadline is not None and time.monotonic() >= deadline:
            logger.info("time limit: %d of %d dynamic-shape buckets ranked as dispatched; the "
                        "others run their fastest static record", done, len(todo))
            break
        key = _bucket_id(task.shash, task.shape)
        entry = rankings.setdefault(key, {"task": task.task_name, "scores": {}})
        entry["scores"].update(_rank_one(task, records, hinted[structural_hash(task.symbolic)],
                                         measurer, UNTUNED not in entry["scores"]))
        work_dir.write_json(RANKING_FILE, rankings)
        done += 1
        best = min(((s, k) for k, s in entry["scores"].items() if s is not None),
                   default=(None, None))
        logger.info("%s: %d records ranked as dispatched; fastest %s (%s)", task.task_name,
                    len(records), "untuned" if best[1] == UNTUNED else best[1],
                    "-" if best[0] is None else f"{best[0] * 1e6:.1f} us")
    return done


def _hinted_sizes(tasks: Sequence[Any]) -> dict[int, dict[str, list[int]]]:
    """Per symbolic function (structural hash): the tuned sizes of each variable."""
    out: dict[int, dict[str, set[int]]] = {}
    for task in tasks:
        sizes = out.setdefault(structural_hash(task.symbolic), {})
        for name, size in task.shape.items():
            sizes.setdefault(name, set()).add(int(size))
    return {h: {k: sorted(v) for k, v in s.items()} for h, s in out.items()}


def _rank_one(task: Any, records: list, hinted: dict[str, list[int]], measurer: Any,
              with_untuned: bool) -> dict[str, float | None]:
    """Scores of ``records`` (and of the untuned function) of one bucket, as dispatched."""
    sizes = {k: int(v) for k, v in task.shape.items()}
    limits = {k: upper_limit(v, hinted.get(k, [v])) for k, v in sizes.items()}
    marked = dispatch_workload(task.symbolic, sizes, hinted)
    keys = [candidate_key(r.trace_json) for r in records]
    traces: list[list | None] = [r.trace_json for r in records]
    if with_untuned:
        keys, traces = keys + [UNTUNED], traces + [None]
    builds = measurer.builder.build(marked, task.target, traces)
    artifacts = [b.artifact_path for b in builds]
    infos = [task.args_info]
    if limits != sizes:
        infos.append(args_info(normalize_mod(specialize(task.symbolic["main"], limits))))
    times = [measurer.runner.run(artifacts, info, task.target) for info in infos]
    scores: dict[str, float | None] = {}
    for i, key in enumerate(keys):
        runs = [t[i] for t in times]
        if not all(r.ok for r in runs):
            scores[key] = None
            logger.info("%s: record %s fails as dispatched: %s", task.task_name, key,
                        builds[i].error or next(r.error for r in runs if not r.ok))
            continue
        if key != UNTUNED and measurer.checker is not None:
            error = measurer.checker.check(f"{task.task_name}@dispatch", marked, task.target,
                                           task.args_info, artifacts[i])
            if error is not None:
                logger.warning("%s: record %s is wrong as dispatched (%s); never used",
                               task.task_name, key, error)
                scores[key] = None
                continue
        scores[key] = math.exp(sum(math.log(r.mean_secs) for r in runs) / len(runs))
    return scores


def bucket_records(db: Database, workload: tvm.IRModule, target: Any, best: Any,
                   ranking: dict[str, float | None] | None, label: str) -> list:
    """The records of a bucket (``workload``, its best record ``best``) in the order
    ``ApplyDatabase`` tries them on the symbolic function, at most ``BUCKET_ALTERNATIVES``,
    none slower than the untuned function: fastest statically, or, when the bucket was
    ranked (``ranking``, ``ranking_for``), fastest as dispatched with the unranked ones
    after; empty when the untuned function ranked first."""
    records = [best]
    try:
        if db.has_workload(workload):
            records += [r for r in db.get_top_k(db.commit_workload(workload),
                                                BUCKET_ALTERNATIVES, target)
                        if r.trace_json != best.trace_json]
    except Exception as err:  # a database without top-k: the best record only
        logger.debug("%s: no alternative records (%s)", label, err)
    if ranking:
        records = _ranked_order(records, ranking, label)
    records = list(itertools.takewhile(lambda r: not is_baseline(r), records))
    return records[:BUCKET_ALTERNATIVES]


def _ranked_order(records: list, ranking: dict[str, float | None], label: str) -> list:
    """``records`` (static order) reordered by their times as dispatched: the ranked ones
    faster than the untuned function, fastest first, then the unranked ones; a record that
    failed as dispatched is dropped. Empty when the untuned function ranked first."""
    untuned = ranking.get(UNTUNED)
    ranked, unranked = [], []
    for record in records:
        key = candidate_key(record.trace_json)
        if key not in ranking:
            unranked.append(record)
        elif ranking[key] is not None and (untuned is None or ranking[key] < untuned):
            ranked.append((ranking[key], record))
    if not ranked and untuned is not None:  # the unranked ones were slower statically
        logger.info("%s: the untuned function is the fastest as dispatched", label)
        return []
    return [r for _, r in sorted(ranked, key=lambda x: x[0])] + unranked
