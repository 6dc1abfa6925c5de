"""Tensor shapes simplified with the bounds of the function's symbolic variables.

``torch.export`` with a dynamic sequence length bounds it (``Dim("seq", max=512)``) and TVM's
importer records the bounds (``tir_var_lower_bound`` / ``tir_var_upper_bound`` of the Relax
function), but shape inference does not use them. A position table sliced to the sequence
length (``pos[:, :seq]``, in every BERT/GPT-style encoder) then gets the shape
``(1, min(seq, 512), d)``; added to the token embeddings ``(1, seq, d)`` the sum has no
known shape at all, nor has anything after it, and ``LegalizeOps`` fails on the first
layer norm ("emit_te now only supports Tensor that has ShapeExpr shape"): the model cannot
be compiled.

``SimplifyBoundedShapes`` marks such a slice in bounds (``assume_inbound``) where the bounds
prove ``0 <= begin <= end <= dim``: its shape is then ``(1, seq, d)`` and every later binding
infers its shape again from there. (A ``match_cast`` to the simpler shape would do the same
with a run-time check, but TVM 0.27's ``CanonicalizeBindings`` crashes on it.) As in the
exported program, a length past the bound is outside the model's contract. Functions
without bounds are returned unchanged.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax
from tvm.sym import Analyzer, ConstIntBound

logger = logging.getLogger(__name__)

_BOUND_ATTRS = ("tir_var_lower_bound", "tir_var_upper_bound")


def _bounds(func: relax.Function) -> dict[str, tuple[int | None, int | None]]:
    """``{var name: (lower, upper)}`` from the function's bound attributes."""
    out: dict[str, list] = {}
    attrs = func.attrs or {}
    for which, key in enumerate(_BOUND_ATTRS):
        if key in attrs:
            for name, value in attrs[key].items():
                out.setdefault(str(name), [None, None])[which] = int(value)
    return {k: (lo, hi) for k, (lo, hi) in out.items()}


_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")


@relax.expr_functor.mutator
class _Simplifier(relax.PyExprMutator):
    """Marks a ``strided_slice`` in bounds (``assume_inbound``) where the bounds prove it: its
    shape is then ``end - begin`` instead of ``min(end, dim) - ...``, and the bindings after
    it infer their shapes again from there."""

    def __init__(self, mod: tvm.IRModule, analyzer: Analyzer) -> None:
        super().__init__(mod)
        self.analyzer = analyzer
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if (isinstance(call, relax.Call) and call.op.same_as(_STRIDED_SLICE)
                and not call.attrs.assume_inbound and self._in_bounds(call)):
            self.rewritten += 1
            data, axes, begin, end, *strides = call.args
            return relax.op.strided_slice(data, axes, begin, end, *strides,
                                          assume_inbound=True)
        return call

    def _in_bounds(self, call: relax.Call) -> bool:
        """Whether every sliced axis provably has ``0 <= begin <= end <= dim`` and stride 1."""
        data, axes, begin, end, *strides = call.args
        ty = data.ty
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            return False
        dims = ty.shape.values
        steps = list(strides[0].fields) if strides else [1] * len(axes.fields)
        prove = self.analyzer.can_prove
        for axis, b, e, step in zip(axes.fields, begin.fields, end.fields, steps):
            if not all(str(x.ty).startswith("int") for x in (axis, b, e)):
                return False  # begin/end given as relax values at run time: unknown
            axis = int(axis.value) % len(dims)
            if not (prove(step == 1) and prove(b >= 0) and prove(b <= e)
                    and prove(e <= dims[axis])):
                return False
        return True


@tvm.transform.module_pass(opt_level=0, name="SimplifyBoundedShapes")
class SimplifyBoundedShapes:
    """Simplify tensor shapes with the bounds of each Relax function's symbolic variables
    (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            bounds = _bounds(func)
            if not bounds:
                continue
            analyzer = Analyzer()
            for var in relax.analysis.defined_symbolic_vars(func):
                lo, hi = bounds.get(var.name, (None, None))
                if lo is None and hi is None:
                    continue
                lo = 0 if lo is None else lo
                hi = 2**31 - 1 if hi is None else hi
                analyzer.update(var, ConstIntBound(lo, hi), override=True)
            simplifier = _Simplifier(mod, analyzer)
            new = simplifier.visit_expr(func)
            if simplifier.rewritten:
                logger.info("%s: %d slices in bounds by %s", gv.name_hint,
                            simplifier.rewritten, bounds)
                updates[gv] = new
        if not updates:
            return mod
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in updates.items():
            mod[gv] = func
        return mod
