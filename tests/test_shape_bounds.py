"""SimplifyBoundedShapes: a slice to a bounded symbolic length keeps a known shape."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from relax_tune.lowering.shape_bounds import SimplifyBoundedShapes


@I.ir_module
class PositionSlice:
    """``softmax(x + pos[:, :n])`` with a position table of 16 rows."""

    @R.function
    def main(x: R.Tensor((1, "n", 4), "float32"), pos: R.Tensor((1, 16, 4), "float32")):
        n = T.int64()
        with R.dataflow():
            p = R.strided_slice(pos, (1,), (0,), (n,), (1,), assume_inbound=False)
            y = R.add(x, p)
            z = R.nn.softmax(y, axis=-1)
            R.output(z)
        return z


def _bounded(bound: int | None) -> tvm.IRModule:
    func = PositionSlice["main"]
    if bound is not None:
        func = func.with_attr("tir_var_upper_bound", {"n": bound})
    return tvm.IRModule({"main": func})


def _sum_shape(mod: tvm.IRModule):
    """The shape of ``x + pos[:, :n]`` (None when unknown)."""
    return mod["main"].body.blocks[0].bindings[1].var.ty.shape


def test_bounded_slice_keeps_the_shape_known():
    assert _sum_shape(_bounded(16)) is None  # min(n, 16): the sum's shape is unknown
    mod = SimplifyBoundedShapes()(_bounded(16))
    assert bool(mod["main"].body.blocks[0].bindings[0].value.attrs.assume_inbound)
    one, n, four = _sum_shape(mod).values
    assert (int(one), str(n), int(four)) == (1, "n", 4)


@pytest.mark.parametrize("bound", [None, 17])
def test_unbounded_or_too_long_slice_is_left_alone(bound):
    """Without a bound, or with one past the table's 16 rows, ``min(n, 16)`` stays."""
    before = _bounded(bound)
    after = SimplifyBoundedShapes()(before)
    assert tvm_ffi.structural_equal(before, after)
    assert _sum_shape(after) is None


def test_bounded_module_compiles_and_matches_numpy():
    mod = SimplifyBoundedShapes()(_bounded(16))
    ex = tvm.compile(relax.get_pipeline("zero")(mod), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    pos = rng.standard_normal((1, 16, 4)).astype("float32")
    for n in (1, 5, 16):
        x = rng.standard_normal((1, n, 4)).astype("float32")
        y = x + pos[:, :n]
        want = np.exp(y - y.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(pos)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
