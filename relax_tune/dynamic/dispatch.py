"""The dispatching function: one PrimFunc that runs each symbolic size's bucket branch.

``ApplyDatabase`` (``relax_tune.dynamic.apply``) replaces a symbolic function by
``dispatch_function``: one PrimFunc with the symbolic signature whose body is an
``if n <= l1 ... elif n <= l2 ... else`` chain, ``l`` the limits between neighbouring
buckets (``upper_limit``: nearest bucket on a log scale), each branch a bucket's record
replayed on the symbolic function (``relax_tune.dynamic.replay``). The largest bucket
also serves every size above it, in a copy of its branch whose intermediates stay symbolic
(its branch is correct at every size, and faster than the untuned function:
docs/design/dynamic-shapes.md, "Past the largest bucket"). A bucket whose best record is its baseline (the untuned
function) runs the untuned body: never slower than untuned per bucket. With a measured plan
(``relax_tune.dynamic.plan``) the branches serve the ranges timed fastest instead of the
nearest bucket's (``dispatch_function``'s ``served``).

For measuring one bucket's branch as it runs, ``dispatch_workload`` marks the symbolic
workload so that a build worker builds it with ``dispatch_module`` (the measurement's
``BUILD_WITH_ATTR`` protocol, ``relax_tune.measure._worker``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Var
from tvm.s_tir import SBlock, SBlockRealize
from tvm_ffi import DefRegionKind

from ..utils import RelaxTuneError
from .buckets import _dtype, symbolic_vars
from .replay import replay_symbolic


def dispatch_function(func: tirx.PrimFunc,
                      branches: Sequence[tuple[Mapping[str, int], tirx.PrimFunc | None]],
                      hinted: Mapping[str, Sequence[int]] | None = None,
                      served: Sequence[Sequence[Sequence[int | None]]] | None = None
                      ) -> tirx.PrimFunc:
    """One PrimFunc with ``func``'s signature that runs, for each symbolic value, the branch
    of the nearest bucket, the largest one's above it too.

    ``branches`` are ``(sizes, function)`` pairs, smallest first. A variable at size ``s``
    serves values up to ``upper_limit`` (the geometric mean of ``s`` and the next larger
    hinted size -- the branches' sizes, or ``hinted`` when given: nearest on a log scale;
    ``s`` itself for the largest). The first branch whose variables are all within their
    limits runs, then a second copy of each branch at the largest hinted size of some of
    its variables, with no limit on those (their intermediates stay symbolic there): the
    largest bucket serves every value above it too. Values no branch serves (with several
    variables) run ``func``'s body. A
    branch whose function is None runs ``func``'s body (its bucket's best record is the
    untuned function). Every branch function must be ``func`` scheduled (same parameters).

    ``served`` (a function of one symbolic variable only; ``plan``): per branch,
    the ``[low, high]`` ranges of values it serves instead, measured (``high`` None: every
    value from ``low`` up); values in no range run ``func``'s body."""
    variables = {v.name: v for v in symbolic_vars(func)}
    if hinted is None:
        hinted = {name: sorted({int(sizes[name]) for sizes, _ in branches if name in sizes})
                  for name in variables}
    if served is not None and len(variables) != 1:
        raise ValueError("served ranges need a function of one symbolic variable, not "
                         f"{sorted(variables)}")
    body = func.body
    for index in reversed(range(len(branches))):
        sizes, branch = branches[index]
        if served is not None:
            if branch is None:
                continue  # its values (if any) run func's own body
            branch = _same_params(branch, func)
            (var,) = variables.values()
            # one copy of the branch per run of adjacent ranges, its intermediates sized for
            # that run: one copy sized for the largest range it serves slows the small sizes
            # (measured: docs/design/dispatch-plan.md, "Per-range copies")
            for low, high in reversed(_merged(served[index])):
                bounds = {} if high is None else {var.name: high}
                body = tirx.IfThenElse(_in_range(var, low, high),
                                       _mark_bounds(branch.body, bounds, variables), body)
            continue
        branch = _same_params(func if branch is None else branch, func)
        cond, limits, open_cond, open_limits = None, {}, None, {}
        for name, size in sizes.items():
            var = variables[name]
            sizes_of = hinted.get(name, [size])
            limits[name] = upper_limit(int(size), sizes_of)
            term = var <= tirx.IntImm(_dtype(var), limits[name])
            cond = term if cond is None else tirx.And(cond, term)
            if int(size) < max(int(s) for s in sizes_of):
                open_limits[name] = limits[name]
                open_cond = term if open_cond is None else tirx.And(open_cond, term)
        if open_limits != limits:
            # the largest bucket also serves every value above it, in a copy of its own
            # whose intermediates stay symbolic: the copy up to its size keeps them sized
            # for it (measured: docs/design/dynamic-shapes.md, "Past the largest bucket")
            above = _mark_bounds(branch.body, open_limits, variables)
            body = above if open_cond is None else tirx.IfThenElse(open_cond, above, body)
        body = tirx.IfThenElse(cond, _mark_bounds(branch.body, limits, variables), body)
    # an implicit root block around it all, as TVMScript's parser makes for an s_tir function
    root = SBlock([], [], [], "root", body)
    return func.with_body(SBlockRealize([], tirx.const(True, "bool"), root))


def _merged(ranges: Sequence[Sequence[int | None]]) -> list[tuple[int, int | None]]:
    """The inclusive ``[low, high]`` ``ranges`` sorted, adjacent and overlapping ones merged;
    the unbounded ones (``high`` None) last, merged into one of their own from the lowest
    ``low`` (a bounded range next to it keeps its copy with its intermediates sized)."""
    merged: list[list[int]] = []
    for low, high in sorted((int(a), int(b)) for a, b in ranges if b is not None):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    out: list[tuple[int, int | None]] = [(low, high) for low, high in merged]
    lows = [int(a) for a, b in ranges if b is None]
    if lows:
        out.append((min(lows), None))
    return out


def _in_range(var: tirx.Var, low: int, high: int | None):
    """The condition ``low <= var <= high`` (for a size, ``var <= high`` when ``low`` is 1;
    ``low <= var`` when ``high`` is None)."""
    value = lambda x: tirx.IntImm(_dtype(var), x)  # noqa: E731
    if high is None:
        return value(low) <= var
    if low == high:
        return var == value(low)
    if low <= 1:
        return var <= value(high)
    return tirx.And(value(low) <= var, var <= value(high))


def _mark_bounds(stmt, limits: Mapping[str, int], variables: Mapping) -> tirx.Stmt:
    """A copy of ``stmt`` (a branch's body) with definitions of its own, so that no loop
    variable or buffer is defined twice in the dispatching function (the compiler rejects
    that), and its root block's intermediate buffers sized for the largest value of each
    symbolic variable its branch serves (``limits``; none: they stay symbolic).

    An intermediate of shape ``(1, 8, n, n)`` allocated in a branch that runs for
    ``n <= 362`` becomes ``(1, 8, 362, 362)``: every access stays below ``n``. What matters is
    what TVM's buffer compaction makes of it: a tile of a symbolic buffer comes out as
    ``(2, min(n, 64), min(n, 256))`` with symbolic strides, which made the Llama block's
    q k^T + causal mask several times slower than the static kernel at the bucket's own size
    (measured: docs/design/dynamic-shapes.md, "Intermediates sized per branch"); with a
    constant shape the tile is constant too. Only dimensions that are exactly a symbolic
    variable are replaced (anything else is left symbolic)."""
    bounds = {name: tirx.IntImm(_dtype(variables[name]), int(limit))
              for name, limit in limits.items()}
    sized = set()
    if isinstance(stmt, SBlockRealize) and bounds:
        sized = {hash(buf) for buf in stmt.block.alloc_buffers}
    renewed: dict[int, Var] = {}

    def renew(var: Var, kind: DefRegionKind) -> Var:
        # definitions come before their uses in the walk; a definition met again (the two
        # copies of an unswitched tile share theirs) gets another new variable
        key = hash(var)
        if kind == DefRegionKind.NONE:
            return renewed.get(key, var)
        ty = var.ty
        if key in sized and isinstance(ty, tirx.BufferType):
            shape = [bounds.get(dim.name, dim) if isinstance(dim, Var) else dim
                     for dim in ty.shape]
            ty = tirx.BufferType(ty.dtype, ty.storage_scope, shape, ty.strides,
                                 ty.elem_offset, ty.data_alignment, ty.offset_factor,
                                 ty.layout, ty.allocated_addr)
        renewed[key] = Var(var.name, ty)
        return renewed[key]

    return tvm_ffi.structural_map(stmt, with_def_region_kind=((Var,), renew), order="pre")


# ------------------------------------------------------------------------------------------
# One bucket's branch as it runs, for measuring it

DISPATCH_KEY = "relax_tune.dispatch"
"""Function attribute of a symbolic workload sent to a build worker: build the dispatch of
one bucket (``{"sizes": {var: size}, "hinted": {var: [sizes]}}``, and ``"serves": [[low,
high], ...]`` when it serves those ranges, ``plan``) instead of replaying
the trace on the workload itself (``dispatch_workload``, ``dispatch_module``)."""

BUILDER = f"{__name__}:dispatch_module"
"""What a marked workload names as its builder (the measurement's ``BUILD_WITH_ATTR``)."""


def dispatch_workload(symbolic: tvm.IRModule, sizes: Mapping[str, int],
                      hinted: Mapping[str, Sequence[int]],
                      serves: Sequence[Sequence[int]] | None = None) -> tvm.IRModule:
    """The symbolic workload ``symbolic`` marked to be built as the dispatch of its bucket at
    ``sizes`` (limits from all ``hinted`` sizes; or the ``[low, high]`` ranges ``serves``,
    ``dispatch_function``'s ``served``) by a build worker: it names ``dispatch_module`` as
    its builder (``BUILD_WITH_ATTR``, ``relax_tune.measure._worker``)."""
    from ..measure._worker import BUILD_WITH_ATTR

    spec = {"sizes": {str(k): int(v) for k, v in sizes.items()},
            "hinted": {str(k): [int(x) for x in v] for k, v in hinted.items()}}
    if serves is not None:
        spec["serves"] = [[int(low), None if high is None else int(high)]
                          for low, high in serves]
    func = symbolic["main"].with_attr(DISPATCH_KEY, json.dumps(spec))
    return tvm.IRModule({"main": func.with_attr(BUILD_WITH_ATTR, BUILDER)})


def dispatch_module(mod: tvm.IRModule, trace_json: list | None) -> tvm.IRModule | str:
    """What ``ApplyDatabase`` makes of one record of a bucket, for a workload marked by
    ``dispatch_workload`` (a build worker calls it, ``BUILD_WITH_ATTR``): the dispatch whose
    bucket branch is ``trace_json`` replayed on the symbolic function (None: the untuned
    function), every other size running the untuned body; or, when the trace does not
    replay there, why (the candidate's build error)."""
    from ..measure._worker import BUILD_WITH_ATTR
    from ..measure.base import short_error

    try:
        func = mod["main"]
        spec = json.loads(str(func.attrs[DISPATCH_KEY]))
        base = tvm.IRModule({"main": func.without_attr(DISPATCH_KEY)
                             .without_attr(BUILD_WITH_ATTR)})
        if trace_json is None:
            return base
        sizes = {k: int(v) for k, v in spec["sizes"].items()}
        branch = replay_symbolic(base, trace_json, sizes)
        served = [spec["serves"]] if "serves" in spec else None
        return tvm.IRModule({"main": dispatch_function(base["main"], [(sizes, branch)],
                                                       spec["hinted"], served)})
    except Exception as err:  # noqa: BLE001 - ScheduleError, TVMError, ...
        return "does not replay on the symbolic function: " + short_error(err)


def upper_limit(size: int, sizes: Sequence[int]) -> int:
    """The largest value the bucket at ``size`` serves among the hinted ``sizes``: up to the
    geometric mean with the next larger size (the nearest bucket on a log scale), ``size``
    itself for the largest (which ``dispatch_function`` lets serve every size above it)."""
    larger = [s for s in sorted(sizes) if s > size]
    if not larger:
        return int(size)
    return max(int(size), int(math.isqrt(int(size) * larger[0])))


def _same_params(branch: tirx.PrimFunc, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``branch``, checked to be ``func`` scheduled: the very same parameters."""
    if len(branch.params) != len(func.params) or not all(
            a.same_as(b) for a, b in zip(branch.params, func.params)):
        raise RelaxTuneError("a dispatch branch does not share the function's parameters")
    return branch
