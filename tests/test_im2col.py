"""ColumnsForFewChannels: an integer convolution of an image's few channels becomes a
scheduled im2col kernel and a 1x1 convolution that compute the same int32 sums."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune.lowering.im2col import ColumnsForFewChannels, column_group_bytes


def _conv_module(x_shape, w, strides, dtype="uint8"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(
                x, relax.const(w), strides=strides, data_layout="NHWC", kernel_layout="OHWI",
                out_layout="NHWC", out_dtype="int32"))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    target = rt.host_target()
    with target:
        mod = relax.transform.LegalizeOps()(mod)
    ex = tvm.compile(mod, target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _calls(mod, name):
    op, found = tvm.ir.Op.get(name), []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(op):
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize("group", [64, 4])
@pytest.mark.parametrize("x_shape,kernel,strides,dtype,zero_channels", [
    ((1, 29, 29, 4), 7, 2, "uint8", 0),  # ResNet's stem, small: 8-pixel, 8-row window
    ((1, 29, 29, 4), 7, 2, "uint8", 1),  # ... 3 channels padded to 4 by the int8 lowering
    ((1, 9, 9, 4), 3, 1, "int8", 0),  # the window reads past the edge: padded first
    ((2, 10, 11, 2), 5, 2, "uint8", 0),  # 2 channels, batch 2, odd widths
    ((1, 12, 12, 3), 3, 1, "uint8", 0),  # 3 channels as they come
])
def test_columns_compute_the_same_integers(x_shape, kernel, strides, dtype, zero_channels,
                                           group):
    rng = np.random.default_rng(0)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, x_shape).astype(dtype)
    w = rng.integers(-127, 128, (16, kernel, kernel, x_shape[3])).astype("int8")
    w[..., x_shape[3] - zero_channels:] = 0
    mod = _conv_module(list(x_shape), w, [strides, strides], dtype)
    cols = ColumnsForFewChannels(group)(mod)
    convs = _calls(cols, "relax.nn.conv2d")
    assert len(convs) == 1
    o, kh, kw, k = (int(d) for d in convs[0].args[1].ty.shape.values)
    assert (kh, kw) == (1, 1) and k % group == 0  # whole groups
    if kernel == 7:  # 7 rows of 7 pixels: RGBA in 8-pixel rows, padded to 8 rows for AMX's
        # 64-byte groups, else 7-pixel rows; RGB in 8-pixel rows, 8 of them for AMX
        assert k == {(64, 0): 256, (4, 0): 196, (64, 1): 192, (4, 1): 168}[group, zero_channels]
    scheduled = [f for _, f in cols.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(scheduled) == 1 and scheduled[0].attrs["tirx.is_scheduled"]
    np.testing.assert_array_equal(_run(cols, x), _run(mod, x))


def test_convolutions_of_many_channels_or_float_are_left_alone():
    mod = _conv_module([1, 8, 8, 16], np.ones((16, 3, 3, 16), "int8"), [1, 1])
    assert ColumnsForFewChannels()(mod).same_as(mod)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 8, 4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(
                x, relax.const(np.zeros((8, 3, 3, 4), "float32")), data_layout="NHWC",
                kernel_layout="OHWI"))
        bb.emit_func_output(out)
    floaty = bb.get()
    assert ColumnsForFewChannels()(floaty).same_as(floaty)


def test_column_groups_follow_the_target():
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    amx = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert column_group_bytes(avx2) == column_group_bytes(avx512) == 4
    assert column_group_bytes(amx) == 64
