"""Winograd F(4x4, 3x3) convolutions: the graph rewrite computes what the convolution did,
acts only where it should, and goes through the "relax_tune" pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_tune
from relax_tune.lowering.prepare import lower_for_tuning
from relax_tune.lowering.winograd import WinogradConvolutions, transform_matrices, transformed_weight


def conv_mod(shape, weight, stride=1, padding=1, groups=1, layout="NHWC"):
    """``relu(conv2d(x, weight))`` with ``weight`` bound, in ``layout`` (NHWC: OHWI)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    kernel_layout = "OHWI" if layout == "NHWC" else "OIHW"
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=stride,
                                           padding=padding, groups=groups,
                                           data_layout=layout, kernel_layout=kernel_layout,
                                           out_layout=layout))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(out)
    return bb.get()


def run(mod, x):
    ex = tvm.compile(mod, "llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def has_conv(mod) -> bool:
    """A conv2d call, or (lowered) a conv2d kernel, in ``mod``."""
    return "R.nn.conv2d" in mod.script() or any("conv2d" in gv.name_hint
                                                 for gv in mod.get_global_vars())


def test_transforms_compute_a_tile_of_the_correlation():
    a, b, g = transform_matrices()
    rng = np.random.default_rng(0)
    d, f = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
    y = a.T @ ((g @ f @ g.T) * (b.T @ d @ b)) @ a
    ref = np.array([[np.sum(d[i:i + 3, j:j + 3] * f) for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)
    w = rng.standard_normal((5, 3, 3, 2)).astype("float32")  # OHWI
    u = transformed_weight(w)
    assert u.shape == (36, 2, 5) and u.dtype == np.float32
    np.testing.assert_allclose(u[:, 1, 4].reshape(6, 6), g @ w[4, :, :, 1] @ g.T, rtol=1e-5)


@pytest.mark.parametrize("small_tile_below", [0, 100])  # F(4x4, 3x3) / F(2x2, 3x3)
@pytest.mark.parametrize("shape", [(1, 8, 8, 4), (1, 15, 13, 8), (2, 16, 16, 3)])
def test_rewrite_matches_the_convolution(shape, small_tile_below):
    """Sizes a multiple of the tile, not one (partial tiles are cut off), and batch 2; 4 and
    8 channels through the input transform's kernel, 3 through the matmul."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((6, 3, 3, shape[-1])).astype("float32")
    x = rng.standard_normal(shape).astype("float32")
    mod = conv_mod(shape, weight)
    converted = WinogradConvolutions(min_size=1, min_channels=1,
                                     small_tile_below=small_tile_below)(mod)
    assert has_conv(mod) and not has_conv(converted)
    # the input transform's kernel where a vector of 2 or more floats divides the channels,
    # else the gather and the Kronecker product's matmul
    kernels = [gv.name_hint for gv in converted.get_global_vars()]
    assert ("winograd_input_transform" in kernels) == (shape[-1] % 2 == 0), kernels
    ref, out = run(mod, x), run(converted, x)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_input_transform_kernel_at_a_wider_vector_and_batch_2():
    """The kernel with AVX-512's 16 lanes (LLVM splits them on a narrower host), two images,
    and a map no tile size divides: the same output as the convolution."""
    rng = np.random.default_rng(3)
    shape = (2, 10, 7, 32)
    weight = rng.standard_normal((16, 3, 3, 32)).astype("float32")
    x = rng.standard_normal(shape).astype("float32")
    mod = conv_mod(shape, weight)
    converted = WinogradConvolutions(min_size=1, min_channels=1, lanes=16)(mod)
    kernel = [f for gv, f in converted.functions.items()
              if gv.name_hint == "winograd_input_transform"]
    assert len(kernel) == 1 and " * 16 + 16]" in kernel[0].script()  # 16 channels a step
    ref, out = run(mod, x), run(converted, x)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("case", ["stride 2", "groups", "padding 0", "NCHW", "small",
                                  "few channels"])
def test_other_convolutions_are_left(case):
    shape, kw = (1, 16, 16, 4), {}
    weight = np.ones((4, 3, 3, 4), "float32")
    if case == "stride 2":
        kw = dict(stride=2)
    elif case == "groups":
        kw, weight = dict(groups=4), np.ones((4, 3, 3, 1), "float32")
    elif case == "padding 0":
        kw = dict(padding=0)
    elif case == "NCHW":
        shape, kw, weight = (1, 4, 16, 16), dict(layout="NCHW"), np.ones((4, 4, 3, 3), "float32")
    mod = conv_mod(shape, weight, **kw)
    min_size = 17 if case == "small" else 1
    min_channels = 5 if case == "few channels" else 1
    assert has_conv(WinogradConvolutions(min_size=min_size, min_channels=min_channels)(mod))


def test_pipeline_lowers_large_3x3_convolutions_by_winograd_unless_told_not_to():
    """Exported NCHW convolutions become channels-last, then Winograd where the feature map
    is large enough (>= MIN_SIZE: 7), through the pipeline's lowering; ``winograd=False``
    keeps them."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((32, 32, 3, 3)).astype("float32")
    target = relax_tune.host_target()
    big, small = conv_mod((1, 32, 16, 16), weight, layout="NCHW"), \
        conv_mod((1, 32, 6, 6), weight, layout="NCHW")
    assert not has_conv(lower_for_tuning(big, target))
    assert has_conv(lower_for_tuning(big, target, winograd=False))
    assert has_conv(lower_for_tuning(small, target))
