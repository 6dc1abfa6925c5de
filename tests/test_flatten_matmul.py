"""3-D projections made 2-D, as torch.export makes them (lowering/flatten_matmul.py)."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from relax_tune.lowering.flatten_matmul import flatten_matmul_rows

from model_checks import run_zero_pipeline

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 24)).astype("float32")
BIAS = RNG.standard_normal((24,)).astype("float32")


def _ffn_tail(rows_3d: bool) -> tvm.IRModule:
    """A projection as TVM's ONNX importer gives it (``rows_3d``: ``(1, 8, 16)`` by
    ``(16, 24)``) or as torch.export does (2-D, reshaped after the bias), then the
    residual add and a GELU."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 16), "float32"))
    r = relax.Var("r", relax.TensorType((1, 8, 24), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            if rows_3d:
                y = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(W)), relax.const(BIAS)))
            else:
                flat = bb.emit(relax.op.reshape(x, [8, 16]))
                y = bb.emit(relax.op.add(relax.op.matmul(flat, relax.const(W)),
                                         relax.const(BIAS)))
                y = bb.emit(relax.op.reshape(y, [1, 8, 24]))
            out = bb.emit_output(relax.op.nn.gelu(relax.op.add(y, r)))
        bb.emit_func_output(out)
    return bb.get()


def _matmul_ranks(mod: tvm.IRModule) -> list[int]:
    ranks = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.matmul":
            ranks.append(len(expr.args[0].ty.shape))

    relax.analysis.post_order_visit(mod["main"], visit)
    return ranks


def test_a_3d_projection_becomes_the_graph_torch_export_makes():
    """The ONNX form's matmul becomes 2-D with its bias, the residual add and the GELU stay
    after the reshape, as in torch.export's graph (so the same tasks, and the shipped
    library's records of them, serve both), and it computes the same."""
    mod = _ffn_tail(rows_3d=True)
    out = flatten_matmul_rows(mod)
    assert _matmul_ranks(mod) == [3] and _matmul_ranks(out) == [2]
    tidy = tvm.transform.Sequential([relax.transform.FoldConstant(),
                                     relax.transform.CanonicalizeBindings()])
    assert tvm_ffi.structural_equal(tidy(out), tidy(_ffn_tail(rows_3d=False)))
    x = RNG.standard_normal((1, 8, 16)).astype("float32")
    r = RNG.standard_normal((1, 8, 24)).astype("float32")
    np.testing.assert_allclose(run_zero_pipeline(out, x, r), run_zero_pipeline(mod, x, r), rtol=1e-5, atol=1e-6)


def test_a_2d_projection_is_left_as_it_is():
    mod = _ffn_tail(rows_3d=False)
    assert tvm_ffi.structural_equal(flatten_matmul_rows(mod), mod)


def test_a_bias_on_the_left_of_a_subtraction_stays_on_the_left():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            product = relax.op.matmul(x, relax.const(W))
            out = bb.emit_output(relax.op.subtract(relax.const(BIAS), product))
        bb.emit_func_output(out)
    mod = bb.get()
    out = flatten_matmul_rows(mod)
    assert _matmul_ranks(out) == [2]
    x = RNG.standard_normal((2, 8, 16)).astype("float32")
    np.testing.assert_allclose(run_zero_pipeline(out, x), run_zero_pipeline(mod, x), rtol=1e-5, atol=1e-6)
