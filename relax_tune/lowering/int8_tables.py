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
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .qparams import INT8_TYPES, dtype_range, qparams_of
from .rewrite import rewrite_functions


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


def quantized_table(function, x_scale: float, x_zero: int, x_dtype: str, y_scale: float,
                    y_zero: int, y_dtype: str) -> np.ndarray:
    """``quantize(function(dequantize(v)))`` for every ``v`` of ``x_dtype`` in increasing
    order (0..255 for u8, -128..127 for s8), as int32."""
    low, high = dtype_range(x_dtype)
    values = np.arange(low, high + 1, dtype=np.int64)
    x = (values - x_zero).astype(np.float32) * np.float32(x_scale)
    y = np.array([function(float(v)) for v in x], dtype=np.float64).astype(np.float32)
    out = np.rint(y / np.float32(y_scale)).astype(np.float64) + y_zero
    return np.clip(out, *dtype_range(y_dtype)).astype(np.int32)


def _rewrite(matched: relax.Call, matches: dict, parts: dict) -> relax.Expr:
    q = matches[parts["q"]]
    x, y = qparams_of(matches[parts["dq"]]), qparams_of(matched)
    if x is None or y is None or not x.per_tensor or not y.per_tensor \
            or x.dtype not in INT8_TYPES or y.dtype not in INT8_TYPES \
            or str(q.ty.dtype) != x.dtype:
        return matched
    call = matches[parts["f"]]
    table = quantized_table(FUNCTIONS[call.op.name], float(x.scale), int(x.zero_point),
                            x.dtype, float(y.scale), int(y.zero_point), y.dtype)
    index = relax.op.astype(q, "int32")
    if x.dtype == "int8":
        index = relax.op.add(index, relax.const(128, "int32"))
    return relax.op.astype(relax.op.take(relax.const(table), index, axis=0), y.dtype)


def quantized_functions_as_tables(mod):
    """``mod`` with each ``quantize(f(dequantize(q)))`` of ``FUNCTIONS`` looked up in a
    table (see the module docstring)."""
    pattern, parts = _pattern()
    return rewrite_functions(mod, pattern, lambda e, m: _rewrite(e, m, parts))
