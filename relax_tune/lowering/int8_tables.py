"""Quantized elementwise functions as tables: ``quantize(f(dequantize(q)))`` of a u8/s8
tensor ``q`` with per-tensor parameters takes one of 256 values per input value, so it is
computed once per value at compile time and looked up at run time, a gather from a
256-entry constant, whatever ``f`` costs.

A BERT-class encoder's feed-forward GELU was the case: its kernel (the float bias add,
quantize, dequantize, GELU's ``erf`` polynomial, which repeats its operand's whole chain,
and the last quantize, for 128 x 1024 values) ran 112-116 us in place, 4 of them in a
2.5 ms model (Intel Xeon, 2 threads).

The table is computed as ONNX defines the three steps: the dequantize in float32, ``f`` in
float64 rounded to float32, the quantize in float32 rounding half to even and saturating.
Only functions of one operand listed in ``FUNCTIONS`` are rewritten.

A tensor times a quantized function of itself, ``quantize(x * dequantize(quantize(f(x))))``
with ``x = dequantize(q)``, is one table too: SiLU as ``torch.onnx.export`` writes it
(``x * Sigmoid(x)``), after every convolution of an EfficientNet. As two lookups and a
multiply, EfficientNet-B0's int8 model spent 6.5 ms of its 28 ms in the lookups and most of
the rest in the multiplies and the transposes around them (Zen 4, 2 threads).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .qparams import INT8_TYPES, dtype_range, qparams_of
from .rewrite import ELEMWISE, OPAQUE, rewrite_functions


def _gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


FUNCTIONS = {"relax.nn.gelu": _gelu, "relax.nn.gelu_tanh": _gelu_tanh,
             "relax.sigmoid": _sigmoid, "relax.tanh": math.tanh,
             "relax.nn.silu": lambda x: x * _sigmoid(x)}
"""The Relax operators rewritten, and their float definitions."""


def _pattern():
    q = wildcard()
    dq = is_op("relax.dequantize")(q, is_const(), is_const())
    functions = [is_op(name)(dq) for name in FUNCTIONS]
    f = functions[0]
    for other in functions[1:]:
        f = f | other
    return is_op("relax.quantize")(f, is_const(), is_const()), dict(q=q, dq=dq, f=f)


def _dequantized(values: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return (values.astype(np.int64) - zero).astype(np.float32) * np.float32(scale)


def _quantized(y: np.ndarray, scale: float, zero: int, dtype: str) -> np.ndarray:
    out = np.rint(y.astype(np.float32) / np.float32(scale)).astype(np.float64) + zero
    return np.clip(out, *dtype_range(dtype)).astype(np.int32)


def _applied(function, x: np.ndarray) -> np.ndarray:
    return np.array([function(float(v)) for v in x], dtype=np.float64).astype(np.float32)


def quantized_table(function, x_scale: float, x_zero: int, x_dtype: str, y_scale: float,
                    y_zero: int, y_dtype: str) -> np.ndarray:
    """``quantize(function(dequantize(v)))`` for every ``v`` of ``x_dtype`` in increasing
    order (0..255 for u8, -128..127 for s8), as int32."""
    low, high = dtype_range(x_dtype)
    x = _dequantized(np.arange(low, high + 1), x_scale, x_zero)
    return _quantized(_applied(function, x), y_scale, y_zero, y_dtype)


def gated_table(function, x, inner, y) -> np.ndarray:
    """``quantize(x * dequantize(quantize(function(x))))`` with ``x = dequantize(v)`` for
    every ``v`` of ``x.dtype`` in increasing order, as int32; ``x``, ``inner`` (the
    function's quantize) and ``y`` are per-tensor ``QParams``. The product is float32, as
    ONNX's ``Mul``."""
    low, high = dtype_range(x.dtype)
    xs = _dequantized(np.arange(low, high + 1), float(x.scale), int(x.zero_point))
    gate = _quantized(_applied(function, xs), float(inner.scale), int(inner.zero_point),
                      inner.dtype)
    gate = _dequantized(gate, float(inner.scale), int(inner.zero_point))
    return _quantized(xs * gate, float(y.scale), int(y.zero_point), y.dtype)


def _gated_pattern():
    """``quantize(x * dequantize(quantize(f(x))))``, ``x = dequantize(q)``, either order."""
    inner, parts = _pattern()
    gate = is_op("relax.dequantize")(inner, is_const(), is_const())
    product = is_op("relax.multiply")(parts["dq"], gate) | is_op("relax.multiply")(
        gate, parts["dq"])
    return is_op("relax.quantize")(product, is_const(), is_const()), dict(parts, inner=inner)


def _per_tensor_int8(*params) -> bool:
    return all(p is not None and p.per_tensor and p.dtype in INT8_TYPES for p in params)


def _lookup(q: relax.Expr, x_dtype: str, table: np.ndarray, y_dtype: str) -> relax.Expr:
    index = relax.op.astype(q, "int32")
    if x_dtype == "int8":
        index = relax.op.add(index, relax.const(128, "int32"))
    # "clip": a u8 index is always in bounds, and a "fast" take logs a warning (take_mode.py)
    return relax.op.astype(relax.op.take(relax.const(table), index, axis=0, mode="clip"),
                           y_dtype)


def _rewrite(matched: relax.Call, matches: dict, parts: dict) -> relax.Expr:
    q = matches[parts["q"]]
    x, y = qparams_of(matches[parts["dq"]]), qparams_of(matched)
    if not _per_tensor_int8(x, y) or str(q.ty.dtype) != x.dtype:
        return matched
    function = FUNCTIONS[matches[parts["f"]].op.name]
    if "inner" in parts:
        inner = qparams_of(matches[parts["inner"]])
        if not _per_tensor_int8(inner):
            return matched
        return _lookup(q, x.dtype, gated_table(function, x, inner, y), y.dtype)
    table = quantized_table(function, float(x.scale), int(x.zero_point), x.dtype,
                            float(y.scale), int(y.zero_point), y.dtype)
    return _lookup(q, x.dtype, table, y.dtype)


def quantized_functions_as_tables(mod):
    """``mod`` with each ``quantize(f(dequantize(q)))`` of ``FUNCTIONS``, and each
    ``quantize(x * dequantize(quantize(f(x))))`` with ``x = dequantize(q)``, looked up in a
    table (see the module docstring)."""
    for pattern, parts in (_gated_pattern(), _pattern()):  # the gated ones first: whole
        mod = rewrite_functions(mod, pattern, lambda e, m, p=parts: _rewrite(e, m, p))
    return mod


def _is_table_lookup(func) -> bool:
    """Whether a legalized PrimFunc is ``take`` of a 1-D table of at most 256 entries by an
    index tensor of the output's shape (one ``T_take`` block)."""
    params = list(func.params)
    if len(params) != 3 or not all(isinstance(p, tvm.tirx.Buffer) for p in params) \
            or len(params[0].shape) != 1:
        return False
    entries, index, out = params[0].shape[0], params[1].shape, params[2].shape
    if not isinstance(entries, tvm.tirx.IntImm) or int(entries) > 256 \
            or len(index) != len(out) or not all(
                isinstance(a, tvm.tirx.IntImm) and isinstance(b, tvm.tirx.IntImm)
                and int(a) == int(b) for a, b in zip(index, out)):
        return False
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    return len(blocks) == 1 and sch.get(blocks[0]).name_hint == "T_take"


@tvm.transform.module_pass(opt_level=0, name="relax_tune.FusibleTableLookups")
class FusibleTableLookups:
    """Let ``FuseOps`` fuse the table lookups into the kernels around them: each output
    element of a lookup reads its own index and the (constant) table, an elementwise
    operation, which ``AnnotateTIROpPattern`` calls opaque because the index is data.
    Unfused, EfficientNet-B0's int8 lookups were kernels of their own that read and wrote
    int32 tensors: 1.6 ms of its 6.2 ms (Zen 4, 2 threads). Run after
    ``AnnotateTIROpPattern``, before ``FuseOps``."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its table lookups' PrimFuncs marked elementwise."""
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tvm.tirx.PrimFunc) \
                    and int(func.attrs.get("op_pattern", -1) if func.attrs else -1) == OPAQUE \
                    and _is_table_lookup(func):
                mod[gv] = func.with_attr("op_pattern", ELEMWISE)
        return mod
