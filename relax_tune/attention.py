"""Attention as one kernel: ``softmax(scores) @ v`` with the scores' producer, fused.

A transformer's attention is three kernels after TVM's FuseOps: the scores (``q @ k^T``,
scaled, perhaps masked), the softmax over each row, and the product with ``v``. At a
sequence length n, each head's n x n score matrix is written by the first, read and
written by the second and read by the third: at n = 512 and 12 heads that is 12 MB per
pass, more than the cores' caches, and the three kernels of BERT's attention took 6.7 ms
where PyTorch's fused ``scaled_dot_product_attention`` took 5.3 (AMD EPYC Zen 4, 2 threads).

``FuseAttention`` groups ``matmul(softmax(scores), v)`` together with the scores' producer
(a ``matmul``, optionally scaled by a constant ``multiply`` or masked by a ``call_tir``
reading it) into one primitive function, which ``FuseTIR`` makes one PrimFunc. The design
space then schedules it as SDPA does (``space.attention.FusedAttention``): for each head
and block of rows, the block's scores, softmax and product with ``v`` are computed while
the scores stay in cache. CPU targets only (the GPU space has no such rule).
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple, wildcard

logger = logging.getLogger("relax_tune.attention")

PATTERN_NAME = "relax_tune.attention"
"""The ``Composite`` name of the fused attention functions."""


def attention_pattern():
    """``(pattern, annotations)``: ``matmul(softmax(S), v)`` where S is ``matmul(q, k)``,
    that scaled by a constant, or a ``call_tir`` (a mask) of either; the annotations name
    the softmax and the scores' matmul."""
    scores = is_op("relax.matmul")(wildcard(), wildcard())
    scaled = scores | is_op("relax.multiply")(scores, is_const())
    masked = scaled | is_op("relax.call_tir")(wildcard(), is_tuple([scaled]))
    softmax = is_op("relax.nn.softmax")(masked)
    return is_op("relax.matmul")(softmax, wildcard()), {"softmax": softmax, "scores": scores}


def _fusable(ctx: relax.transform.PatternCheckContext) -> bool:
    """A softmax over the last axis of a 4-d float32 score tensor (batch, heads, rows, keys),
    what the fused schedule computes row by row, whose intermediate results (scores,
    softmax) are used by the attention alone."""
    call = ctx.annotated_expr["softmax"]
    ty = call.ty
    if getattr(ty, "ndim", -1) != 4 or str(ty.dtype) != "float32" \
            or int(call.attrs.axis) not in (-1, 3):
        return False
    for var, value in ctx.matched_bindings.items():
        if not value.same_as(ctx.matched_expr) and len(ctx.var_usages.get(var, [])) > 1:
            return False
    return True


@tvm.transform.module_pass(opt_level=0, name="relax_tune.FuseAttention")
class FuseAttention:
    """Group each attention (``attention_pattern``) into one primitive function; run before
    ``LegalizeOps``, so that ``FuseTIR`` turns each into one PrimFunc."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its attentions grouped (``mod`` unchanged when there is none)."""
        fuse = relax.transform.FuseOpsByPattern(
            [(PATTERN_NAME, *attention_pattern(), _fusable)],
            bind_constants=True, annotate_codegen=False)
        out = fuse(mod)
        fused = [gv for gv, f in out.functions.items()
                 if isinstance(f, relax.Function) and f.attrs is not None
                 and f.attrs.get("Composite") == PATTERN_NAME]
        if not fused:
            return out
        logger.info("%d attention(s) fused into one kernel each", len(fused))
        return _renamed(out, fused, "attention")


@relax.expr_functor.mutator
class _GlobalVarRenamer(relax.PyExprMutator):
    """Replaces references to the global vars of ``mapping`` by their new ones."""

    def __init__(self, mapping: dict, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mapping = mapping

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:  # noqa: D102
        return self.mapping.get(op, op)


def _renamed(mod: tvm.IRModule, gvs: list, stem: str) -> tvm.IRModule:
    """``mod`` with the functions ``gvs`` named ``stem``, ``stem1``, ...: the kernels (and
    the tasks) then say what they are, not the list of operators they came from."""
    taken = {gv.name_hint for gv in mod.get_global_vars()}
    mapping = {}
    for gv in gvs:
        name, i = stem, 0
        while name in taken:
            i += 1
            name = f"{stem}{i}"
        taken.add(name)
        mapping[gv] = relax.GlobalVar(name)
        relax.expr._update_type(mapping[gv], gv.ty)
    renamer = _GlobalVarRenamer(mapping, mod)
    out = tvm.IRModule({}, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = renamer.visit_expr(func)
        out[mapping.get(gv, gv)] = func
    return out
