"""ONNX Runtime's QOperator nodes read as the QDQ groups they stand for, before TVM's importer.

ONNX Runtime's quantizer writes a model in one of two formats. QDQ (QuantizeLinear /
DequantizeLinear pairs around float operators) goes through TVM's importer and
``lowering.int8``. QOperator replaces each quantized operator by one node of integer
inputs and outputs (``QLinearConv``, ``QLinearMatMul``, and in the ``com.microsoft`` domain
``QLinearAdd``, ``QGemm``, ...), which TVM's importer does not read. Each node is exactly
the QDQ group below it (the definitions in ONNX's and ONNX Runtime's operator documents), so
this rewrite turns a QOperator model into a QDQ one and the rest of relax_tune treats both
alike:

    QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)
        -> Q(Conv(DQ(x, xs, xz), DQ(w, ws, wz, axis 0), DQ(B, xs * ws, axis 0)), ys, yz)
    QLinearMatMul(a, as, az, b, bs, bz, ys, yz) -> Q(MatMul(DQ(a), DQ(b, axis -1)), ys, yz)
    QLinearAdd / QLinearMul (A, As, Az, B, Bs, Bz, Cs, Cz) -> Q(Add / Mul(DQ(A), DQ(B)), Cs, Cz)
    QLinearGlobalAveragePool(X, xs, xz, ys, yz), NCHW -> Q(GlobalAveragePool(DQ(X)), ys, yz)
    QLinearSoftmax(X, xs, xz, ys, yz), opset >= 13 -> Q(Softmax(DQ(X)), ys, yz)
    QLinearAveragePool / QLinearLeakyRelu / QLinearSigmoid (X, xs, xz, ys, yz)
        -> Q(AveragePool (NCHW) / LeakyRelu / Sigmoid(DQ(X)), ys, yz)
    QLinearConcat(ys, yz, X1, x1s, x1z, X2, ...) -> Q(Concat(DQ(X1), DQ(X2), ...), ys, yz)
    QGemm(A, as, az, B, bs, bz, C, ys, yz)
        -> Q(Gemm(DQ(A), DQ(B), DQ(C, alpha * as * bs)), ys, yz)   (float output without ys)
    MatMulIntegerToFloat(A, B, as, bs, az, bz, bias) -> MatMul(DQ(A), DQ(B)) + bias

The int32 bias's scale (``xs * ws``, as ONNX Runtime's QDQ format writes it) is computed
here when both scales are constants, else by a ``Mul`` node. Other QOperator nodes
(channels-last pooling, the dynamic ``ConvInteger`` / ``MatMulInteger``, ...) are left as
they are, and TVM's importer names them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MS = "com.microsoft"


class _Graph:
    """The new nodes and constants of a rewrite, with fresh names."""

    def __init__(self, model: Any) -> None:
        self.constants = {i.name: i for i in model.graph.initializer}  # read when needed
        self.nodes: list = []
        self.initializers: list = []
        self.count = 0

    def name(self, base: str, what: str) -> str:
        self.count += 1
        return f"{base}__{what}{self.count}"

    def node(self, op: str, inputs: list[str], base: str, what: str, output: str | None = None,
             **attrs) -> str:
        from onnx import helper

        out = output or self.name(base, what)
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def dq(self, x: str, scale: str, zero: str, base: str, axis: int | None = None) -> str:
        inputs = [x, scale] + ([zero] if zero else [])
        attrs = {"axis": axis} if axis is not None else {}
        return self.node("DequantizeLinear", inputs, base, "dq", **attrs)

    def q(self, y: str, scale: str, zero: str, output: str) -> str:
        inputs = [y, scale] + ([zero] if zero else [])
        return self.node("QuantizeLinear", inputs, output, "q", output=output)

    def product(self, a: str, b: str, base: str, factor: float = 1.0) -> str:
        """``factor * a * b`` (float32): a constant when both are, else ``Mul`` nodes."""
        from onnx import numpy_helper

        if a in self.constants and b in self.constants:
            x, y = (numpy_helper.to_array(self.constants[n]).astype(np.float32) for n in (a, b))
            value = (np.float32(factor) * x * y).astype(np.float32)
            name = self.name(base, "scale")
            self.initializers.append(numpy_helper.from_array(value, name))
            return name
        out = self.node("Mul", [a, b], base, "scale")
        if factor != 1.0:
            const = self.name(base, "alpha")
            self.initializers.append(numpy_helper.from_array(np.float32(factor), const))
            out = self.node("Mul", [out, const], base, "scale")
        return out


def _arg(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _conv(g: _Graph, node) -> bool:
    x, xs, xz, w, ws, wz, ys, yz, b = (_arg(node, i) for i in range(9))
    base = node.output[0]
    inputs = [g.dq(x, xs, xz, base), g.dq(w, ws, wz, base, axis=0)]
    if b:
        inputs.append(g.dq(b, g.product(xs, ws, base), "", base, axis=0))
    y = g.node("Conv", inputs, base, "conv", **_attrs(node))
    g.q(y, ys, yz, base)
    return True


def _matmul(g: _Graph, node) -> bool:
    a, as_, az, b, bs, bz, ys, yz = (_arg(node, i) for i in range(8))
    base = node.output[0]
    y = g.node("MatMul", [g.dq(a, as_, az, base), g.dq(b, bs, bz, base, axis=-1)], base, "mm")
    g.q(y, ys, yz, base)
    return True


def _binary(op: str):
    def rewrite(g: _Graph, node) -> bool:
        a, as_, az, b, bs, bz, cs, cz = (_arg(node, i) for i in range(8))
        base = node.output[0]
        y = g.node(op, [g.dq(a, as_, az, base), g.dq(b, bs, bz, base)], base, op.lower())
        g.q(y, cs, cz, base)
        return True
    return rewrite


def _unary(op: str, allowed):
    def rewrite(g: _Graph, node) -> bool:
        attrs = _attrs(node)
        kept = allowed(attrs)
        if kept is None:
            return False
        x, xs, xz, ys, yz = (_arg(node, i) for i in range(5))
        base = node.output[0]
        y = g.node(op, [g.dq(x, xs, xz, base)], base, op.lower(), **kept)
        g.q(y, ys, yz, base)
        return True
    return rewrite


def _concat(g: _Graph, node) -> bool:
    ys, yz, *inputs = list(node.input)
    if len(inputs) % 3:
        return False  # each input comes with its scale and zero point
    base = node.output[0]
    parts = [g.dq(x, xs, xz, base) for x, xs, xz in zip(*[iter(inputs)] * 3)]
    g.q(g.node("Concat", parts, base, "concat", axis=_attrs(node)["axis"]), ys, yz, base)
    return True


_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


def _pool_attrs(attrs: dict) -> dict | None:
    """AveragePool's attributes of a QLinearAveragePool (None: channels-last, left alone)."""
    if attrs.get("channels_last", 0):
        return None
    return {k: attrs[k] for k in _POOL_ATTRS if k in attrs}


def _gemm(g: _Graph, node) -> bool:
    a, as_, az, b, bs, bz, c, ys, yz = (_arg(node, i) for i in range(9))
    attrs = _attrs(node)
    base = node.output[0]
    trans_b = int(attrs.get("transB", 0))
    alpha = float(attrs.get("alpha", 1.0))
    inputs = [g.dq(a, as_, az, base), g.dq(b, bs, bz, base, axis=0 if trans_b else 1)]
    if c:
        inputs.append(g.dq(c, g.product(as_, bs, base, alpha), "", base, axis=0))
    gemm = {k: attrs[k] for k in ("alpha", "transA", "transB") if k in attrs}
    if ys:
        g.q(g.node("Gemm", inputs, base, "gemm", **gemm), ys, yz, base)
    else:
        g.node("Gemm", inputs, base, "gemm", output=base, **gemm)
    return True


def _matmul_to_float(g: _Graph, node) -> bool:
    a, b, as_, bs, az, bz, bias = (_arg(node, i) for i in range(7))
    base = node.output[0]
    y = [g.dq(a, as_, az, base), g.dq(b, bs, bz, base, axis=-1)]
    if bias:
        g.node("Add", [g.node("MatMul", y, base, "mm"), bias], base, "add", output=base)
    else:
        g.node("MatMul", y, base, "mm", output=base)
    return True


_REWRITES = {
    ("", "QLinearConv"): _conv,
    ("", "QLinearMatMul"): _matmul,
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearGlobalAveragePool"): _unary(
        "GlobalAveragePool", lambda a: {} if not a.get("channels_last", 0) else None),
    (MS, "QLinearSoftmax"): _unary(
        "Softmax", lambda a: {"axis": a.get("axis", -1)} if a.get("opset", 13) >= 13 else None),
    (MS, "QLinearAveragePool"): _unary("AveragePool", _pool_attrs),
    (MS, "QLinearLeakyRelu"): _unary("LeakyRelu", lambda a: {"alpha": a.get("alpha", 0.01)}),
    (MS, "QLinearSigmoid"): _unary("Sigmoid", lambda a: {}),
    (MS, "QLinearConcat"): _concat,
    (MS, "QGemm"): _gemm,
    (MS, "MatMulIntegerToFloat"): _matmul_to_float,
}
COVERED = sorted(op for _, op in _REWRITES)
"""The QOperator node types read as QDQ groups."""


def qoperator_as_qdq(model: Any) -> tuple[Any, int]:
    """``(model with its covered QOperator nodes as QDQ groups, how many were rewritten)``;
    the model itself when it has none (see the module docstring)."""
    keyed = [((n.domain if n.domain not in ("ai.onnx",) else ""), n.op_type)
             for n in model.graph.node]
    if not any(k in _REWRITES for k in keyed):
        return model, 0
    g = _Graph(model)
    rewritten = 0
    for node, key in zip(model.graph.node, keyed):
        rewrite = _REWRITES.get(key)
        if rewrite is not None and rewrite(g, node):
            rewritten += 1
        else:
            g.nodes.append(node)
    out = type(model)()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(g.nodes)
    out.graph.initializer.extend(g.initializers)
    if not any(n.domain == MS for n in out.graph.node):
        kept = [o for o in out.opset_import if o.domain != MS]
        del out.opset_import[:]
        out.opset_import.extend(kept)
    logger.info("%d QOperator node(s) read as QuantizeLinear/DequantizeLinear groups",
                rewritten)
    return out, rewritten
