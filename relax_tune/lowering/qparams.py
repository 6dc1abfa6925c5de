"""Quantisation parameters read from a Relax module's constants: what a ``dequantize`` or
``quantize`` call means as numbers, and the requantisation a fused integer kernel ends with.

ONNX's QuantizeLinear is ``saturate(round_half_to_even(x / scale) + zero_point)`` and
DequantizeLinear ``(q - zero_point) * scale`` (TVM's importer reads both as
``relax.quantize`` / ``relax.dequantize``). A scale or zero point is a scalar (per tensor)
or a vector along ``axis`` (per channel)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from .rewrite import constant

INT8_TYPES = ("uint8", "int8")
"""The element types an integer kernel reads; anything else stays float."""


@dataclass(frozen=True)
class QParams:
    """The scale and zero point of one quantize/dequantize call.

    Attributes
    ----------
    scale: float32 array, shape ``()`` (per tensor) or ``(C,)`` (per channel along ``axis``).
    zero_point: int64 array of the same shape.
    axis: the channel axis of a per-channel call (ignored for a per-tensor one).
    dtype: the quantized element type (``uint8``, ``int8``, ``int32``).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    dtype: str

    @property
    def per_tensor(self) -> bool:
        """Whether one scale and zero point serve the whole tensor."""
        return self.scale.size == 1 and self.zero_point.size == 1

    def channel_vector(self, channels: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, zero_point)`` as vectors of ``channels`` entries (a per-tensor value
        repeated); ValueError when a per-channel vector has another length."""
        scale, zero = self.scale.reshape(-1), self.zero_point.reshape(-1)
        if scale.size == 1:
            scale = np.repeat(scale, channels)
        if zero.size == 1:
            zero = np.repeat(zero, channels)
        if scale.size != channels or zero.size != channels:
            raise ValueError(f"{what}: {scale.size} scales for {channels} channels")
        return scale.astype(np.float32), zero.astype(np.int64)


def qparams_of(call: relax.Call) -> QParams | None:
    """The parameters of a ``relax.quantize`` / ``relax.dequantize`` call whose scale and
    zero point are bound constants (None otherwise, or when they are not scalars or
    vectors)."""
    scale, zero = constant(call.args[1]), constant(call.args[2])
    if scale is None or zero is None or scale.ndim > 1 or zero.ndim > 1:
        return None
    if call.op.name == "relax.dequantize":
        dtype = str(call.args[0].ty.dtype)
    else:
        dtype = str(call.attrs.out_dtype)
    return QParams(np.asarray(scale, np.float32), np.asarray(zero).astype(np.int64),
                   int(call.attrs.axis), dtype)


def dtype_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of an integer element type."""
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def output_multiplier(x_scale: np.ndarray, w_scale: np.ndarray,
                      y_scale: np.ndarray) -> np.ndarray:
    """``x_scale * w_scale / y_scale`` per output channel, in float32 and in that order, as
    ONNX Runtime computes its requantisation scale (so the same products round alike)."""
    return ((np.float32(x_scale) * w_scale.astype(np.float32)).astype(np.float32)
            / np.float32(y_scale)).astype(np.float32)


def activation_bounds(lo: float | None, hi: float | None, y: QParams) -> tuple[int, int]:
    """The integer range an output takes after a float clip to ``[lo, hi]`` (None: no
    bound) then quantisation by ``y``: ``round(clip(v)/s) + z`` equals
    ``clip(round(v/s) + z, round(lo/s) + z, round(hi/s) + z)`` because rounding is monotonic,
    so a ReLU or ReLU6 becomes the epilogue's saturation bounds."""
    qmin, qmax = dtype_range(y.dtype)
    scale, zero = np.float32(y.scale.reshape(-1)[0]), int(y.zero_point.reshape(-1)[0])
    if lo is not None:
        qmin = max(qmin, int(np.round(np.float32(lo) / scale)) + zero)
    if hi is not None:
        qmax = min(qmax, int(np.round(np.float32(hi) / scale)) + zero)
    return qmin, qmax
