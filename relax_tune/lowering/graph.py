"""Graph-level rewrites before any kernel exists (what ONNX Runtime does before its kernels
run), so tuning trials go to the kernels that remain.

``FoldBatchNormIntoConv``: an inference batch norm after a 2-D convolution (with or without
a bias add in between, as PyTorch exports it) becomes a scaled weight and one bias add:

    batch_norm(conv2d(x, W) [+ b], gamma, beta, mean, var)[0]
      -> conv2d(x, W * s[:, None, None, None]) + ((b - mean) * s + beta)[None, :, None, None]
    with s = gamma / sqrt(var + eps)

It acts when the weights are bound (``params``): the new weight and bias are computed here,
once, and the kernel is a convolution with a bias epilogue instead of four extra
elementwise operations on every output. Unbound batch norms are left to
``DecomposeOpsForInference``.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple_get_item, wildcard

from .rewrite import constant, count_calls, rewrite_functions
from .transpose_sinking import sink_transposes

logger = logging.getLogger(__name__)


def _fold_pattern():
    x, w, b = wildcard(), wildcard(), wildcard()
    gamma, beta, mean, var = wildcard(), wildcard(), wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(x, w)
    biased = is_op("relax.add")(conv, b)
    bn = is_op("relax.nn.batch_norm")(biased | conv, gamma, beta, mean, var)
    return is_tuple_get_item(bn, 0), dict(x=x, w=w, b=b, conv=conv, bn=bn, gamma=gamma,
                                          beta=beta, mean=mean, var=var)


def _rewrite(matched: relax.Expr, matches: dict, parts: dict) -> relax.Expr:
    conv_call, bn_call = matches[parts["conv"]], matches[parts["bn"]]
    attrs, bn_attrs = conv_call.attrs, bn_call.attrs
    if (str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW"
            or int(bn_attrs.axis) != 1 or not bool(bn_attrs.scale) or not bool(bn_attrs.center)):
        return matched
    names = ["w", "gamma", "beta", "mean", "var"] + (["b"] if parts["b"] in matches else [])
    values = {name: constant(matches[parts[name]]) for name in names}
    if any(v is None for v in values.values()):
        return matched  # weights not bound: nothing to fold at compile time
    w = values["w"]
    scale = values["gamma"] / np.sqrt(values["var"] + np.float32(bn_attrs.epsilon))
    shift = values["beta"] - values["mean"] * scale
    channels = w.shape[0]
    if "b" in values:  # (conv + b - mean) * s + beta
        shift = values["b"].reshape(-1) * scale + shift
    if scale.shape != (channels,) or shift.shape != (channels,):
        return matched
    new_w = relax.const((w * scale.reshape(-1, 1, 1, 1)).astype(w.dtype))
    bias = relax.const(shift.reshape(1, -1, 1, 1).astype(w.dtype))
    conv = relax.op.nn.conv2d(matches[parts["x"]], new_w, strides=attrs.strides,
                              padding=attrs.padding, dilation=attrs.dilation,
                              groups=attrs.groups, data_layout=attrs.data_layout,
                              kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                              out_dtype=attrs.out_dtype)
    return relax.op.add(conv, bias)


@tvm.transform.module_pass(opt_level=0, name="relax_tune.FoldBatchNormIntoConv")
class FoldBatchNormIntoConv:
    """Fold every inference batch norm that follows a conv2d (NCHW/OIHW, optional bias add)
    into the convolution's weight and a bias add (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with the batch norms after convolutions folded."""
        pattern, parts = _fold_pattern()
        return rewrite_functions(mod, pattern, lambda e, m: _rewrite(e, m, parts))


def _patch_conv(matched: relax.Expr, matches: dict, x_pat, w_pat) -> relax.Expr:
    x, w_expr = matches[x_pat], matches[w_pat]
    w = constant(w_expr)
    attrs = matched.attrs
    shape = getattr(x.ty, "shape", None)
    if w is None or shape is None or w.ndim != 4:
        return matched
    try:
        n, c, h, wd = (int(d) for d in shape)
    except (TypeError, ValueError):
        return matched  # symbolic input size
    o, ci, kh, kw = w.shape
    strides = [int(v) for v in attrs.strides]
    if (str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW"
            or str(attrs.out_layout) != "NCHW" or int(attrs.groups) != 1 or ci != c
            or [int(v) for v in attrs.padding] != [0, 0, 0, 0]
            or [int(v) for v in attrs.dilation] != [1, 1] or strides != [kh, kw]
            or h % kh or wd % kw or kh * kw == 1):
        return matched
    hp, wp = h // kh, wd // kw
    rows = relax.op.reshape(relax.op.permute_dims(
        relax.op.reshape(x, [n, c, hp, kh, wp, kw]), [0, 2, 4, 1, 3, 5]),
        [n * hp * wp, c * kh * kw])
    weight = relax.const(np.ascontiguousarray(w.reshape(o, c * kh * kw).T))
    # TVM's ONNX importer leaves out_dtype unset (None): the matmul then keeps its inputs'
    out_dtype = None if str(attrs.out_dtype) in ("", "None", "void") else str(attrs.out_dtype)
    out = relax.op.matmul(rows, weight, out_dtype=out_dtype)
    return relax.op.permute_dims(relax.op.reshape(out, [n, hp, wp, o]), [0, 3, 1, 2])


@tvm.transform.module_pass(opt_level=0, name="relax_tune.PatchConvToMatmul")
class PatchConvToMatmul:
    """A convolution whose stride equals its kernel (a ViT's 16x16/16 patch embedding: every
    input pixel is read once) is a GEMM over the patches: the image is cut into patch rows
    (reshape + transpose) and multiplied by the bound weight as a (C*kh*kw, O) matrix.
    The GEMM is tuned like every other; as a convolution its 16x16 window left the kernel
    slow (docs/design/channels-last.md). NCHW/OIHW, groups 1, no padding, bound
    weights only; anything else is left as it is."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its patch convolutions as matmuls."""
        x, w = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, w)
        return rewrite_functions(mod, pattern, lambda e, m: _patch_conv(e, m, x, w))


def _pointwise_conv(matched: relax.Expr, matches: dict, x_pat, w_pat, lanes: int) -> relax.Expr:
    x, w = matches[x_pat], constant(matches[w_pat])
    attrs = matched.attrs
    if w is None or w.ndim != 4 or str(w.dtype) != "float32":
        return matched
    o, kh, kw, c = w.shape
    if (str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI"
            or str(attrs.out_layout) != "NHWC" or int(attrs.groups) != 1 or (kh, kw) != (1, 1)
            or [int(v) for v in attrs.strides] != [1, 1]
            or [int(v) for v in attrs.padding] != [0, 0, 0, 0]
            or [int(v) for v in attrs.dilation] != [1, 1] or o % lanes == 0):
        return matched
    out_dtype = None if str(attrs.out_dtype) in ("", "None", "void") else str(attrs.out_dtype)
    return relax.op.matmul(x, relax.const(np.ascontiguousarray(w.reshape(o, c).T)),
                           out_dtype=out_dtype)


@tvm.transform.module_pass(opt_level=0, name="relax_tune.PointwiseConvToMatmul")
class PointwiseConvToMatmul:
    """A channels-last 1x1 stride-1 convolution whose output channels are no whole number of
    SIMD registers (``lanes`` floats: ShuffleNetV2's 58, 116 and 232 on AVX2) becomes the
    matmul it is, ``x[n, h, w, :] @ W^T``: the matmul's design space pads its vector axis to
    whole registers (``multi_level_tiling``'s ``pad_einsum``), which the convolution's
    cannot (its input index is a sum of two loops), so its candidates vectorise 29 or 4
    floats. Float32 NHWC/OHWI with a bound weight only; anything else is left as it is."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with those convolutions as matmuls."""
        x, w = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, w)
        return rewrite_functions(mod, pattern,
                                 lambda e, m: _pointwise_conv(e, m, x, w, self.lanes))


CPU_CONV_LAYOUT = {"relax.nn.conv2d": ["NHWC", "OHWI"]}
"""Convolution layouts on CPU targets: channels innermost, so the tuned kernels vectorise
along the output channels (16-512 of them) instead of a feature map's width (7-56).
Measured: docs/design/channels-last.md."""


@tvm.transform.module_pass(opt_level=0, name="relax_tune.ChannelsLastConvolutions")
class ChannelsLastConvolutions:
    """TVM's ``ConvertLayout`` to ``CPU_CONV_LAYOUT`` for modules that have a conv2d: it
    carries the layout through the elementwise operations and pools between convolutions,
    so transposes remain at the model's edges; with bound weights the weight transposes
    fold away at compile time. Modules without a convolution are returned as they are, and
    so is a module ConvertLayout fails on (TVM 0.27 raises std::bad_alloc on an encoder
    layer, and on a ViT with its patch convolution): the layout is an optimisation, never
    a reason for a compilation to fail."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its convolutions in the channels-last layout."""
        if not count_calls(mod, "relax.nn.conv2d"):
            return mod
        try:
            converted = relax.transform.ConvertLayout(CPU_CONV_LAYOUT)(mod)
        except Exception as err:  # TVM's pass failed: keep the exported layout
            logger.warning("convolutions kept in their exported layout: TVM's ConvertLayout "
                           "failed on this model (%s)", str(err).splitlines()[-1][:200])
            return mod
        return sink_transposes(converted)
