"""Transposes moved down the graph until they meet and cancel.

``ConvertLayout`` carries the channels-last layout only through the operations it knows. A
quantized model's convolutions are followed by operations it does not know (``clip``,
``pad`` with the input's zero point, ``quantize``/``dequantize`` around a residual add,
pools between them), so after it every integer convolution of ResNet-18 ended in a
transpose back to NCHW, a kernel of clip, cast, pad and a transpose to NHWC again, with the
requantised float32 tensor written to memory in between: 44 tasks, about a third of the
tuned model's time in those kernels (Intel Xeon, 2 threads).

``sink_transposes`` rewrites, until nothing changes:

- ``u(T(x))`` -> ``T(u(x))`` for an operation ``u`` on each element alone: the unary ones
  of ``UNARY_ELEMENTWISE_OPS``, ``astype``, ``round``, and ``quantize``/``dequantize``
  with one scale and zero point for the whole tensor;
- ``b(T(x), T(y))`` -> ``T(b(x, y))`` (the same permutation on both sides) and
  ``b(T(x), c)`` -> ``T(b(x, c))`` (``c`` a scalar, or a broadcast operand such as a
  squeeze-and-excite gate, reshaped where that moves no data) for the elementwise binary
  operations;
- ``take(t, T(i))`` -> ``T(take(t, i))`` for a 1-D table ``t`` (``int8_tables``' lookups);
- ``pad(T(x))`` -> ``T(pad'(x))`` (the pad widths permuted);
- a 2-D pool of an NHWC tensor made NCHW by ``T`` -> ``T`` of the NHWC pool;
- a reduction (``mean``, ``sum``, ``max``, ``min``) of ``T(x)`` -> the reduction of ``x``
  over the same axes, transposed back where their order differs (MobileNetV2's global
  average pool, a ``mean`` over NCHW's H and W, had a 7x7x1280 transpose kernel before it);
- ``concat(T(x), T(y))`` -> ``T(concat(x, y))`` and ``split(T(x))`` -> ``T`` of each part
  of ``split(x)`` (the axis permuted);
- a channel shuffle (ShuffleNet's reshape of the channels into groups, transpose of the
  groups, reshape back) of an NHWC tensor made NCHW by ``T`` -> ``T`` of the same shuffle
  on the NHWC tensor;
- ``T2(T1(x))`` -> ``x`` (or one transpose, their composition);
- a transpose that moves only axes of extent 1 -> a reshape (no data moves).

``ConvertLayout`` carries the channels-last layout through a concatenation and a split, but
not through a channel shuffle: ShuffleNetV2 went back to NCHW at every block's shuffle,
and each block ran a transpose kernel and a shuffle kernel of strided copies.

A transpose with several users is moved down each of their paths, so it can end up
duplicated; the rewritten module is kept only when it has fewer transposes than it had.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard

from .qparams import qparams_of
from .rewrite import count_calls, rewrite_until_fixed, static_shape

UNARY_ELEMENTWISE_OPS = ("relax.clip", "relax.nn.relu", "relax.nn.leakyrelu", "relax.nn.gelu",
                         "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid", "relax.tanh",
                         "relax.exp", "relax.sqrt", "relax.negative", "relax.abs")
"""Operations that act on each element alone (scalar attributes or arguments only), which
``ConvertLayout`` does not all know: it wraps e.g. ``clip`` (MobileNet's ReLU6) in a
transpose back to NCHW and another to NHWC, a pair this pass cancels."""

UNARY = (*UNARY_ELEMENTWISE_OPS, "relax.astype", "relax.round", "relax.floor", "relax.ceil")
QUANTIZE = ("relax.quantize", "relax.dequantize")
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
          "relax.minimum")
POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d")
REDUCTIONS = ("relax.mean", "relax.sum", "relax.max", "relax.min")
NHWC_TO_NCHW = [0, 3, 1, 2]
MAX_ROUNDS = 64
"""Rewrite rounds at most (each moves every transpose at least one operation down)."""


def _ndim(expr: relax.Expr) -> int | None:
    shape = getattr(expr.ty, "shape", None)
    return None if shape is None else len(shape)


def _axes(call: relax.Call) -> list[int] | None:
    ndim = _ndim(call.args[0])
    if ndim is None:
        return None
    axes = call.attrs.axes
    return list(range(ndim))[::-1] if axes is None else [int(a) for a in axes]


def _is_scalar(expr: relax.Expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and all(d == 1 for d in shape)


def _unpermuted(y: relax.Expr, axes: list[int]) -> relax.Expr | None:
    """``y`` reshaped into ``y'`` with ``permute_dims(y', axes)`` of ``y``'s shape, where that
    moves no data (the axes of ``y`` longer than 1 keep their order: a squeeze-and-excite
    gate of shape ``(1, C, 1, 1)`` is ``(1, 1, 1, C)`` under NHWC -> NCHW), else None."""
    shape = static_shape(y)
    if shape is None or len(shape) != len(axes):
        return None
    long = [axes[i] for i in range(len(axes)) if shape[i] != 1]
    if long != sorted(long):
        return None
    moved = [1] * len(axes)
    for i, a in enumerate(axes):
        moved[a] = shape[i]
    return relax.op.reshape(y, moved)


def _transpose(x: relax.Expr, axes: list[int]) -> relax.Expr:
    return x if axes == list(range(len(axes))) else relax.op.permute_dims(x, axes)


def _rules():
    """(pattern, rewrite) pairs; each rewrite returns the matched call when it declines."""
    rules = []
    x, y = wildcard(), wildcard()
    tx = is_op("relax.permute_dims")(x)

    def unary_rule(matched, m):
        call, inner = matched, m[tx]
        if call.op.name in QUANTIZE:
            q = qparams_of(call)
            if q is None or not q.per_tensor:
                return matched
        axes = _axes(inner)
        if axes is None:
            return matched
        return _transpose(relax.Call(call.op, [m[x], *call.args[1:]], call.attrs,
                                     call.ty_args), axes)

    for name in UNARY + QUANTIZE:
        extra = 2 if name in QUANTIZE or name == "relax.clip" else 0
        rules.append((is_op(name)(tx, *[wildcard() for _ in range(extra)]), unary_rule))

    ty = is_op("relax.permute_dims")(y)

    def both_rule(matched, m):
        a, b = _axes(m[tx]), _axes(m[ty])
        if a is None or a != b or _ndim(m[x]) != _ndim(m[y]):
            return matched
        return _transpose(relax.Call(matched.op, [m[x], m[y]], matched.attrs), a)

    c = wildcard()

    def scalar_rule(matched, m):
        axes = _axes(m[tx])
        if axes is None:
            return matched
        other = m[c] if _is_scalar(m[c]) else _unpermuted(m[c], axes)
        if other is None:
            return matched
        args = [other, m[x]] if matched.args[0].same_as(m[c]) else [m[x], other]
        return _transpose(relax.Call(matched.op, args, matched.attrs), axes)

    for name in BINARY:
        rules.append((is_op(name)(tx, ty), both_rule))
        rules.append((is_op(name)(tx, c) | is_op(name)(c, tx), scalar_rule))

    table = wildcard()

    def take_rule(matched, m):
        axes, shape = _axes(m[tx]), static_shape(m[table])
        if axes is None or shape is None or len(shape) != 1 or int(matched.attrs.axis) != 0:
            return matched
        return _transpose(relax.op.take(m[table], m[x], axis=0, mode=str(matched.attrs.mode)),
                          axes)

    rules.append((is_op("relax.take")(table, tx), take_rule))

    def pad_rule(matched, m):
        axes = _axes(m[tx])
        if axes is None:
            return matched
        widths = [int(w) for w in matched.attrs.pad_width]
        inverse = [axes.index(j) for j in range(len(axes))]
        moved = [w for j in range(len(axes)) for w in widths[2 * inverse[j]:2 * inverse[j] + 2]]
        padded = relax.op.nn.pad(m[x], moved, pad_mode=str(matched.attrs.pad_mode),
                                 pad_value=float(matched.attrs.pad_value))
        return _transpose(padded, axes)

    rules.append((is_op("relax.nn.pad")(tx), pad_rule))

    def pool_rule(matched, m):
        a = matched.attrs
        if _axes(m[tx]) != NHWC_TO_NCHW or a.layout != "NCHW" or a.out_layout != "NCHW":
            return matched
        if matched.op.name == "relax.nn.adaptive_avg_pool2d":
            pooled = relax.op.nn.adaptive_avg_pool2d(m[x], a.output_size, layout="NHWC")
        else:
            make = getattr(relax.op.nn, matched.op.name.rsplit(".", 1)[1])
            pooled = make(m[x], a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
                          a.count_include_pad, layout="NHWC")
        return relax.op.permute_dims(pooled, NHWC_TO_NCHW)

    for name in POOLS:
        rules.append((is_op(name)(tx), pool_rule))

    def reduce_rule(matched, m):
        perm = _axes(m[tx])
        if perm is None or matched.attrs.axis is None:
            return matched
        make = getattr(relax.op, matched.op.name.rsplit(".", 1)[1])
        reduced = sorted({a % len(perm) for a in (int(a) for a in matched.attrs.axis)})
        moved = make(m[x], [perm[a] for a in reduced], bool(matched.attrs.keepdims))
        if matched.attrs.keepdims:
            return _transpose(moved, perm)
        kept = [perm[i] for i in range(len(perm)) if i not in reduced]
        return _transpose(moved, [sorted(kept).index(d) for d in kept])

    for name in REDUCTIONS:
        rules.append((is_op(name)(tx), reduce_rule))

    def concat_rule(matched, m):
        a, b = _axes(m[tx]), _axes(m[ty])
        if a is None or a != b or _ndim(m[x]) != _ndim(m[y]):
            return matched
        axis = a[int(matched.attrs.axis) % len(a)]
        return _transpose(relax.op.concat(relax.Tuple([m[x], m[y]]), axis), a)

    rules.append((is_op("relax.concat")(is_tuple([tx, ty])), concat_rule))

    def split_rule(matched, m):
        axes, parts = _axes(m[tx]), getattr(matched.ty, "fields", None)
        if axes is None or parts is None:
            return matched
        sections = matched.attrs.indices_or_sections
        sections = [int(i) for i in sections] if isinstance(sections, (list, tvm_ffi.Array)) \
            else int(sections)
        split = relax.op.split(m[x], sections, axes[int(matched.attrs.axis) % len(axes)])
        return relax.Tuple([_transpose(relax.TupleGetItem(split, i), axes)
                            for i in range(len(parts))])

    rules.append((is_op("relax.split")(tx), split_rule))

    grouped = is_op("relax.reshape")(tx, wildcard())
    swapped = is_op("relax.permute_dims")(grouped)

    def shuffle_rule(matched, m):
        shape = static_shape(m[x])
        groups, swap = static_shape(m[grouped]), _axes(m[swapped])
        if _axes(m[tx]) != NHWC_TO_NCHW or shape is None or groups is None \
                or swap != [0, 2, 1, 3, 4]:
            return matched
        n, h, w, c = shape
        if groups[0] != n or groups[3:] != [h, w] or groups[1] * groups[2] != c \
                or static_shape(matched) != [n, c, h, w]:
            return matched
        nhwc = relax.op.reshape(m[x], [n, h, w, groups[1], groups[2]])
        nhwc = relax.op.reshape(relax.op.permute_dims(nhwc, [0, 1, 2, 4, 3]), [n, h, w, c])
        return relax.op.permute_dims(nhwc, NHWC_TO_NCHW)

    rules.append((is_op("relax.reshape")(swapped, wildcard()), shuffle_rule))

    def double_rule(matched, m):
        inner, outer = _axes(m[tx]), _axes(matched)
        if inner is None or outer is None:
            return matched
        return _transpose(m[x], [inner[i] for i in outer])

    rules.append((is_op("relax.permute_dims")(tx), double_rule))

    def unit_rule(matched, m):
        axes, shape = _axes(matched), static_shape(m[x])
        if axes is None or shape is None:
            return matched
        if [a for a in axes if shape[a] != 1] != [a for a in range(len(shape)) if shape[a] != 1]:
            return matched  # moves data
        return relax.op.reshape(m[x], [shape[a] for a in axes])

    rules.append((tx, unit_rule))
    return rules


def sink_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its transposes moved down until they cancel (see the module doc), or
    ``mod`` itself when that leaves no fewer transposes."""
    before = count_calls(mod, "relax.permute_dims")
    if not before:
        return mod
    out = rewrite_until_fixed(mod, _rules(), MAX_ROUNDS)
    return out if count_calls(out, "relax.permute_dims") < before else mod
