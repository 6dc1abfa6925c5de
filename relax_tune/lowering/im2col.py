"""An integer convolution of an image's few channels as a 1x1 convolution over its columns.

ResNet's int8 stem, a 7x7 stride-2 convolution of 3 channels (padded to 4), reduces 4 bytes
per window position: its tensorized kernels load a tile per window row and column, and it
ran 0.45-0.50 ms in place on AMX against OpenVINO's 0.28-0.33 (Intel Xeon, 2 threads). Here it
becomes

    cols[n, y, x, i * row + j] = image[n, y*sh + i, x*sw + j // c, j % c]   (im2col)
    conv2d_1x1(cols, weights as [O, 1, 1, kh' * row])

with ``row`` = the window's width times the channels, rounded up to whole pixels and whole
dot groups (4 bytes), and the window rows rounded up so that the columns fill whole
``column_group_bytes`` groups (64 bytes where the target has AMX tiles, a tile row; else 4,
the dot instructions' depth). The extra window positions read real pixels and meet zero
weights, so they add nothing; of two row lengths (that one, or the next power of two) the
plan takes the one that makes the columns shorter. Image channels that meet only zero
weights (the int8 lowering pads 3 to 4) are sliced off first, inside the image's producer:
ResNet's stem then reduces 7 rows of 8 RGB pixels, 168 bytes, where 7 rows of 8 RGBA pixels
padded to 8 rows took 256 (its 1x1 convolution 545 -> 355 us, AMD Zen 4, 2 threads). A
column row is ``kh'`` contiguous copies of ``row`` bytes: the im2col kernel is scheduled
here (parallel over output rows, each copy vectorised) and marked ``tirx.is_scheduled``,
opaque to fusion, so neither the search nor ``FuseOps`` touch it; the 1x1 convolution is
tuned like every other.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.dpl import is_const, is_op, wildcard

from .rewrite import OPAQUE, constant, rewrite_functions
from ..space.cpu.amx_intrin import has_amx

logger = logging.getLogger(__name__)

MAX_CHANNELS = 4
"""Convolutions of at most this many input channels (after ``int8.CHANNEL_MULTIPLE``'s
padding: an RGB image) and a window of more than one pixel take the columns."""

AMX_GROUP_BYTES = 64
"""With AMX tiles the column length is a multiple of this: a tile row."""

DOT_DEPTH = 4
"""Otherwise a multiple of this: the bytes a dot instruction reduces (VNNI, ``vpmaddubsw``;
``vpmaddwd``'s 2 divide it)."""


def column_group_bytes(target: tvm.target.Target) -> int:
    """The column groups for ``target``: ``AMX_GROUP_BYTES`` where it has AMX tiles, else
    ``DOT_DEPTH``."""
    return AMX_GROUP_BYTES if has_amx(target) else DOT_DEPTH


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _rows_and_row(kh: int, kw: int, c: int, group: int) -> tuple[int, int]:
    """The padded window ``(rows, row bytes)`` whose columns are the shortest: a row of
    whole pixels and whole dot groups, or of a power of two bytes, each with as many window
    rows as fill whole ``group``-byte columns."""
    choices, unit = [], math.lcm(c, DOT_DEPTH)
    for row in (-(-kw * c // unit) * unit, _pow2_at_least(kw * c)):
        if row % c == 0:  # a column row holds whole pixels
            step = group // math.gcd(row, group)  # rows whose columns fill whole groups
            choices.append((-(-kh // step) * step * row, row))
    length, row = min(choices)
    return length // row, row


def _plan(x_shape: list[int], w_shape: list[int], strides: list[int],
          group: int = DOT_DEPTH) -> dict | None:
    """The column geometry of an NHWC image and OHWI weights in ``group``-byte groups, or
    None to leave it."""
    n, h, w, c = x_shape
    _, kh, kw, ci = w_shape
    if ci != c or c > MAX_CHANNELS or kh * kw == 1:
        return None
    rows, row = _rows_and_row(kh, kw, c, group)
    sh, sw = strides
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    return dict(n=n, c=c, row=row, rows=rows, sh=sh, sw=sw, oh=oh, ow=ow,
                extra_h=max(0, (oh - 1) * sh + rows - h),
                extra_w=max(0, (ow - 1) * sw + row // c - w))


def im2col_func(shape: list[int], dtype: str, plan: dict) -> tvm.tirx.PrimFunc:
    """The scheduled im2col kernel of an NHWC ``shape`` image (already padded by the plan's
    extra rows and columns): ``[n, oh, ow, rows * row]`` columns."""
    c, row, sh, sw = plan["c"], plan["row"], plan["sh"], plan["sw"]
    image = te.placeholder(shape, dtype, name="image")
    cols = te.compute(
        (plan["n"], plan["oh"], plan["ow"], plan["rows"] * row),
        lambda b, y, x, k: image[b, y * sh + k // row, x * sw + (k % row) // c, k % c],
        name="im2col")
    sch = tvm.s_tir.Schedule(te.create_prim_func([image, cols]))
    b, y, x, k = sch.get_loops(sch.get_sblock("im2col"))
    sch.parallel(sch.fuse(b, y))
    sch.vectorize(sch.split(k, [None, row])[1])
    return sch.mod["main"].without_attr("global_symbol").with_attr(
        "tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)


def _columns_weight(w: np.ndarray, plan: dict) -> np.ndarray:
    """OHWI weights as ``[O, 1, 1, rows * row]``: zero for the padded window positions."""
    o, kh, kw, c = w.shape
    wide = np.zeros((o, plan["rows"], plan["row"] // c, c), w.dtype)
    wide[:, :kh, :kw, :] = w
    return wide.reshape(o, 1, 1, -1)


def _without_unread_channels(x: relax.Expr, w: np.ndarray, shape: list[int]
                             ) -> tuple[relax.Expr, np.ndarray, list[int]]:
    """The image's trailing channels that meet only zero weights (the int8 lowering's
    padding of 3 channels to 4) sliced off: they would cost column bytes and dot
    products and add nothing. The slice fuses into the image's producer."""
    c = shape[3]
    used = c
    while used > 1 and not w[..., used - 1].any():
        used -= 1
    if used == c:
        return x, w, shape
    x = relax.op.strided_slice(x, axes=[3], begin=[0], end=[used])
    return x, np.ascontiguousarray(w[..., :used]), shape[:3] + [used]


def _rewrite(call: relax.Call, builder: relax.BlockBuilder, group: int) -> relax.Expr:
    try:
        return _on_columns(call, builder, group)
    except Exception as err:  # noqa: BLE001 - an odd graph keeps its (correct) convolution
        logger.warning("a convolution of few channels kept as it is (%s)", err)
        return call


def _on_columns(call: relax.Call, builder: relax.BlockBuilder, group: int) -> relax.Expr:
    attrs = call.attrs
    x, w_expr = call.args
    w = constant(w_expr)
    dtype = str(x.ty.dtype)
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if (w is None or layouts != ("NHWC", "OHWI", "NHWC") or int(attrs.groups) != 1
            or any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation)
            or dtype not in ("uint8", "int8") or str(call.ty.dtype) != "int32"):
        return call
    dims = getattr(x.ty, "shape", None)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims.values):
        return call
    shape = [int(d) for d in dims.values]
    x, w, shape = _without_unread_channels(x, w, shape)
    plan = _plan(shape, list(w.shape), [int(s) for s in attrs.strides], group)
    if plan is None:
        return call
    if plan["extra_h"] or plan["extra_w"]:  # the padded window reads past the image's edge
        x = relax.op.nn.pad(x, [0, 0, 0, plan["extra_h"], 0, plan["extra_w"], 0, 0])
        shape[1] += plan["extra_h"]
        shape[2] += plan["extra_w"]
    gv = builder.add_func(im2col_func(shape, dtype, plan), "im2col")
    columns = [plan["n"], plan["oh"], plan["ow"], plan["rows"] * plan["row"]]
    cols = relax.call_tir(gv, [x], relax.TensorType(columns, dtype))
    return relax.op.nn.conv2d(cols, relax.const(_columns_weight(w, plan)), data_layout="NHWC",
                              kernel_layout="OHWI", out_layout="NHWC", out_dtype="int32")


@tvm.transform.module_pass(opt_level=0, name="relax_tune.ColumnsForFewChannels")
class ColumnsForFewChannels:
    """Integer NHWC convolutions of an image's few channels (``MAX_CHANNELS``) with a window
    larger than a pixel become a scheduled im2col kernel and a 1x1 convolution (see the
    module docstring); other convolutions are left as they are. Runs after
    ``graph.ChannelsLastConvolutions``, on CPU targets.

    Args:
        group_bytes: the columns' length is a multiple of this (``column_group_bytes``).
    """

    def __init__(self, group_bytes: int = DOT_DEPTH) -> None:
        self.group_bytes = group_bytes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with those convolutions on columns."""
        builder = relax.BlockBuilder(mod)
        pattern = is_op("relax.nn.conv2d")(wildcard(), is_const())
        out = rewrite_functions(mod, pattern,
                                lambda e, _m: _rewrite(e, builder, self.group_bytes), builder)
        added = len(out.functions) - len(mod.functions)
        if not added:
            return mod  # nothing on columns (rewrite_call may rebuild a function unchanged)
        logger.info("convolutions of few channels on im2col columns: %d kernel(s)", added)
        return out
