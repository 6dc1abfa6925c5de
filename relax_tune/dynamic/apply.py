"""``ApplyDatabase``'s dynamic part: a symbolic function replaced by its dispatch.

The records of a symbolic function are those of its buckets (the function specialised at
each size it was tuned at, ``relax_tune.dynamic.workloads``). ``apply_dynamic`` looks them
up, replays each bucket's best record that replays on the symbolic function
(``relax_tune.dynamic.replay``; in the order of the work_dir's dispatch ranking,
``relax_tune.dynamic.rank``) and builds the dispatching function
(``relax_tune.dynamic.dispatch``), each size served by its nearest bucket or as the
work_dir's dispatch plan says (``relax_tune.dynamic.plan``).
"""

from __future__ import annotations

import logging
import os

import tvm
from tvm import tirx

from ..database import Database, candidate_key, is_baseline
from ..utils import RelaxTuneError, normalize_mod
from ..work_dir import WorkDir
from .buckets import Bucket, symbolic_vars
from .dispatch import dispatch_function
from .hints import default_sizes
from .plan import served_ranges
from .rank import bucket_records, ranking_for
from .replay import replay_symbolic
from .workloads import dynamic_base, dynamic_workloads

logger = logging.getLogger(__name__)


def apply_dynamic(db: Database, name: str, func: tirx.PrimFunc, target: tvm.target.Target,
                  bounds: dict[str, int], work_dir: WorkDir | str | os.PathLike | None,
                  shape_hints: dict[str, dict[int, float]] | None, rankings: dict,
                  plans: dict, enable_warning: bool = False
                  ) -> tuple[tirx.PrimFunc | None, bool]:
    """``(dispatch, kept)``: the dispatching function of the symbolic ``func`` (named
    ``name``) built from the records of its buckets, or None; ``kept`` is True when its
    buckets have records but none beat the untuned function (it stays as it is).

    The buckets looked up are the sizes tuned into ``work_dir``, those of ``shape_hints``
    and the default sizes (up to the variables' upper ``bounds``). Each bucket's records
    are tried in the order of the work_dir's ``rankings``, and each size is served as its
    ``plans`` say (``read_rankings``, ``read_plans``). None as well off CPU targets, when
    no bucket has a record, or when the dispatch cannot be built (logged: the compilation
    goes on with the function untuned)."""
    if target.kind.name != "llvm":
        # One kernel with an if/else over n cannot hold GPU branches that synchronise
        # threads (TVM: "Cannot insert syncs inside condition"); dlight schedules it.
        logger.info("%s: dynamic-shape dispatch is built for CPU targets only; left to "
                    "the default schedules on %s", name, target.kind.name)
        return None, False
    work_dir = WorkDir.maybe(work_dir)
    tuned_sizes = work_dir.hinted_sizes() if work_dir is not None else {}
    try:
        specialised = dynamic_workloads(
            func, _lookup_sizes(func, bounds, tuned_sizes, shape_hints), bounds)
    except RelaxTuneError as err:
        logger.info("%s: dynamic shape that cannot be specialised (%s); left unchanged",
                    name, err)
        return None, False
    base = normalize_mod(dynamic_base(func))
    branches, tuned, kept, keys = [], [], [], []
    for bucket, workload in specialised:
        try:
            record = db.query_tuning_record(workload, target)
        except Exception as err:  # a bad record must not break the compilation
            logger.warning("%s[%s]: could not read its tuning record (%s)", name,
                           bucket.label, err)
            continue
        if record is None:
            continue
        branch, key = None, None
        if not is_baseline(record):
            chosen = _bucket_branch(db, workload, target, base, record,
                                    f"{name}[{bucket.label}]", dict(bucket.sizes),
                                    ranking_for(rankings, workload, dict(bucket.sizes)))
            if chosen is not None:
                branch, key = chosen
                tuned.append(bucket.label)
        if branch is None:
            kept.append(bucket.label)
        branches.append((dict(bucket.sizes), branch))
        keys.append(key)
    if not branches:
        if enable_warning:
            logger.warning("%s: no tuning record at any size of its symbolic shape; left "
                           "unchanged", name)
        return None, False
    if not tuned:
        return None, True
    served = served_ranges(plans, base, branches, keys, name)
    try:
        if served is not None:
            try:
                new = dispatch_function(base["main"], branches, served=served)
            except Exception as err:  # the nearest bucket serves each size then
                logger.warning("%s: dispatch plan not followed (%s); each size runs its "
                               "nearest bucket's kernel", name, err)
                served = None
        if served is None:
            new = dispatch_function(base["main"], branches)
    except Exception as err:  # never crash the compilation: the function stays untuned
        logger.warning("%s: dispatching function not built (%s); left unchanged", name,
                       err)
        return None, False
    logger.info("%s: dispatch over %s (tuned: %s; untuned: %s; above the largest: its "
                "kernel)",
                name, ", ".join(Bucket(tuple(s.items())).label for s, _ in branches),
                ", ".join(tuned), ", ".join(kept) or "none")
    return new, False


def _lookup_sizes(func: tirx.PrimFunc, bounds: dict[str, int],
                  tuned: dict[str, set[int]],
                  shape_hints: dict[str, dict[int, float]] | None) -> dict[str, dict]:
    """The sizes to look records up at, per symbolic variable of ``func``: the default
    sizes, those ``tuned`` into the work_dir and those of ``shape_hints``."""
    out = {}
    for name in (v.name for v in symbolic_vars(func)):
        sizes = set(default_sizes(bounds.get(name))) | tuned.get(name, set())
        sizes |= set((shape_hints or {}).get(name, {}))
        out[name] = {size: 1.0 for size in sorted(sizes)}
    return out


def _bucket_branch(db: Database, workload: tvm.IRModule, target, base: tvm.IRModule,
                   best, label: str, sizes: dict[str, int],
                   ranking: dict[str, float | None] | None = None
                   ) -> tuple[tirx.PrimFunc, str] | None:
    """The bucket's fastest schedule that replays on the symbolic function ``base``, and
    its record's key; None (the untuned function serves the bucket) when none faster than
    the untuned one does. Records in the order of ``rank.bucket_records``. Not
    every static schedule survives symbolic extents: a reduction split by a factor that
    does not divide ``n`` (rfactor) is no longer quasi-affine, and TVM refuses to
    decompose it; the next record is tried then."""
    errors = []
    records = bucket_records(db, workload, target, best, ranking, label)
    for record in records:
        try:
            return (replay_symbolic(base, record.trace_json, sizes),
                    candidate_key(record.trace_json))
        except Exception as err:
            errors.append(str(err).strip().splitlines()[0] if str(err).strip() else
                          type(err).__name__)
    if records:
        logger.warning("%s: none of its %d fastest schedules replays on the symbolic "
                       "function (%s); the untuned function serves its sizes", label,
                       len(errors), "; ".join(errors[:2]))
    return None
