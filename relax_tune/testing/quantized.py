"""Quantized ONNX models for the int8 tests and benchmarks, made as users make them: a float
model, then ONNX Runtime's static quantizer (QDQ format, u8 activations, s8 weights per
channel) calibrated on seeded random inputs. Needs ``onnx`` and ``onnxruntime``
(imported here, when a model is made)."""

from __future__ import annotations

import os

import numpy as np


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def cnn_model(channels: int = 8, size: int = 16):
    """conv3x3(3->c, pad 1) -> ReLU -> max pool 3x3 (stride 1, pad 1) -> depthwise
    conv3x3(c, stride 2) -> ReLU -> conv1x1(c->2c) -> global average pool -> flatten ->
    Gemm(2c->10), input ``x`` of shape ``(1, 3, size, size)``: an ``onnx.ModelProto``
    (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = {"w1": _w(rng, channels, 3, 3, 3), "b1": _w(rng, channels),
             "w2": _w(rng, channels, 1, 3, 3), "b2": _w(rng, channels),
             "w3": _w(rng, 2 * channels, channels, 1, 1), "b3": _w(rng, 2 * channels),
             "fc": _w(rng, 10, 2 * channels), "fcb": _w(rng, 10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["m1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1],
                         strides=[2, 2], group=channels),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def block_model(seq: int = 8, dim: int = 32, hidden: int = 64):
    """A transformer encoder block without normalisation, input ``x`` of shape
    ``(1, seq, dim)``: q, k, v projections (MatMul + Add), softmax(q k^T / sqrt(dim)) v, an
    output projection and a residual add, then MatMul(dim->hidden) + bias -> ReLU ->
    MatMul(hidden->dim) + bias and a second residual: an ``onnx.ModelProto`` (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = {"wq": _w(rng, dim, dim), "bq": _w(rng, dim), "wk": _w(rng, dim, dim),
             "bk": _w(rng, dim), "wv": _w(rng, dim, dim), "bv": _w(rng, dim),
             "wo": _w(rng, dim, dim), "bo": _w(rng, dim), "w1": _w(rng, dim, hidden),
             "b1": _w(rng, hidden), "w2": _w(rng, hidden, dim), "b2": _w(rng, dim),
             "scale": np.array(1 / np.sqrt(dim), np.float32)}
    mk = helper.make_node
    nodes = []
    for name in "qkv":
        nodes += [mk("MatMul", ["x", f"w{name}"], [f"{name}0"]),
                  mk("Add", [f"{name}0", f"b{name}"], [name])]
    nodes += [
        mk("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        mk("MatMul", ["q", "kt"], ["s0"]), mk("Mul", ["s0", "scale"], ["s"]),
        mk("Softmax", ["s"], ["a"], axis=-1), mk("MatMul", ["a", "v"], ["av"]),
        mk("MatMul", ["av", "wo"], ["o0"]), mk("Add", ["o0", "bo"], ["o"]),
        mk("Add", ["x", "o"], ["h"]),
        mk("MatMul", ["h", "w1"], ["f0"]), mk("Add", ["f0", "b1"], ["f1"]),
        mk("Relu", ["f1"], ["f"]),
        mk("MatMul", ["f", "w2"], ["g0"]), mk("Add", ["g0", "b2"], ["g"]),
        mk("Add", ["h", "g"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def branch_model(channels: int = 8, size: int = 16):
    """conv3x3(3->c) -> LeakyRelu and conv3x3(3->c) -> Sigmoid, concatenated (2c channels)
    -> average pool 2x2 (stride 2) -> conv1x1(2c->c), input ``x`` of shape
    ``(1, 3, size, size)``: the operators ONNX Runtime's QOperator format writes as
    QLinearLeakyRelu, QLinearSigmoid, QLinearConcat and QLinearAveragePool (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = {"wa": _w(rng, channels, 3, 3, 3), "ba": _w(rng, channels),
             "wb": _w(rng, channels, 3, 3, 3), "bb": _w(rng, channels),
             "wc": _w(rng, channels, 2 * channels, 1, 1), "bc": _w(rng, channels)}
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["ca"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["ca"], ["a"], alpha=0.1),
        helper.make_node("Conv", ["x", "wb", "bb"], ["cb"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["cb"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
        helper.make_node("AveragePool", ["ab"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "wc", "bc"], ["y"]),
    ]
    half = size // 2
    graph = helper.make_graph(
        nodes, "branch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, half, half])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mbconv_model(channels: int = 8, size: int = 16):
    """EfficientNet's block as ``torch.onnx.export`` writes it (SiLU as ``x * Sigmoid(x)``):
    conv3x3(3->c, pad 1) -> SiLU -> depthwise conv3x3(c, pad 1) -> SiLU -> squeeze and
    excite (global average pool -> conv1x1(c->4) -> SiLU -> conv1x1(4->c) -> Sigmoid, the
    block's tensor times it) -> conv1x1(c->2c), input ``x`` of shape ``(1, 3, size, size)``:
    an ``onnx.ModelProto`` (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = {"w1": _w(rng, channels, 3, 3, 3), "b1": _w(rng, channels),
             "w2": _w(rng, channels, 1, 3, 3), "b2": _w(rng, channels),
             "ws": _w(rng, 4, channels, 1, 1), "bs": _w(rng, 4),
             "we": _w(rng, channels, 4, 1, 1), "be": _w(rng, channels),
             "w3": _w(rng, 2 * channels, channels, 1, 1), "b3": _w(rng, 2 * channels)}
    mk = helper.make_node

    def silu(x: str, y: str) -> list:
        return [mk("Sigmoid", [x], [f"{y}_s"]), mk("Mul", [x, f"{y}_s"], [y])]

    nodes = [
        mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), *silu("c1", "a1"),
        mk("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=channels),
        *silu("c2", "a2"),
        mk("GlobalAveragePool", ["a2"], ["p"]),
        mk("Conv", ["p", "ws", "bs"], ["s1"]), *silu("s1", "s2"),
        mk("Conv", ["s2", "we", "be"], ["e1"]), mk("Sigmoid", ["e1"], ["e"]),
        mk("Mul", ["a2", "e"], ["a3"]),
        mk("Conv", ["a3", "w3", "b3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mbconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * channels, size, size])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def calibration_inputs(shape: tuple[int, ...], count: int = 8, name: str = "x",
                       seed: int = 0, like: np.ndarray | None = None
                       ) -> list[dict[str, np.ndarray]]:
    """``count`` seeded inputs ``{name: array}`` for calibration: standard-normal float32,
    or, ``like`` an integer array (a transformer's token ids), integers from 0 to its
    largest value, of its type."""
    rng = np.random.default_rng(seed)
    if like is not None and np.issubdtype(like.dtype, np.integer):
        high = int(like.max()) + 1
        return [{name: rng.integers(0, high, shape).astype(like.dtype)} for _ in range(count)]
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def quantize_qdq(float_path: str, qdq_path: str, inputs: list[dict[str, np.ndarray]],
                 per_channel: bool = True, weight_type: str = "int8",
                 quant_format: str = "QDQ", reduce_range: bool = False) -> str:
    """Quantize the ONNX model at ``float_path`` with ONNX Runtime's ``quantize_static``
    (QDQ format, or ``quant_format="QOperator"``; u8 activations, s8 weights
    (``weight_type="uint8"``: u8, asymmetric), per channel unless told otherwise;
    ``reduce_range``: 7-bit weights, what ONNX Runtime recommends for x86 CPUs without VNNI)
    calibrated on ``inputs``; write it to ``qdq_path`` and return that path."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(inputs)

        def get_next(self):
            return next(self._it, None)

    quantize_static(float_path, qdq_path, _Reader(), quant_format=QuantFormat[quant_format],
                    per_channel=per_channel, reduce_range=reduce_range,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8 if weight_type == "int8" else QuantType.QUInt8)
    return qdq_path


def save_quantized(model, folder: str, name: str, calibration: int = 8,
                   **options) -> tuple[str, str]:
    """Save the float ``model`` (an ``onnx.ModelProto`` with one input) in ``folder`` and
    its QDQ quantization beside it (``options`` as for ``quantize_qdq``): ``(float path,
    QDQ path)``."""
    import onnx

    inp = model.graph.input[0]
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
    float_path = os.path.join(folder, f"{name}.onnx")
    onnx.save(model, float_path)
    qdq_path = quantize_qdq(float_path, os.path.join(folder, f"{name}_qdq.onnx"),
                            calibration_inputs(shape, calibration, inp.name), **options)
    return float_path, qdq_path


def ort_run(path: str, x: np.ndarray, basic: bool = False, threads: int = 2) -> np.ndarray:
    """Run the ONNX file at ``path`` on input ``x`` (named ``x``) with ONNX Runtime's CPU
    provider; ``basic``: basic graph optimisations only, so a QDQ model is not fused into
    ONNX Runtime's integer kernels and computes what ONNX defines."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if basic:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def output_scale(path: str) -> float | None:
    """The scale of the DequantizeLinear that makes a QDQ file's output (one output
    quantisation step), or None when the output is not dequantized by a constant scale."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    out = model.graph.output[0].name
    init = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == out \
                and node.input[1] in init:
            return float(numpy_helper.to_array(init[node.input[1]]).reshape(-1)[0])
    return None
