"""Elementwise ``call_tir`` kernels raised back to the Relax operators they compute.

TVM's ONNX importer writes some operators as kernels of its own at import time
(``bb.emit_te``): ``Clip`` becomes ``call_tir(maximum, (x, lo))`` and
``call_tir(minimum, (.., hi))``. Relax passes see only an opaque call there, so
``ConvertLayout`` wraps each one in a transpose back to NCHW and another to channels-last,
and ``FuseOps`` cannot fuse it into the convolution before it: MobileNetV2 from ONNX
compiled to 57 ms with a tuned work_dir against 7.6 ms for the same network from PyTorch
(AMD EPYC, AVX2, 2 threads), every ReLU6 a separate NCHW round trip.

``RaiseElementwiseCalls`` replaces a ``call_tir`` whose PrimFunc is one elementwise binary
operation (``max``, ``min``, ``+``, ``-``, ``*``, ``/``) of a tensor read at the output's
own indices and a 0-d tensor (or two tensors of the output's shape) with the Relax
operator of the same meaning, and then ``minimum(maximum(x, lo), hi)`` with constant bounds
with ``clip(x, lo, hi)``, the operator the layout and integer passes know. Anything else is
left as it is.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.s_tir.stmt import SBlockRealize

from .rewrite import constant, rewrite_functions

BINARY_OPS = {tirx.Max: relax.op.maximum, tirx.Min: relax.op.minimum, tirx.Add: relax.op.add,
              tirx.Sub: relax.op.subtract, tirx.Mul: relax.op.multiply,
              tirx.Div: relax.op.divide}
"""TIR's binary expressions and the Relax operators of the same meaning (``Div`` is TIR's
exact division: of floats only, checked below)."""


def _single_block(func: tirx.PrimFunc):
    """The one computing block of ``func`` under its root (None if there are more)."""
    stmt = func.body
    if isinstance(stmt, SBlockRealize):
        stmt = stmt.block.body
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt.block if isinstance(stmt, SBlockRealize) else None


def _reads_at(access, buffer, indices) -> bool:
    """Whether ``access`` (a load or the store) is of ``buffer`` at exactly ``indices`` (a
    0-d buffer at none). TVM 0.27 reads a parameter's buffer by a ``TensorLoad`` of the
    parameter itself."""
    source = getattr(access, "source", None)
    if source is None:
        source = getattr(access, "buffer", None)
    return (source is not None and source.same_as(buffer)
            and len(access.indices) == len(indices)
            and all(a.same_as(b) for a, b in zip(access.indices, indices)))


def elementwise_op(func: tirx.PrimFunc):
    """The Relax operator ``func`` computes, when it is ``out[i] = a[i] op b[()]`` or
    ``out[i] = a[i] op b[i]`` over every index of ``out`` (params ``a, b, out`` in that
    order); None for anything else."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) != 3:
        return None
    a, b, out = func.params
    block = _single_block(func)
    if block is None or not isinstance(block.body, tirx.BufferStore):
        return None
    store = block.body
    indices = [iv.var for iv in block.iter_vars]
    spatial = all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)
    full = len(indices) == len(out.shape) and all(
        tvm_ffi.structural_equal(iv.dom.extent, n) for iv, n in zip(block.iter_vars, out.shape))
    value = store.value
    make = BINARY_OPS.get(type(value))
    if (make is None or not spatial or not full
            or not _reads_at(store, out, indices) or not _reads_at(value.a, a, indices)
            or a.dtype != out.dtype or b.dtype != out.dtype
            or (make is relax.op.divide and not out.dtype.startswith("float"))):
        return None
    if _reads_at(value.b, b, []) or (_reads_at(value.b, b, indices)
                                     and len(b.shape) == len(out.shape)):
        return make
    return None


@tvm.transform.module_pass(opt_level=0, name="relax_tune.RaiseElementwiseCalls")
class RaiseElementwiseCalls:
    """Elementwise ``call_tir`` kernels (ONNX's ``Clip`` as imported by TVM) as the Relax
    operators they compute, so layout conversion and fusion see through them (module
    doc)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its elementwise ``call_tir`` calls raised; the PrimFuncs nothing
        calls any more are dropped."""
        raisable = {gv: op for gv, f in mod.functions.items()
                    if isinstance(f, tirx.PrimFunc) and (op := elementwise_op(f)) is not None}
        if not raisable:
            return mod
        call_tir = tvm.ir.Op.get("relax.call_tir")

        @relax.expr_functor.mutator
        class Raise(relax.PyExprMutator):
            def visit_call_(self, call):  # noqa: N802 (the visitor's name)
                call = super().visit_call_(call)
                if not call.op.same_as(call_tir) or call.args[0] not in raisable:
                    return call
                args = call.args[1]
                if not isinstance(args, relax.Tuple) or len(args.fields) != 2:
                    return call
                return raisable[call.args[0]](*args.fields)

        out = mod.clone()
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                out.update_func(gv, Raise(out).visit_expr(func))
        # the importer computes Clip's bounds (NaN guards on constants): fold them first
        return relax.transform.DeadCodeElimination()(clips(relax.transform.FoldConstant()(out)))


def clips(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``minimum(maximum(x, lo), hi)`` as ``clip(x, lo, hi)`` where the bounds
    are scalar constants with lo <= hi."""
    x, lo, hi = wildcard(), is_const(), is_const()
    pattern = is_op("relax.minimum")(is_op("relax.maximum")(x, lo), hi)

    def rewrite(matched, m):
        low, high = constant(m[lo]), constant(m[hi])
        if low is None or high is None or low.size != 1 or high.size != 1 \
                or low.item() > high.item():
            return matched
        return relax.op.clip(m[x], float(low.item()), float(high.item()))

    return rewrite_functions(mod, pattern, rewrite)
