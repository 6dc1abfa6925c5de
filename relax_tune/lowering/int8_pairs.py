"""``MarkNarrowWeightPairs``: the integer kernels whose constant weights AVX2's
``vpmaddubsw`` multiplies exactly, marked for the design space.

``vpmaddubsw`` sums each pair of u8 x s8 products into a saturating s16, so with u8
activations it is exact only where every pair of weights it sums has ``|w0| + |w1| <= 128``
(``space.cpu.int8_intrin.NARROW_PAIRS_ATTR``). That holds for every weight quantized to
7 bits (ONNX Runtime's ``reduce_range=True``, which its quantizer recommends for x86 CPUs
without VNNI) and for some 8-bit layers. The weights are constants only here, in the Relax
module that calls the kernel; the kernel, the task and the design space see a buffer. So
after ``FuseTIR`` this pass reads the constant each call site passes as a kernel's weight,
checks the pairs along the axis the packed tile pairs them
(``space.cpu.int8_dot.narrow_pair_weight``), and marks the PrimFunc when every call site's
weight passes. The mark is part of the workload: a marked and an unmarked layer are
different tasks, and a record of one never serves the other.

Only for targets whose int8 instruction has a narrow variant (AVX2 without VNNI), so the
workloads of other targets keep their hashes.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from .rewrite import constant
from ..space.cpu.int8_dot import narrow_pair_weight
from ..space.cpu.int8_intrin import (NARROW_PAIR_LIMIT, NARROW_PAIRS_ATTR, int8_dot_intrinsic,
                                     narrow_variant)


def pairs_fit(weight: np.ndarray, axis: int) -> bool:
    """Whether every pair ``(2i, 2i + 1)`` of int8 ``weight`` along ``axis`` has
    ``|w0| + |w1| <= NARROW_PAIR_LIMIT`` (an odd length: False)."""
    if weight.dtype != np.int8 or weight.shape[axis] % 2:
        return False
    w = np.abs(np.moveaxis(weight, axis, -1).astype(np.int32))
    return bool(((w[..., 0::2] + w[..., 1::2]) <= NARROW_PAIR_LIMIT).all())


def _call_sites(mod: tvm.IRModule) -> dict[str, list[list]]:
    """The argument lists of every ``call_tir`` site, by callee name."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    sites: dict[str, list[list]] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) \
                and isinstance(expr.args[0], tvm.ir.GlobalVar) \
                and isinstance(expr.args[1], relax.Tuple):
            sites.setdefault(expr.args[0].name_hint, []).append(list(expr.args[1].fields))

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


def _fits_everywhere(func: tirx.PrimFunc, calls: list[list], lanes: int, depth: int) -> bool:
    found = narrow_pair_weight(func, lanes, depth)
    if found is None or not calls:
        return False
    index, axis = found
    for args in calls:
        weight = constant(args[index]) if index < len(args) else None
        if weight is None or list(weight.shape) != [int(d) for d in func.params[index].shape] \
                or not pairs_fit(weight, axis):
            return False
    return True


def MarkNarrowWeightPairs(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """The pass (see the module docstring); it changes nothing for a target without a narrow
    variant of its int8 instruction."""

    @tvm.transform.module_pass(opt_level=0, name="relax_tune.MarkNarrowWeightPairs")
    def _mark(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        intrinsic = int8_dot_intrinsic(target)
        narrow = None if intrinsic is None else narrow_variant(intrinsic)
        if narrow is None:
            return mod
        out, sites = mod, None
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc) or not _has_int8_reduction(func):
                continue
            sites = _call_sites(mod) if sites is None else sites
            if _fits_everywhere(func, sites.get(gv.name_hint, []), narrow.lanes, narrow.depth):
                out = out.clone() if out is mod else out  # update_func mutates in place
                out.update_func(gv, func.with_attr(NARROW_PAIRS_ATTR, True))
        return out

    return _mark


def _has_int8_reduction(func: tirx.PrimFunc) -> bool:
    """A cheap first test: some parameter is int8 and some is uint8."""
    dtypes = {str(p.dtype) for p in func.params}
    return "int8" in dtypes and "uint8" in dtypes
