"""ONNX models as TVM's importer writes them, through the "relax_tune" graph passes: the
importer's conventions differ from PyTorch's (a convolution's out_dtype left unset)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_tune.lowering.prepare import bind_params, graph_passes
from relax_tune.lowering.rewrite import count_calls


@pytest.fixture(scope="module")
def patch_embedding_onnx(tmp_path_factory) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """A ViT's patch embedding: Conv 4x4 / stride 4 with a bias, then an Add."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 4, 4)).astype("float32")
    b = rng.standard_normal(8).astype("float32")
    pos = rng.standard_normal((1, 8, 2, 2)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[4, 4],
                              strides=[4, 4]),
             helper.make_node("Add", ["c", "pos"], ["y"])]
    graph = helper.make_graph(
        nodes, "patches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 2, 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(pos, "pos")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = str(tmp_path_factory.mktemp("onnx") / "patches.onnx")
    onnx.save(model, path)
    return path, w, b, pos


def test_an_onnx_patch_convolution_becomes_a_float_matmul(patch_embedding_onnx, target):
    """The importer leaves the convolution's out_dtype unset (None); the patch GEMM once
    took it as "void" and the Add after it failed ("Binary operators must have the
    same datatype"), so an ONNX ViT did not compile."""
    from relax_tune.model_loader import load_model

    path, w, b, pos = patch_embedding_onnx
    loaded = load_model(path)
    with target:
        out = tvm.transform.Sequential(graph_passes(target))(bind_params(loaded.mod,
                                                                         loaded.params))
        lowered = relax.get_pipeline("zero")(out)
    assert count_calls(out, "relax.nn.conv2d") == 0 and count_calls(out, "relax.matmul") == 1
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(lowered, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    patches = x.reshape(1, 3, 2, 4, 2, 4).transpose(0, 2, 4, 1, 3, 5).reshape(4, 48)
    expected = (patches @ w.reshape(8, 48).T + b).T.reshape(1, 8, 2, 2) + pos
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
