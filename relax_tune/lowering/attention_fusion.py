"""Attention as one kernel: ``softmax(scores) @ v`` with the scores' producer, fused.

A transformer's attention is three kernels after TVM's FuseOps: the scores (``q @ k^T``,
scaled, perhaps masked), the softmax over each row, and the product with ``v``. At a
sequence length n, each head's n x n score matrix is written by the first, read and
written by the second and read by the third: at n = 512 and 12 heads that is 12 MB per
pass, more than the cores' caches, and the three kernels of BERT's attention were slower
than PyTorch's fused ``scaled_dot_product_attention`` (docs/design/fused-attention.md).

``FuseAttention`` groups ``matmul(softmax(scores), v)`` together with the scores' producer
(a ``matmul``, optionally scaled by a constant ``multiply`` or masked by a ``call_tir``
reading it) into one primitive function, after writing each ``R.nn.attention`` without a
causal mask (what TVM's PyTorch frontend makes of ``scaled_dot_product_attention``; TVM
legalizes it into one kernel holding the whole ``heads x n x n`` scores) and PyTorch's own
decomposition of it (``torch.export`` of ``nn.MultiheadAttention``: 3-d batched matmuls
around a 4-d softmax, with a guard that zeroes rows whose scores are all ``-inf``) in those
terms, which ``FuseTIR`` makes one PrimFunc. An attention over a static number of keys
that is no multiple of ``KEY_MULTIPLE`` (a ViT's 197 tokens) is written on padded operands
first (``padded_attention``). The design space then schedules it as SDPA does
(``space.attention.FusedAttention``): for each head and block of rows, the block's scores,
softmax and product with ``v`` are computed while the scores stay in cache. CPU targets
only (the GPU space has no such rule).
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import relax, te
from tvm.relax.dpl import is_const, is_op, is_tuple, wildcard

from .rewrite import constant, rewrite_functions, static_shape

logger = logging.getLogger(__name__)

PATTERN_NAME = "relax_tune.attention"
"""The ``Composite`` name of the fused attention functions."""


KEY_MULTIPLE = 16
"""A static number of keys is fused as a multiple of this (the widest vector of float32
keys), padded to one where it is not (``padded_attention``): in a static kernel the last,
partial vector of keys is predicated, and TVM then runs the whole vectorised loop scalar
(ViT's 197 tokens ran several times slower fused than as three kernels;
docs/design/fused-attention.md). A symbolic one is fine: ``dynamic.unswitch_partial_tiles``
runs the full vectors unpredicated."""


PADDED_KEY_SCORE = -1e30
"""The score a padded key gets: its exponential is 0 (``fast_exp`` clamps its input at
-88.4; without fast math, exp underflows), so the softmax over the padded keys is the
softmax over the real ones."""


def padded_attention(q, k, v, scale: float | None, shape: list[int],
                     builder: relax.BlockBuilder) -> relax.Expr:
    """``softmax(q @ k * scale) @ v`` on 4-d operands (``q`` (b, h, rows, d), ``k`` (b, h,
    d, keys), ``v`` (b, h, keys, dv); ``shape``: the scores' ``[b, h, rows, keys]``, keys
    static and no multiple of ``KEY_MULTIPLE``), computed on rows and keys padded with
    zeros to multiples of it, the padded keys' scores set to ``PADDED_KEY_SCORE`` by a
    kernel added to ``builder``'s module (``key_mask_func``; a tensor constant cannot enter
    the fused kernel); the padded rows are sliced off. The fused kernel then runs whole
    vectors of keys, and its blocks of rows divide the rows: ViT's 197 tokens (a prime) as
    208."""
    op = relax.op
    *batch, rows, keys = shape
    padded_rows, padded_keys = (-(-n // KEY_MULTIPLE) * KEY_MULTIPLE for n in (rows, keys))

    def pad(x, axis: int, to: int, size: int) -> relax.Expr:
        if to == size:
            return x
        width = [0] * 8
        width[2 * axis + 1] = to - size
        return op.nn.pad(x, width)

    scores = op.matmul(pad(q, 2, padded_rows, rows), pad(k, 3, padded_keys, keys))
    if scale is not None:
        scores = op.multiply(scores, relax.const(scale, "float32"))
    padded = [*batch, padded_rows, padded_keys]
    mask = builder.add_func(key_mask_func(padded, keys), "attention_key_mask")
    probs = op.nn.softmax(relax.call_tir(mask, [scores], relax.TensorType(padded, "float32")),
                          axis=-1)
    out = op.matmul(probs, pad(v, 2, padded_keys, keys))
    return op.strided_slice(out, [2], [0], [rows]) if padded_rows != rows else out


def key_mask_func(shape: list[int], keys: int) -> tvm.tirx.PrimFunc:
    """The kernel of ``padded_attention``'s mask: scores of ``shape`` (the keys last) with
    those past the first ``keys`` set to ``PADDED_KEY_SCORE``."""
    dims = [tvm.tirx.IntImm("int64", n) for n in shape]  # as LegalizeOps shapes them
    scores = te.placeholder(dims, "float32", "scores")
    masked = te.compute(dims, lambda *i: tvm.tirx.Select(
        i[-1] < tvm.tirx.IntImm("int64", keys), scores(*i),
        tvm.tirx.const(PADDED_KEY_SCORE, "float32")), name="T_key_mask")
    # no global symbol: the module names it (as the function's own, "main", it clashed)
    return te.create_prim_func([scores, masked]).without_attr("global_symbol")


def _padded_shape(shape: list) -> list[int] | None:
    """The scores' shape ``[b, h, rows, keys]`` as ints where the attention is fused on
    padded operands (``padded_attention``): all static, the keys no multiple of
    ``KEY_MULTIPLE``; None otherwise."""
    if not all(isinstance(n, (int, tvm.tirx.IntImm)) for n in shape) \
            or not int(shape[-1]) % KEY_MULTIPLE:
        return None
    return [int(n) for n in shape]


def _keys_fit(keys) -> bool:
    """Whether a number of keys (a dimension of a Relax shape) can be fused: symbolic or a
    multiple of ``KEY_MULTIPLE``."""
    return not (isinstance(keys, (int, tvm.tirx.IntImm)) and int(keys) % KEY_MULTIPLE)


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
    what the fused schedule computes row by row, over a symbolic number of keys or a
    multiple of ``KEY_MULTIPLE``, whose intermediate results (scores, softmax) are used by
    the attention alone."""
    call = ctx.annotated_expr["softmax"]
    ty = call.ty
    if getattr(ty, "ndim", -1) != 4 or str(ty.dtype) != "float32" \
            or int(call.attrs.axis) not in (-1, 3):
        return False
    if not _keys_fit(ty.shape[3] if ty.shape is not None else None):
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
        builder = relax.BlockBuilder(mod)
        rewritten = rewrite_functions(mod, is_op("relax.nn.attention")(
            wildcard(), wildcard(), wildcard()), lambda e, m: _decomposed(e, builder), builder)
        pattern, parts = _torch_math_attention()
        builder = relax.BlockBuilder(rewritten)
        rewritten = rewrite_functions(rewritten, pattern,
                                       lambda e, m: _unguarded(e, m, parts, builder), builder)
        pattern, parts = _plain_attention()
        builder = relax.BlockBuilder(rewritten)
        rewritten = rewrite_functions(rewritten, pattern,
                                       lambda e, m: _padded_plain(e, m, parts, builder), builder)
        if rewritten is not mod:  # the rewritten parts' old bindings would count as uses
            rewritten = relax.transform.DeadCodeElimination()(rewritten)
        out = relax.transform.FuseOpsByPattern(
            [(PATTERN_NAME, *attention_pattern(), _fusable)],
            bind_constants=True, annotate_codegen=False)(rewritten)
        fused = [gv for gv, f in out.functions.items()
                 if isinstance(f, relax.Function) and f.attrs is not None
                 and f.attrs.get("Composite") == PATTERN_NAME]
        if not fused:
            return out
        logger.info("attention fused into one kernel: %s",
                    ", ".join(gv.name_hint for gv in fused))
        return _renamed(out, fused, "attention")


def _decomposed(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr:
    """``R.nn.attention(q, k, v)`` (each (batch, seq, heads, dim), float32, no causal mask,
    keys that ``_keys_fit`` or are padded: ``_padded_shape``) as permutes, ``matmul``, a
    scale, ``softmax`` and ``matmul``; ``call`` itself otherwise."""
    q, k, v = call.args[:3]
    types = [getattr(a, "ty", None) for a in (q, k, v)]
    if call.attrs.causal_mask is not None or any(
            getattr(t, "ndim", -1) != 4 or str(t.dtype) != "float32" for t in types):
        return call
    dim = types[0].shape[3] if types[0].shape is not None else None
    if not isinstance(dim, tvm.tirx.IntImm) or types[1].shape is None:
        return call
    (b, rows, h, _), keys = types[0].shape.values, types[1].shape[1]
    padded = _padded_shape([b, h, rows, keys])
    if padded is None and not _keys_fit(keys):
        return call
    scale = call.attrs.scale
    scale = float(getattr(scale, "value", scale)) if scale is not None \
        else 1.0 / math.sqrt(int(dim))
    op = relax.op
    q, k, v = (op.permute_dims(q, [0, 2, 1, 3]), op.permute_dims(k, [0, 2, 3, 1]),
               op.permute_dims(v, [0, 2, 1, 3]))
    if padded is not None:
        out = padded_attention(q, k, v, scale, padded, builder)
    else:
        scores = op.multiply(op.matmul(q, k), relax.const(scale, "float32"))
        out = op.matmul(op.nn.softmax(scores, axis=-1), v)
    return op.permute_dims(out, [0, 2, 1, 3])


def _plain_attention():
    """``(pattern, parts)`` of ``matmul(softmax(matmul(q, k) [* c]), v)``: what TVM's ONNX
    importer and hand-written Relax make of an attention."""
    q, k, v, scale = wildcard(), wildcard(), wildcard(), is_const()
    scores = is_op("relax.matmul")(q, k)
    scaled = scores | is_op("relax.multiply")(scores, scale)
    probs = is_op("relax.nn.softmax")(scaled)
    return is_op("relax.matmul")(probs, v), {"q": q, "k": k, "v": v, "scale": scale,
                                             "probs": probs}


def _padded_plain(matched: relax.Expr, matches: dict, parts: dict,
                  builder: relax.BlockBuilder) -> relax.Expr:
    """The attention ``matched`` (``_plain_attention``) as ``padded_attention`` where its
    operands and float32 scores are 4-d and static, with a number of keys that is no
    multiple of ``KEY_MULTIPLE``, and its scale a scalar; ``matched`` itself otherwise (a
    multiple of it is fused as it is)."""
    q, k, v = (matches[parts[name]] for name in "qkv")
    probs = matches[parts["probs"]]
    scores = probs.args[0]
    shape = static_shape(scores)
    if shape is None or len(shape) != 4 or str(scores.ty.dtype) != "float32" \
            or int(probs.attrs.axis) not in (-1, 3) or _padded_shape(shape) is None \
            or any(len(static_shape(x) or ()) != 4 for x in (q, k, v)):
        return matched  # a broadcast operand: its padded axes are not 2 and 3
    scale = constant(matches[parts["scale"]]) if parts["scale"] in matches else None
    if scale is not None and scale.size != 1:
        return matched
    return padded_attention(q, k, v, None if scale is None else float(scale.reshape(())),
                            shape, builder)


def _torch_math_attention():
    """``(pattern, parts)`` of PyTorch's decomposed attention (see the module docstring):
    ``matmul(reshape(broadcast_to(where(guard, 0, softmax(S)))), v3)`` with
    ``S = reshape(matmul(q3, k3))`` and the guard ``not any(S != -inf)`` over each row."""
    q3, k3, v3 = wildcard(), wildcard(), wildcard()
    scores = is_op("relax.reshape")(is_op("relax.matmul")(q3, k3), wildcard())
    finite = is_op("relax.logical_not")(is_op("relax.equal")(scores, is_const()))
    row_any = is_op("relax.astype")(is_op("relax.max")(is_op("relax.astype")(finite)))
    guard = is_op("relax.logical_not")(row_any)
    softmax = is_op("relax.nn.softmax")(scores)
    zeros = is_const() | is_op("relax.full_like")(softmax, is_const())  # the latter: dynamic
    probs = is_op("relax.where")(guard, zeros, softmax)
    flat = is_op("relax.reshape")(is_op("relax.broadcast_to")(probs, wildcard()), wildcard())
    out = is_op("relax.matmul")(flat, v3)
    return out, {"q3": q3, "k3": k3, "v3": v3, "scores": scores}


def _unguarded(matched: relax.Expr, matches: dict, parts: dict,
               builder: relax.BlockBuilder) -> relax.Expr:
    """The attention ``matched`` as ``matmul(softmax(matmul(q, k)), v)`` on 4-d views
    (1, batch x heads, rows, dim) of its 3-d operands, without the guard: a row of scores is
    all ``-inf`` only under a mask, and this pattern has none (unmasked scores are ``-inf``
    only when ``q . k`` overflows), on padded operands where ``_padded_shape`` says so.
    ``matched`` itself when a shape is unknown or symbolic keys do not ``_keys_fit`` (it
    would not be fused); symbolic dimensions (a dynamic sequence length) are fine."""
    q3, k3, v3 = (matches[parts[name]] for name in ("q3", "k3", "v3"))
    scores = matches[parts["scores"]]
    try:
        shapes = [list(e.ty.shape.values) for e in (q3, k3, v3, matched, scores)]
    except (TypeError, AttributeError):  # no type or no ShapeExpr
        return matched
    if any(len(shape) != 3 for shape in shapes[:4]) or len(shapes[4]) != 4 \
            or str(scores.ty.dtype) != "float32":
        return matched
    padded = _padded_shape([1, *shapes[0][:2], shapes[4][3]])
    if padded is None and not _keys_fit(shapes[4][3]):
        return matched
    op = relax.op
    q, k, v = (op.reshape(e, [1, *shape]) for e, shape in zip((q3, k3, v3), shapes))
    if padded is not None:
        return op.reshape(padded_attention(q, k, v, None, padded, builder), shapes[3])
    probs = op.nn.softmax(op.matmul(q, k), axis=-1)
    return op.reshape(op.matmul(probs, v), shapes[3])


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
