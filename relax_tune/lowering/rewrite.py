"""What every graph rewrite of ``lowering`` builds on: a bound constant's value, a tensor's
static shape, and a dataflow-pattern rewrite applied to every Relax function of a module."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import GenericConst
from tvm.relax.dpl import rewrite_call

# Relax's OpPatternKind values, read by FuseOps from a PrimFunc's "op_pattern" attribute:
# an elementwise call fuses into its neighbours, an opaque one is left alone.
ELEMWISE, OPAQUE = 0, 8


def constant(expr: relax.Expr) -> np.ndarray | None:
    """The value of a bound constant (None for anything computed at run time)."""
    if isinstance(expr, GenericConst):
        return expr.value.numpy()
    return None


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The shape of a tensor expression, None where it is not known or not constant."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def rewrite_functions(mod: tvm.IRModule, pattern, rewrite,
                      builder: relax.BlockBuilder | None = None) -> tvm.IRModule:
    """``mod`` with ``rewrite_call(pattern, rewrite, ...)`` applied to every Relax function
    (``mod`` itself, not a copy, when nothing matched). With ``builder`` (a BlockBuilder
    over ``mod`` that ``rewrite`` adds functions to) the result holds those too."""
    changed = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = rewrite_call(pattern, rewrite, func)
            if not new.same_as(func):
                changed[gv] = new
    if not changed:
        return mod
    out = mod if builder is None else builder.get()
    out = out.clone() if out.same_as(mod) else out  # update_func mutates in place
    for gv, new in changed.items():
        out.update_func(gv, new)
    return out


def count_calls(mod: tvm.IRModule, name: str) -> int:
    """Calls of the operator ``name`` in the Relax functions of ``mod``."""
    op, found = tvm.ir.Op.get(name), [0]

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(op):
            found[0] += 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found[0]


def rewrite_until_fixed(mod: tvm.IRModule, rules, max_rounds: int) -> tvm.IRModule:
    """``mod`` with every ``(pattern, rewrite)`` of ``rules`` applied in turn, dead code
    removed, until a round changes nothing or ``max_rounds`` rounds have run."""
    out = mod
    for _ in range(max_rounds):
        current = out
        for pattern, rewrite in rules:
            out = rewrite_functions(out, pattern, rewrite)
        if out.same_as(current):
            break
        out = relax.transform.DeadCodeElimination()(out)
        if tvm_ffi.structural_equal(out, current):  # a declined match still rebuilds
            break
    return out
