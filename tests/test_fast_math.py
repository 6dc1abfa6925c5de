"""FastMath: float32 exp/erf/tanh/sigmoid as vectorisable arithmetic, checked against float64
references on this CPU, and the pipeline's lowering uses it on CPU targets."""

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx

import relax_tune as rt
from relax_tune.lowering.fast_math import FastMath, fast_math_func

_REFS = {
    "exp": np.exp,
    "erf": np.vectorize(math.erf),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}


def _calls(func) -> set[str]:
    names = set()

    def visit(node):
        if isinstance(node, tvm.ir.expr.Call) and hasattr(node.op, "name"):
            names.add(node.op.name)

    tvm_ffi.structural_walk(func, visit)
    return names


def _vectorised(fexpr, shape):
    a = te.placeholder(shape, name="A")
    b = te.compute(shape, lambda i, j: fexpr(a[i, j]), name="B")
    sch = tvm.s_tir.Schedule(fast_math_func(te.create_prim_func([a, b])))
    i, j = sch.get_loops(sch.get_sblock("B"))
    sch.parallel(i)
    sch.vectorize(j)
    return sch.mod


@pytest.mark.parametrize("name", sorted(_REFS))
def test_fast_math_matches_float64_reference(name, tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 16)) * 5).astype("float32")
    # special values: -inf/inf, beyond the clamps, zero, tiny, near exp's overflow
    x[0] = [-np.inf, np.inf, -100, 100, 0, 1e-8, -1e-8, 88, -87, 3.9, -3.9, 8.9, -8.9,
            0.5, -0.5, 20]
    mod = _vectorised(getattr(tirx, name), x.shape)
    assert f"tirx.{name}" not in _calls(mod["main"])  # rewritten, not a libm call
    lib = tvm.compile(mod, target=rt.host_target())
    path = str(tmp_path / f"{name}.so")
    lib.export_library(path)
    main = tvm.runtime.load_module(path)["main"]
    out = tvm.runtime.tensor(np.zeros_like(x))
    main(tvm.runtime.tensor(x), out)
    got = out.numpy()
    with np.errstate(over="ignore"):
        ref = _REFS[name](x.astype(np.float64))
    finite = np.abs(ref) < 1e38  # exp saturates at 2.4e38 instead of overflowing to inf
    if name == "sigmoid":  # a rational approximation in [0, 1]: an absolute error, a few
        err = np.abs(got - ref)  # ulps of 1.0 (6e-8 each)
        assert err.max() < 2.5e-7, float(err.max())
        assert got.min() >= 0.0 and got.max() <= 1.0 + 1e-7
        assert np.all(np.diff(got.reshape(-1)[np.argsort(x.reshape(-1))]) >= -1e-7)  # monotone
    else:
        rel = np.abs(got[finite] - ref[finite]) / np.maximum(np.abs(ref[finite]), 1e-6)
        assert rel.max() < 2e-6, (name, float(rel.max()))
    assert np.all(np.isfinite(got))
    if name == "exp":
        assert got[0, 0] == 0.0  # exp(-inf): softmax over masked scores
    if name in ("erf", "tanh"):
        assert got[0, 0] == -1.0 and got[0, 1] == 1.0


def test_fast_math_leaves_other_dtypes_and_ops_alone():
    a = te.placeholder((8,), "float64", name="A")
    b = te.compute((8,), lambda i: tirx.exp(a[i]) + tirx.sqrt(a[i]), name="B")
    func = te.create_prim_func([a, b])
    assert fast_math_func(func).same_as(func)


def test_lowering_uses_fast_math_on_cpu_only():
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Gelu:
        @R.function
        def main(x: R.Tensor((4, 32), "float32")):
            with R.dataflow():
                y = R.nn.gelu(x)
                z = R.nn.softmax(y)
                R.output(z)
            return z

    def calls(target):
        lowered = rt.lowering.prepare.lower_for_tuning(Gelu, target)
        names = set()
        for _, f in lowered.functions.items():
            if isinstance(f, tirx.PrimFunc):
                names |= _calls(f)
        return names

    assert not {"tirx.erf", "tirx.exp"} & calls(rt.host_target())
    assert {"tirx.erf", "tirx.exp"} <= calls(tvm.target.Target("cuda"))
    assert isinstance(FastMath(), tvm.transform.Pass)


def test_fast_math_survives_inlining_into_a_dynamic_dispatch(tmp_path):
    """Scheduling copies a rewritten exp into both consumers of its block; the dynamic-shape
    dispatch (printed and parsed, relax_tune.dynamic) must still accept the function and
    run it correctly (with Let-bound temporaries the parser rejected it: fm_x defined
    twice)."""
    from relax_tune import dynamic

    n = tirx.Var("n", "int64")
    a = te.placeholder((n, 16), name="A")
    b = te.compute((n, 16), lambda i, j: tirx.exp(a[i, j]), name="B")
    c = te.compute((n, 16), lambda i, j: b[i, j] + 1.0, name="C")
    d = te.compute((n, 16), lambda i, j: b[i, j] * 2.0, name="D")
    func = fast_math_func(te.create_prim_func([a, c, d]))
    sch = tvm.s_tir.Schedule(func)
    sch.compute_inline(sch.get_sblock("B"))
    mod = tvm.IRModule({"main": dynamic.dispatch_function(
        func, [({"n": 16}, sch.mod["main"]), ({"n": 64}, sch.mod["main"])])})
    lib = tvm.compile(mod, target=rt.host_target())
    path = str(tmp_path / "dispatch.so")
    lib.export_library(path)
    main = tvm.runtime.load_module(path)["main"]
    for size in (5, 40, 100):
        x = np.random.default_rng(size).standard_normal((size, 16)).astype("float32")
        outs = [tvm.runtime.tensor(np.zeros_like(x)) for _ in range(2)]
        main(tvm.runtime.tensor(x), *outs)
        np.testing.assert_allclose(outs[0].numpy(), np.exp(x) + 1, rtol=2e-6)
        np.testing.assert_allclose(outs[1].numpy(), np.exp(x) * 2, rtol=2e-6)


def test_host_target_lets_llvm_vectorise_reductions():
    """``host_target()`` carries the reassociation flags, so LLVM vectorises a row sum the
    schedule left scalar (a vector ``fadd`` reduction in the IR); ``reassociate=False``
    keeps strict order (scalar). Both give the sum to float32 rounding."""
    n = 1000
    a = te.placeholder((8, n), name="A")
    k = te.reduce_axis((0, n), name="k")
    b = te.compute((8,), lambda i: te.sum(a[i, k], axis=k), name="B")
    func = te.create_prim_func([a, b]).with_attr("global_symbol", "main")
    x = np.random.default_rng(0).uniform(-1, 1, (8, n)).astype("float32")
    for reassociate in (True, False):
        target = rt.host_target(reassociate=reassociate)
        assert all(bool(target.attrs.get(flag, False)) == reassociate
                   for flag in rt.utils.REASSOCIATE_FLAGS)
        lib = tvm.compile(tvm.IRModule({"main": func}), target)
        assert ("vector.reduce.fadd" in lib.mod.inspect_source("ll")) == reassociate
        out = tvm.runtime.empty((8,), "float32", tvm.cpu())
        lib["main"](tvm.runtime.tensor(x), out)
        np.testing.assert_allclose(out.numpy(), x.astype("float64").sum(1), rtol=1e-4,
                                   atol=1e-4)


def test_round_half_to_even_is_vectorised():
    """Relax's ``round`` (every int8 requantisation) legalizes to ``nearbyint``, which TVM's
    vectorizer left scalar: the loop ran on LLVM's own 8-lane vectors. Rewritten to
    ``round``, the same half-to-even ``llvm.nearbyint``, it is vectorised as scheduled."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 3.51, 1e7 + 1, -0.0, 254.5, 255.5,
                  7.5, 8.5, -7.5, -8.5] * 4, dtype="float32").reshape(4, 16)
    mod = _vectorised(tirx.nearbyint, x.shape)
    assert "tirx.nearbyint" not in _calls(mod["main"])
    lib = tvm.compile(mod, target=rt.host_target())
    assert "<16 x float>" in lib.mod.inspect_source("ll")
    out = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), np.rint(x))  # numpy's rint: half to even
