"""Program features of a scheduled candidate, for the cost model.

Our own extractor (MetaSchedule's C++ ``PerStoreFeature`` is the competitor's and is not
used). It walks the *scheduled* S-TIR once, without lowering: every block whose body is a
store is one "store". For each store it knows the loop nest above it (extents, parallel /
vectorised / unrolled kinds, the ``pragma_auto_unroll_max_step`` in force) and, by composing
the block's iter-var bindings with its buffer indices (one ``detect_linear_equation`` call
per binding and per index), the stride of every buffer access along every loop. From those
it derives per-access footprints per loop level, the cache level where the working set fits,
the traffic each cache level sees, arithmetic intensity and reuse.

A candidate's vector is ``[the heaviest store's features, the work-weighted mean of all
stores' features, a few whole-function totals]``: fixed length whatever the program.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule

from ..space.cpu.layout_rewrite import PREPROC_ANNOTATION

logger = logging.getLogger("relax_tune.cost_model")

FEATURE_VERSION = 1
"""Bumped whenever the meaning or length of the vector changes (saved models check it)."""

CACHE_BYTES = (32 * 1024, 512 * 1024, 16 * 1024 * 1024)
"""Cache capacities the traffic model uses (L1, L2, L3; typical x86 per-core figures)."""

MAX_LOADS = 3
"""Loads per store with their own feature slots (the rest only count in totals)."""

_FOR_PARALLEL, _FOR_VECTORIZED, _FOR_UNROLLED = 1, 2, 3
_UNROLL_PRAGMA = "pragma_auto_unroll_max_step"
_ARITH = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.FloorDiv, tirx.FloorMod, tirx.Mod,
          tirx.Max, tirx.Min)

_STORE_NAMES = [
    "log_iters", "log_flops", "ops_per_iter", "depth", "log_parallel", "parallel_depth",
    "log_vector", "vector_innermost", "log_unroll_explicit", "log_auto_unroll",
    "log_unrolled_body", "log_traffic_l1", "log_traffic_l2", "log_traffic_l3",
    "intensity_l1", "intensity_l2", "log_fit_l1_iters", "log_fit_l2_iters",
    "log_total_footprint", "n_loads", "log_register_tile", "log_register_iters",
    "log_register_loads", "log_inner_serial",
]
INNER_LEVELS = 4
"""Innermost loops with their own extent and per-access stride slots."""
_ACCESS_NAMES = [
    "present", "log_stride_inner", "stride_inner_zero", "stride_inner_unit",
    "log_stride_outer_serial", "log_footprint_inner", "log_footprint_l1", "log_reuse_l1",
    "log_buffer_bytes",
]


def feature_names() -> list[str]:
    """Names of the entries of a candidate's feature vector, in order."""
    per_store = list(_STORE_NAMES)
    slots = ["store"] + [f"load{i}" for i in range(MAX_LOADS)]
    for slot in slots:
        per_store += [f"{slot}_{n}" for n in _ACCESS_NAMES]
    for lvl in range(INNER_LEVELS):
        per_store += [f"inner{lvl}_log_extent", f"inner{lvl}_kind"]
        per_store += [f"inner{lvl}_{slot}_log_stride" for slot in slots]
    return ([f"top_{n}" for n in per_store] + [f"mean_{n}" for n in per_store]
            + ["n_stores", "log_sum_flops", "log_sum_traffic_l1", "log_sum_traffic_l2",
               "log_sum_footprint", "sum_intensity_l1"])


N_FEATURES = len(feature_names())


# ------------------------------------------------------------------------------------------
# The walk


@dataclass
class _Loop:
    var: Any
    extent: int
    kind: int
    unroll_step: int  # the auto-unroll step in force at this loop (0: none)


@dataclass
class _Access:
    buffer: Any
    indices: list
    is_write: bool


@dataclass
class _Store:
    loops: list[_Loop]
    accesses: list[_Access]
    bindings: list[tuple[Any, Any]]
    ops: int
    strides: list[list[float]] = field(default_factory=list)


def _int(expr: Any) -> int | None:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    return None


def _walk(stmt: Any, loops: list[_Loop], out: list[_Store]) -> None:
    if stmt is None:
        return
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk(s, loops, out)
        return
    if isinstance(stmt, tirx.For):
        extent = _int(stmt.extent) or 1
        step = loops[-1].unroll_step if loops else 0
        anns = stmt.annotations
        if _UNROLL_PRAGMA in anns:
            step = _int(anns[_UNROLL_PRAGMA]) or 0
        frame = _Loop(stmt.loop_var, extent, int(stmt.kind), step)
        _walk(stmt.body, loops + [frame], out)
        return
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        blk = stmt.block
        if PREPROC_ANNOTATION in blk.annotations:
            return  # weight packing: runs once at compile time, never timed
        bindings = list(zip([iv.var for iv in blk.iter_vars], list(stmt.iter_values)))
        for part in (blk.init, blk.body):
            if isinstance(part, tirx.BufferStore):
                out.append(_store_of(part, loops, bindings))
            elif part is not None:
                # opaque or root block: loop vars stay in scope, bindings do not compose
                _walk(part, loops, out)
        return
    if isinstance(stmt, tirx.BufferStore):
        out.append(_store_of(stmt, loops, []))
        return
    for attr in ("body", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if isinstance(child, tirx.Stmt):
            _walk(child, loops, out)


def _store_of(store: Any, loops: list[_Loop], bindings: list) -> _Store:
    accesses = [_Access(store.buffer, list(store.indices), True)]
    counter = [0]

    def on_load(node: Any) -> None:
        accesses.append(_Access(node.source, list(node.indices), False))

    def on_arith(_node: Any) -> None:
        counter[0] += 1

    tvm_ffi.structural_walk(store.value, [(tvm.ir.TensorLoad, on_load)]
                            + [(cls, on_arith) for cls in _ARITH])
    return _Store(list(loops), accesses, bindings, counter[0])


# ------------------------------------------------------------------------------------------
# Strides


def _coefs(expr: Any, variables: list) -> list[float] | None:
    """Constant coefficients of ``variables`` in ``expr`` (None when not linear)."""
    if not variables:
        return []
    const = _int(expr)
    if const is not None:
        return [0.0] * len(variables)
    res = _detect(expr, variables)
    if res is not None:
        return res
    # non-linear in some variable (a fused loop under floordiv/floormod): per variable, so
    # only that one gets nan
    out = []
    for var in variables:
        one = _detect(expr, [var])
        out.append(math.nan if one is None else one[0])
    return out


def _detect(expr: Any, variables: list) -> list[float] | None:
    try:
        res = tvm.sym.detect_linear_equation(expr, variables)
    except Exception:
        return None
    if len(res) != len(variables) + 1:
        return None
    out = []
    for c in list(res)[:-1]:
        v = _int(c)
        if v is None:
            return None
        out.append(float(v))
    return out


def _buffer_strides(buf: Any) -> list[int] | None:
    shape = [_int(d) for d in buf.shape]
    if any(d is None for d in shape):
        return None
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * int(shape[d + 1])
    return strides


def _compute_strides(st: _Store) -> None:
    """Element stride of every access along every loop (nan where not linear)."""
    loop_vars = [lp.var for lp in st.loops]
    nan = [math.nan] * len(loop_vars)
    bvars = [b for b, _ in st.bindings]
    bind = [_coefs(v, loop_vars) for _, v in st.bindings]
    for acc in st.accesses:
        bstrides = _buffer_strides(acc.buffer)
        if bstrides is None or len(bstrides) != len(acc.indices):
            st.strides.append(list(nan))
            continue
        total = [0.0] * len(loop_vars)
        for d, index in enumerate(acc.indices):
            if bvars:
                c_b = _coefs(index, bvars)
                if c_b is None:
                    total = list(nan)
                    break
                for bi, cb in enumerate(c_b):
                    if cb == 0.0:
                        continue
                    if bind[bi] is None:
                        total = list(nan)
                        break
                    for li, cl in enumerate(bind[bi]):
                        total[li] += cb * cl * bstrides[d]
            else:  # indices already over loop vars (no enclosing block bindings)
                c_l = _coefs(index, loop_vars)
                if c_l is None:
                    total = list(nan)
                    break
                for li, cl in enumerate(c_l):
                    total[li] += cl * bstrides[d]
        st.strides.append(total)


# ------------------------------------------------------------------------------------------
# Per-store features


def _log2(x: float) -> float:
    return math.log2(1.0 + max(0.0, x))


def _dtype_bytes(buf: Any) -> int:
    dt = str(buf.dtype)
    digits = "".join(ch for ch in dt if ch.isdigit())
    bits = int(digits) if digits else 32
    lanes = 1
    if "x" in dt:
        try:
            lanes = int(dt.split("x")[-1])
        except ValueError:
            lanes = 1
    return max(1, bits * lanes // 8)


def _footprints(extents: list[int], strides: list[float]) -> list[float]:
    """Distinct elements one access touches while the loops ``i..`` run, for each level i
    (index len(extents): a single iteration)."""
    d = len(extents)
    out = [1.0] * (d + 1)
    count, span = 1.0, 0.0
    for i in range(d - 1, -1, -1):
        s = strides[i]
        if math.isnan(s):
            count *= extents[i]
            span = count
        elif s != 0.0:
            count *= extents[i]
            span += (extents[i] - 1) * abs(s)
        out[i] = max(1.0, min(count, span + 1.0))
    return out


def _store_features(st: _Store) -> tuple[list[float], float]:
    """The store's feature list and its weight (work: iterations x (ops + 1))."""
    extents = [lp.extent for lp in st.loops]
    d = len(extents)
    iters = float(np.prod(extents)) if extents else 1.0
    flops = iters * st.ops
    par = [lp for lp in st.loops if lp.kind == _FOR_PARALLEL]
    par_extent = float(np.prod([lp.extent for lp in par])) if par else 1.0
    par_depth = next((i for i, lp in enumerate(st.loops) if lp.kind == _FOR_PARALLEL), d)
    vec = [lp for lp in st.loops if lp.kind == _FOR_VECTORIZED]
    vec_extent = float(vec[-1].extent) if vec else 1.0
    vec_inner = 1.0 if st.loops and st.loops[-1].kind == _FOR_VECTORIZED else 0.0
    unroll_explicit = float(np.prod([lp.extent for lp in st.loops
                                     if lp.kind == _FOR_UNROLLED])) if st.loops else 1.0
    step = st.loops[-1].unroll_step if st.loops else 0
    # the innermost loops whose product stays within the step get unrolled by UnrollLoop
    body = 1.0
    for lp in reversed(st.loops):
        if lp.kind == _FOR_VECTORIZED:
            continue
        if body * lp.extent > max(step, 1):
            break
        body *= lp.extent

    fps = []  # per access: footprints in bytes per level
    for acc, strides in zip(st.accesses, st.strides):
        nbytes = _dtype_bytes(acc.buffer)
        fps.append([f * nbytes for f in _footprints(extents, strides)])
    total_fp = [sum(fp[i] for fp in fps) for i in range(d + 1)]
    outer_iters = [1.0] * (d + 1)  # iterations of loops 0..i-1
    for i in range(1, d + 1):
        outer_iters[i] = outer_iters[i - 1] * extents[i - 1]

    def fit_level(cap: float) -> int:
        for i in range(d + 1):  # outermost level whose working set fits
            if total_fp[i] <= cap:
                return i
        return d

    traffic, fit_iters = [], []
    for cap in CACHE_BYTES:
        lvl = fit_level(cap)
        traffic.append(total_fp[lvl] * outer_iters[lvl])
        fit_iters.append(iters / outer_iters[lvl])
    l1 = fit_level(CACHE_BYTES[0])
    feats = [
        _log2(iters), _log2(flops), float(st.ops), float(d), _log2(par_extent),
        float(par_depth), _log2(vec_extent), vec_inner, _log2(unroll_explicit), _log2(step),
        _log2(body), _log2(traffic[0]), _log2(traffic[1]), _log2(traffic[2]),
        flops / max(traffic[0], 1.0), flops / max(traffic[1], 1.0),
        _log2(fit_iters[0]), _log2(fit_iters[1]), _log2(total_fp[0]),
        float(len(st.accesses) - 1),
    ]
    # register level: the loops inside the innermost loop the store does not move along
    # (a reduction loop) hold the accumulators; loads there are re-done every iteration
    red = [i for i, stride in enumerate(st.strides[0][:d])
           if stride == 0.0 and extents[i] > 1] if st.strides else []
    r_lvl = red[-1] + 1 if red else d
    reg_tile = float(np.prod(extents[r_lvl:])) if r_lvl < d else 1.0
    reg_iters = iters / max(outer_iters[r_lvl], 1.0) if r_lvl < d else 1.0
    reg_loads = sum(fp[r_lvl] for fp in fps[1:]) if len(fps) > 1 else 0.0
    inner_serial = next((lp.extent for lp in reversed(st.loops)
                         if lp.kind not in (_FOR_VECTORIZED, _FOR_PARALLEL) and lp.extent > 1), 1)
    feats += [_log2(reg_tile), _log2(reg_iters), _log2(reg_loads), _log2(inner_serial)]
    serial_outer = [i for i, lp in enumerate(st.loops)
                    if lp.kind not in (_FOR_VECTORIZED,) and lp.extent > 1]
    slots = [0] + list(range(1, min(len(st.accesses), MAX_LOADS + 1)))
    for slot in range(MAX_LOADS + 1):
        if slot >= len(slots):
            feats += [0.0] * len(_ACCESS_NAMES)
            continue
        a = slots[slot]
        acc, strides, fp = st.accesses[a], st.strides[a], fps[a]
        inner = strides[-1] if strides else 0.0
        inner = 1e6 if math.isnan(inner) else abs(inner)
        outer_s = strides[serial_outer[-1]] if serial_outer and strides else 0.0
        outer_s = 1e6 if math.isnan(outer_s) else abs(outer_s)
        shape = [_int(x) or 1 for x in acc.buffer.shape]
        buf_bytes = float(np.prod(shape)) * _dtype_bytes(acc.buffer) if shape else 1.0
        reuse = (iters / outer_iters[l1]) / max(fp[l1] / _dtype_bytes(acc.buffer), 1.0)
        feats += [1.0, _log2(inner), float(inner == 0.0), float(inner == 1.0), _log2(outer_s),
                  _log2(fp[d - 1] if d else fp[0]), _log2(fp[l1]), _log2(reuse),
                  _log2(buf_bytes)]
    for lvl in range(INNER_LEVELS):
        i = d - 1 - lvl
        if i < 0:
            feats += [0.0, -1.0] + [0.0] * (MAX_LOADS + 1)
            continue
        feats += [_log2(extents[i]), float(st.loops[i].kind)]
        for slot in range(MAX_LOADS + 1):
            stride = st.strides[slot][i] if slot < len(st.strides) else 0.0
            feats.append(20.0 if math.isnan(stride) else _log2(abs(stride)))
    return feats, iters * (st.ops + 1)


# ------------------------------------------------------------------------------------------
# Public API


def _main_func(mod: tvm.IRModule) -> tirx.PrimFunc | None:
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and gv.name_hint == "main":
            return func
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return funcs[0] if funcs else None


def extract_features(program: Schedule | tvm.IRModule | tirx.PrimFunc) -> np.ndarray:
    """The feature vector (length ``N_FEATURES``, float32) of one scheduled program.

    Never raises: a program the extractor cannot read gives the zero vector (logged at
    debug level)."""
    try:
        if isinstance(program, Schedule):
            program = program.mod
        func = program if isinstance(program, tirx.PrimFunc) else _main_func(program)
        if func is None:
            return np.zeros(N_FEATURES, dtype=np.float32)
        stores: list[_Store] = []
        _walk(func.body, [], stores)
        per_store = (len(_STORE_NAMES) + (MAX_LOADS + 1) * len(_ACCESS_NAMES)
                     + INNER_LEVELS * (2 + MAX_LOADS + 1))
        if not stores:
            return np.zeros(N_FEATURES, dtype=np.float32)
        rows, weights = [], []
        for st in stores:
            _compute_strides(st)
            f, w = _store_features(st)
            rows.append(f)
            weights.append(w)
        mat = np.asarray(rows, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        top = mat[int(np.argmax(w))]
        mean = (mat * (w / w.sum())[:, None]).sum(axis=0) if w.sum() > 0 else mat.mean(axis=0)
        idx = {n: i for i, n in enumerate(_STORE_NAMES)}
        sum_flops = sum(2.0 ** r[idx["log_flops"]] - 1 for r in rows)
        sum_l1 = sum(2.0 ** r[idx["log_traffic_l1"]] - 1 for r in rows)
        sum_l2 = sum(2.0 ** r[idx["log_traffic_l2"]] - 1 for r in rows)
        sum_fp = sum(2.0 ** r[idx["log_total_footprint"]] - 1 for r in rows)
        totals = [float(len(stores)), _log2(sum_flops), _log2(sum_l1), _log2(sum_l2),
                  _log2(sum_fp), sum_flops / max(sum_l1, 1.0)]
        assert len(top) == per_store
        return np.concatenate([top, mean, totals]).astype(np.float32)
    except Exception as err:  # an IR shape we do not understand: the model sees zeros
        logger.debug("feature extraction failed: %s: %s", type(err).__name__, err)
        return np.zeros(N_FEATURES, dtype=np.float32)


def extract_features_batch(programs: Sequence[Schedule | tvm.IRModule]) -> np.ndarray:
    """Feature vectors of several programs, one row each (``len(programs) x N_FEATURES``)."""
    if not programs:
        return np.zeros((0, N_FEATURES), dtype=np.float32)
    return np.stack([extract_features(p) for p in programs])
