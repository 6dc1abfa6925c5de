"""A projection's rows made 2-D: ``matmul(x[b, m, k], w[k, n])`` as ``x[b*m, k] @ w``.

TVM's ONNX importer keeps a transformer's projections 3-D (``(1, 128, 1024)`` by
``(1024, 256)``, the attention's input projection even ``(128, 1, 256)``), where
``torch.export`` makes them 2-D. A 3-D matmul is another workload (its block has one more
spatial iteration), so no record of the shipped library, all of 2-D projections,
transferred to the ONNX file's BERT-class encoder: its FFN down projection ran a schedule
the pre-trained model chose, 628 us a call against 338 from PyTorch (AMD EPYC Zen 4, 2
threads, docs/results/zen4-epyc.md, session 28).

``flatten_matmul_rows`` rewrites, until nothing changes:

- ``matmul(x, w)`` with ``x`` float32 of three static dimensions and ``w`` of two ->
  ``reshape(matmul(reshape(x, [b*m, k]), w), [b, m, n])``;
- an elementwise operation of such a reshaped product and a bias (``[n]`` or ones then
  ``n``) or a scalar -> the operation on the 2-D product, reshaped after it;

so the ONNX file's projections become the tasks ``torch.export``'s are: the matmul and its
bias in one kernel, the reshape (a view) after them, and the residual add and the activation
after that, as in the PyTorch graph (``torch.export`` puts its reshape between the bias and
them). Sinking the reshape past those too fused them into the matmul, and the pre-trained
model's choices for those fused tasks, which the library does not hold, ran slower: the
ViT's matmul with bias and GELU 3.25 ms in six calls against 1.85 for the transferred matmul
and its separate GELU; the PyTorch ViT went 1.14 -> 0.95x ONNX Runtime so, the BERT-class
encoder 1.36 -> 1.44x (AMD EPYC Zen 4, 2 threads, session 28).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .rewrite import rewrite_until_fixed, static_shape
from .transpose_sinking import BINARY

MAX_ROUNDS = 16
"""Rewrite rounds at most (each moves every reshape one operation down)."""


def _dtype(expr: relax.Expr) -> str | None:
    return getattr(expr.ty, "dtype", None)


def _rules():
    """(pattern, rewrite) pairs; each rewrite returns the matched call when it declines."""
    x, w = wildcard(), wildcard()

    def matmul_rule(matched, m):
        xs, ws = static_shape(m[x]), static_shape(m[w])
        if xs is None or ws is None or len(xs) != 3 or len(ws) != 2 \
                or _dtype(m[x]) != "float32" or _dtype(m[w]) != "float32" \
                or _dtype(matched) != "float32":
            return matched
        rows = relax.op.reshape(m[x], [xs[0] * xs[1], xs[2]])
        return relax.op.reshape(relax.op.matmul(rows, m[w]), [xs[0], xs[1], ws[1]])

    rules = [(is_op("relax.matmul")(x, w), matmul_rule)]

    a, shape, other = wildcard(), wildcard(), wildcard()
    flat = is_op("relax.reshape")(a, shape)

    def flat_shapes(m) -> tuple[list[int], list[int]] | None:
        inner, outer = static_shape(m[a]), static_shape(m[flat])
        if inner is None or outer is None or len(inner) != 2 or len(outer) != 3 \
                or inner[0] != outer[0] * outer[1] or inner[1] != outer[2]:
            return None
        return inner, outer

    def binary_rule(matched, m):
        shapes, side = flat_shapes(m), static_shape(m[other])
        if shapes is None or side is None:
            return matched
        inner, outer = shapes
        if math.prod(side) != side[-1] or side[-1] not in (1, inner[1]):
            return matched  # not a bias or a scalar
        left, right = (static_shape(arg) for arg in matched.args)
        if (left == outer) == (right == outer):
            return matched  # which side is the product is not to be told by shape
        moved = relax.op.reshape(m[other], [side[-1]])
        args = [m[a], moved] if left == outer else [moved, m[a]]
        return relax.op.reshape(relax.Call(matched.op, args, matched.attrs), outer)

    for name in BINARY:
        rules.append((is_op(name)(flat, other) | is_op(name)(other, flat), binary_rule))
    return rules


def flatten_matmul_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its 3-D float projections as 2-D ones (see the module doc)."""
    return rewrite_until_fixed(mod, _rules(), MAX_ROUNDS)


@tvm.transform.module_pass(opt_level=0, name="relax_tune.FlattenMatmulRows")
class FlattenMatmulRows:
    """The pass of ``flatten_matmul_rows``."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its 3-D float projections as 2-D ones."""
        return flatten_matmul_rows(mod)
