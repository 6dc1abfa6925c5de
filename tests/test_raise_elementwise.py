"""Elementwise kernels written at import raised back to Relax operators
(lowering/raise_elementwise.py): an ONNX Clip after a convolution, as TVM imports it."""

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi

from relax_tune.lowering.prepare import graph_passes
from relax_tune.lowering.raise_elementwise import RaiseElementwiseCalls, elementwise_op
from relax_tune.lowering.rewrite import count_calls


@pytest.fixture(scope="module")
def conv_clip_onnx(tmp_path_factory) -> str:
    """Conv -> Clip(0, 6) -> Conv -> Clip(0, 6): MobileNet's ReLU6, opset 13 (bounds as
    inputs, which TVM imports as call_tir(maximum) and call_tir(minimum))."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype("float32"), "w2"),
             numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
             numpy_helper.from_array(np.array(6.0, "float32"), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = str(tmp_path_factory.mktemp("onnx") / "conv_clip.onnx")
    onnx.save(model, path)
    return path


def _call_tirs(mod: tvm.IRModule) -> int:
    return count_calls(mod, "relax.call_tir")


def test_onnx_clip_becomes_operators_and_keeps_the_channels_last_layout(conv_clip_onnx, target):
    from relax_tune.lowering.prepare import bind_params
    from relax_tune.model_loader import load_model

    loaded = load_model(conv_clip_onnx)
    mod = bind_params(loaded.mod, loaded.params)
    assert _call_tirs(mod) == 4  # as imported: two maxima, two minima
    with target:
        out = tvm.transform.Sequential(graph_passes(target))(mod)
    assert _call_tirs(out) == 0
    assert count_calls(out, "relax.clip") == 2  # each maximum-minimum pair
    # the layout is carried through the clips: transposes only at the model's two edges
    assert count_calls(out, "relax.permute_dims") == 2
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype("float32")

    def run(m):
        with target:
            lowered = relax.get_pipeline("zero")(m)
        vm = relax.VirtualMachine(tvm.compile(lowered, target), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    expected = run(mod)
    assert expected.min() == 0.0 and expected.max() == 6.0  # both bounds act
    np.testing.assert_allclose(run(out), expected, rtol=1e-5, atol=1e-5)


def _prim(fcompute, *shapes):
    tensors = [te.placeholder(s, name=f"t{i}") for i, s in enumerate(shapes)]
    return te.create_prim_func([*tensors, fcompute(*tensors)])


def test_only_elementwise_binary_kernels_are_raised():
    assert elementwise_op(_prim(topi.maximum, (2, 3), ())) is relax.op.maximum
    assert elementwise_op(_prim(topi.add, (2, 3), (2, 3))) is relax.op.add
    # a broadcast along an axis, a reduction, a transpose and a unary op are left alone
    assert elementwise_op(_prim(topi.add, (2, 3), (3,))) is None
    assert elementwise_op(_prim(lambda a, b: topi.sum(topi.add(a, b), axis=1),
                                (2, 3), (2, 3))) is None
    assert elementwise_op(_prim(lambda a, b: topi.add(topi.transpose(a), b),
                                (3, 3), (3, 3))) is None
    assert elementwise_op(_prim(topi.exp, (2, 3))) is None


def test_a_module_without_such_kernels_is_returned_as_it_is():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        out = bb.emit(relax.op.exp(x))
        bb.emit_func_output(out)
    mod = bb.get()
    assert RaiseElementwiseCalls()(mod).same_as(mod)
