"""``IntegerQDQ``: the dequantize -> conv2d/matmul -> (bias) -> (ReLU/clip) -> quantize
chains of a QDQ model (ONNX Runtime's ``quantize_static`` in QDQ format) computed in
integers, as ONNX Runtime's QLinearConv/QLinearMatMul kernels compute them::

    quantize(act(conv2d(dequantize(qx, sx, zx), dequantize(W, sw, 0)) + dequantize(B, sx*sw, 0)),
             sy, zy)
      -> astype(clip(round(float(conv2d(pad(qx, zx), W, int32) + (B - zx * sum(W))) * m) + zy,
                     lo, hi), dtype(qy))      with m = sx * sw / sy per output channel

- the activations stay u8 (or s8), the weights s8 constants, the products accumulate in
  int32; the convolution's padding becomes an explicit pad with the input's zero point
  (what a float zero is in the quantized domain), so the zero-point correction is one
  constant per output channel, folded with the int32 bias here, at compile time;
- the requantisation is the epilogue: one float multiply per channel, round half to even
  (``relax.round``, as QuantizeLinear rounds), the output's zero point, the saturation
  bounds, narrowed by a ReLU or clip between the bias and the quantize
  (``qparams.activation_bounds``); ``FuseOps`` fuses it into the integer kernel.

A matmul of two quantized run-time tensors (attention's ``q k^T`` and ``a v``) is
computed the same way, its zero-point corrections from the operands' row and column sums
at run time. A quantized elementwise function (GELU, sigmoid, tanh, SiLU) of a quantized
tensor becomes a 256-entry table (``int8_tables``).

What is rewritten: conv2d (NCHW/OIHW, any stride, dilation and groups) and matmul (a 2-D
weight ``[K, N]`` or Gemm's transposed ``[N, K]``) with a per-tensor u8/s8 input, s8
weights per tensor or per output channel with zero points 0 (ONNX Runtime's default:
symmetric weights), an int32 bias quantized with the scale ``sx * sw`` or none, and a
per-tensor quantize of the result. Anything else (asymmetric weights, a float bias, a
per-channel output, weights computed at run time) keeps its float arithmetic, which is
correct, only slower.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .int8_movement import drop_movement_qdq
from .int8_tables import quantized_functions_as_tables
from .rewrite import constant, rewrite_functions
from .qparams import INT8_TYPES, QParams, activation_bounds, output_multiplier, qparams_of

logger = logging.getLogger(__name__)


def _pattern(op_name: str):
    """The pattern of one chain around ``op_name`` and its named parts."""
    qx = wildcard()
    x_dq = is_op("relax.dequantize")(qx, is_const(), is_const())
    w = is_const()
    w_dq = is_op("relax.dequantize")(w, is_const(), is_const())
    w_t = is_op("relax.permute_dims")(w_dq)
    core = is_op(op_name)(x_dq, w_dq | w_t)
    b_dq = is_op("relax.dequantize")(is_const(), is_const(), is_const())
    b_shaped = is_op("relax.reshape")(b_dq, wildcard())
    bias = b_dq | b_shaped
    biased = is_op("relax.add")(core, bias) | is_op("relax.add")(bias, core)
    pre = biased | core
    relu = is_op("relax.nn.relu")(pre)
    clip = is_op("relax.clip")(pre, wildcard(), wildcard())
    out = is_op("relax.quantize")(relu | clip | pre, is_const(), is_const())
    return out, dict(qx=qx, x_dq=x_dq, w=w, w_dq=w_dq, w_t=w_t, core=core, b_dq=b_dq,
                     b_shaped=b_shaped, relu=relu, clip=clip)


class _Unsupported(Exception):
    """A matched chain this rewrite does not cover: it stays float."""


def _scalar_qparams(call: relax.Call, what: str) -> QParams:
    q = qparams_of(call)
    if q is None or not q.per_tensor or q.dtype not in INT8_TYPES:
        raise _Unsupported(f"{what} is not a per-tensor u8/s8 quantisation")
    return q


def _weights(matches: dict, parts: dict, op_name: str) -> tuple[np.ndarray, np.ndarray]:
    """The int8 weight constant in the integer kernel's layout (OIHW for conv2d, ``[K, N]``
    for matmul) and its scale per output channel."""
    w = constant(matches[parts["w"]])
    w_dq = matches[parts["w_dq"]]
    q = qparams_of(w_dq)
    if w is None or q is None or w.dtype != np.int8 or np.any(q.zero_point != 0):
        raise _Unsupported("weights are not s8 constants with zero points 0")
    transposed = parts["w_t"] in matches
    if op_name == "relax.nn.conv2d":
        channel_axis = 0
    elif w.ndim != 2:
        raise _Unsupported("matmul weights are not a matrix")
    else:
        if transposed:
            axes = matches[parts["w_t"]].attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                raise _Unsupported("weights permuted other than transposed")
            w = np.ascontiguousarray(w.T)  # Gemm's [N, K] as [K, N], once, here
            channel_axis = 0  # of the stored [N, K]
        else:
            channel_axis = 1
    if not q.per_tensor and q.axis % w_dq.args[0].ty.ndim != channel_axis:
        raise _Unsupported("weights are per channel along another axis than the outputs")
    channels = w.shape[0] if op_name == "relax.nn.conv2d" else w.shape[1]
    scale, _ = q.channel_vector(channels, "weights")
    return w, scale


def _bias(matches: dict, parts: dict, x: QParams, w_scale: np.ndarray,
          op_name: str) -> np.ndarray:
    """The int32 bias per output channel (zeros without one); it must be quantized with the
    scale ``sx * sw`` so that it adds to the accumulator as it is."""
    channels = w_scale.size
    if parts["b_dq"] not in matches:
        return np.zeros(channels, np.int64)
    b_dq = matches[parts["b_dq"]]
    b, q = constant(b_dq.args[0]), qparams_of(b_dq)
    if b is None or q is None or b.dtype != np.int32 or b.size != channels \
            or np.any(q.zero_point != 0):
        raise _Unsupported("the bias is not an int32 vector with zero points 0")
    scale, _ = q.channel_vector(channels, "bias")
    expected = (np.float32(x.scale.reshape(-1)[0]) * w_scale).astype(np.float32)
    if not np.allclose(scale, expected, rtol=1e-5, atol=0):
        raise _Unsupported("the bias is not quantized with input scale x weight scale")
    if parts["b_shaped"] in matches:
        shape = [int(d) for d in matches[parts["b_shaped"]].ty.shape]
        wanted = [1, channels, 1, 1] if op_name == "relax.nn.conv2d" else None
        if wanted is not None and shape != wanted:
            raise _Unsupported(f"a bias of shape {shape} on a convolution")
        if wanted is None and shape[-1:] != [channels]:
            raise _Unsupported(f"a bias of shape {shape} on a matmul")
    elif op_name == "relax.nn.conv2d":
        raise _Unsupported("an unshaped bias on a convolution")
    return b.reshape(-1).astype(np.int64)


def _bounds(matches: dict, parts: dict, y: QParams) -> tuple[int, int]:
    if parts["relu"] in matches:
        return activation_bounds(0.0, None, y)
    if parts["clip"] in matches:
        call = matches[parts["clip"]]
        lo, hi = (float(getattr(a, "value", a)) for a in call.args[1:3])
        return activation_bounds(lo, hi, y)
    return activation_bounds(None, None, y)


CHANNEL_MULTIPLE = 4
"""Input channels of an integer convolution are padded to a multiple of this (zero weights):
the dot-product instructions reduce 4 (VNNI) or 2 (AVX2) bytes at a time
(``space.cpu.int8_dot``), and a first convolution's 3 channels left ResNet-18's 7x7 stem to
the block rules, 2.6 ms of the int8 model's 13.3 ms in place (Intel Xeon, 2 threads)."""


def _integer_conv(qx: relax.Expr, attrs, w: np.ndarray, zx: int) -> tuple[relax.Expr, list]:
    """conv2d of the quantized input, padded with its zero point (spatially, and to a
    multiple of ``CHANNEL_MULTIPLE`` channels), and the int8 weights."""
    if (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW") \
            or str(attrs.out_layout) != "NCHW":
        raise _Unsupported("a convolution not in NCHW/OIHW")
    top, left, bottom, right = (int(p) for p in attrs.padding)
    extra = -w.shape[1] % CHANNEL_MULTIPLE if int(attrs.groups) == 1 else 0
    if extra:  # zero weights for the added channels: whatever they read adds nothing
        w = np.pad(w, [(0, 0), (0, extra), (0, 0), (0, 0)])
    inside = zx == 0 and not extra  # the convolution's own zero padding: computed in its
    if (top or left or bottom or right or extra) and not inside:  # kernel (pad_in_jobs)
        qx = relax.op.nn.pad(qx, [0, 0, 0, extra, top, bottom, left, right],
                             pad_value=float(zx))
    acc = relax.op.nn.conv2d(qx, relax.const(w), strides=attrs.strides,
                             padding=attrs.padding if inside else [0, 0, 0, 0],
                             dilation=attrs.dilation, groups=attrs.groups,
                             data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
                             out_dtype="int32")
    return acc, [1, w.shape[0], 1, 1]


def _requantize(total: relax.Expr, multiplier: np.ndarray, shape: list[int], y: QParams,
                bounds: tuple[int, int]) -> relax.Expr:
    """The epilogue: int32 accumulator -> float * multiplier -> round half to even ->
    + the output's zero point -> saturate -> the output's integer type."""
    scaled = relax.op.multiply(relax.op.astype(total, "float32"),
                               relax.const(multiplier.astype(np.float32).reshape(shape)))
    shifted = relax.op.add(relax.op.round(scaled),
                           relax.const(np.float32(y.zero_point.reshape(-1)[0])))
    return relax.op.astype(relax.op.clip(shifted, *bounds), y.dtype)


def _rewrite(matched: relax.Call, matches: dict, parts: dict, op_name: str) -> relax.Expr:
    try:
        qx = matches[parts["qx"]]
        x = _scalar_qparams(matches[parts["x_dq"]], "the input")
        y = _scalar_qparams(matched, "the output")
        if str(qx.ty.dtype) != x.dtype:
            raise _Unsupported("the input's type is not its dequantize's")
        w, w_scale = _weights(matches, parts, op_name)
        zx = int(x.zero_point.reshape(-1)[0])
        lead = None
        if op_name == "relax.nn.conv2d":
            acc, shape = _integer_conv(qx, matches[parts["core"]].attrs, w, zx)
            w_sum = w.astype(np.int64).sum(axis=(1, 2, 3))
        else:
            qx, lead = _as_matrix(qx)
            acc = relax.op.matmul(qx, relax.const(w), out_dtype="int32")
            shape, w_sum = [w.shape[1]], w.astype(np.int64).sum(axis=0)
        correction = _bias(matches, parts, x, w_scale, op_name) - zx * w_sum
        if np.abs(correction).max(initial=0) >= 2**31:
            raise _Unsupported("the zero-point correction overflows int32")
        multiplier = output_multiplier(x.scale.reshape(-1)[0], w_scale, y.scale.reshape(-1)[0])
        lo, hi = _bounds(matches, parts, y)
    except _Unsupported as why:
        logger.debug("int8: %s kept in float: %s", op_name, why)
        return matched
    except Exception as err:  # noqa: BLE001 - an odd graph keeps its (correct) float path
        logger.warning("int8: a quantized %s kept in float (%s)", op_name, err)
        return matched
    total = relax.op.add(acc, relax.const(correction.astype(np.int32).reshape(shape)))
    out = _requantize(total, multiplier, shape, y, (lo, hi))
    if lead is not None:  # a matmul's input taken as a matrix: the result shaped back
        out = relax.op.reshape(out, [*lead, w.shape[1]])
    return out


def _as_matrix(qx: relax.Expr) -> tuple[relax.Expr, list[int] | None]:
    """A static input of more than 2 dimensions as the matrix ``[rows, k]`` (and its
    leading dimensions, to shape the result back), else ``(qx, None)``. A matmul's rows are
    then one axis of the kernel: an encoder's ``[seq, 1, d]`` projections had a unit axis
    between the rows and the channels, which the dot-product sketches took for the rows
    (tiles of 1 row, no AMX)."""
    shape = getattr(qx.ty, "shape", None)
    dims = list(shape.values) if shape is not None else []
    if len(dims) <= 2 or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return qx, None
    lead = [int(d) for d in dims[:-1]]
    return relax.op.reshape(qx, [int(np.prod(lead)), int(dims[-1])]), lead


def _activation_pattern():
    """matmul of two dequantized run-time tensors (attention's q k^T and a v), quantized."""
    qa, qb = wildcard(), wildcard()
    a_dq = is_op("relax.dequantize")(qa, is_const(), is_const())
    b_dq = is_op("relax.dequantize")(qb, is_const(), is_const())
    out = is_op("relax.quantize")(is_op("relax.matmul")(a_dq, b_dq), is_const(), is_const())
    return out, dict(qa=qa, qb=qb, a_dq=a_dq, b_dq=b_dq)


def _rewrite_activations(matched: relax.Call, matches: dict, parts: dict) -> relax.Expr:
    """``sum_k (a - za)(b - zb) = sum_k a b - zb sum_k a - za sum_k b + K za zb``: the
    integer matmul of the two quantized tensors, corrected by their row and column sums
    (computed at run time: neither operand is a constant)."""
    qa, qb = matches[parts["qa"]], matches[parts["qb"]]
    try:
        a = _scalar_qparams(matches[parts["a_dq"]], "the left operand")
        b = _scalar_qparams(matches[parts["b_dq"]], "the right operand")
        y = _scalar_qparams(matched, "the output")
        if str(qa.ty.dtype) != a.dtype or str(qb.ty.dtype) != b.dtype:
            raise _Unsupported("an operand's type is not its dequantize's")
        depth = qa.ty.shape[-1] if qa.ty.shape is not None else None
        if not isinstance(depth, tvm.tirx.IntImm):
            raise _Unsupported("the reduction length is not static")
    except _Unsupported as why:
        logger.debug("int8: relax.matmul of activations kept in float: %s", why)
        return matched
    except Exception as err:  # noqa: BLE001 - an odd graph keeps its (correct) float path
        logger.warning("int8: a quantized matmul of activations kept in float (%s)", err)
        return matched
    za, zb = int(a.zero_point.reshape(-1)[0]), int(b.zero_point.reshape(-1)[0])
    total = relax.op.matmul(qa, qb, out_dtype="int32")
    if zb:
        rows = relax.op.sum(relax.op.astype(qa, "int32"), axis=[-1], keepdims=True)
        total = relax.op.subtract(total, relax.op.multiply(rows, relax.const(zb, "int32")))
    if za:
        cols = relax.op.sum(relax.op.astype(qb, "int32"), axis=[-2], keepdims=True)
        total = relax.op.subtract(total, relax.op.multiply(cols, relax.const(za, "int32")))
    if za and zb:
        total = relax.op.add(total, relax.const(int(depth.value) * za * zb, "int32"))
    multiplier = output_multiplier(a.scale.reshape(-1)[0], b.scale.reshape(-1),
                                   y.scale.reshape(-1)[0])
    return _requantize(total, multiplier, [], y, activation_bounds(None, None, y))


@tvm.transform.module_pass(opt_level=0, name="relax_tune.IntegerQDQ")
class IntegerQDQ:
    """Compute the quantized convolutions and matmuls of a QDQ model in integers: u8/s8
    operands, int32 accumulation, the requantisation as the epilogue (see the module
    docstring). Chains it does not cover keep their float arithmetic."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its quantized conv2d/matmul chains in integer arithmetic (after the
        float round trips around moved quantized tensors are dropped: ``int8_movement``)."""
        mod = drop_movement_qdq(mod)
        for op_name in ("relax.nn.conv2d", "relax.matmul"):
            pattern, parts = _pattern(op_name)
            mod = rewrite_functions(
                mod, pattern, lambda e, m, p=parts, o=op_name: _rewrite(e, m, p, o))
        pattern, parts = _activation_pattern()
        mod = rewrite_functions(mod, pattern,
                                lambda e, m: _rewrite_activations(e, m, parts))
        return quantized_functions_as_tables(mod)
