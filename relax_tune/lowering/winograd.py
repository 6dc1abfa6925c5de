"""Winograd F(m x m, 3 x 3) for channels-last 3x3 stride-1 convolutions with bound weights.

A 3x3 convolution computes each output tile of m x m pixels from an (m+2) x (m+2) input
tile. Winograd's minimal filtering does it with (m+2)^2 multiplications per channel pair
instead of 9 m^2 (F(4x4, 3x3): 36 against 144, a 4x cut of the GEMM's work):

    Y = A^T [ (G g G^T) * (B^T d B) ] A     (per input tile d, filter g; * elementwise)

Here every step but the input transform is a Relax operation the tuner schedules well:

- ``U = G g G^T`` of every filter is computed once, here, from the bound weight:
  a constant of shape ((m+2)^2, C, K);
- ``V = B^T d B`` of every input tile, ((m+2)^2, P, C) for P tiles, is one scheduled
  kernel that reads the tiles from the input itself, zero past its edges
  (``winograd_kernels``; the pad kernels before it took 0.56 ms of ResNet-18 in place, 4%
  of the model, Zen 4, 2 threads: a 56x56 one 12 us alone, 140 us in place): B^T's zeros left
  out, 264 operations per tile and channel against the 1,296 of a matmul with the Kronecker
  product of B^T with itself, which is what it was until session 24 (a gather of the tiles,
  ``take``, then that matmul; still the way for channel counts no vector width divides);
- the tile products summed over input channels are one batched matmul,
  ((m+2)^2, P, C) x ((m+2)^2, C, K);
- ``A^T M A`` is one matmul with the Kronecker product of A^T with itself, and the tiles
  are put back into NHWC by a transpose and reshape, which fuse with the bias and
  activation that follow.

It acts on ``conv2d`` in NHWC / OHWI (``ChannelsLastConvolutions`` puts them there), 3x3,
stride 1, dilation 1, groups 1, padding 1 (so output size = input size), float32, with a
bound weight, where the output is at least ``MIN_SIZE`` pixels on each side and both channel
counts are at least ``MIN_CHANNELS``. Maps of fewer than ``SMALL_TILE_BELOW`` pixels a side
take F(2x2, 3x3) instead of F(4x4, 3x3): on a small feature map the transformed weights,
(m+2)^2 / 9 of the original (4x for m = 4, 1.8x for m = 2), are read for few tiles, and the
layer is bound by memory, not arithmetic. F(2x2) does 16 multiplications per tile and
channel pair where the direct convolution does 36 (ResNet-18's 7x7x512 layers, session 24).

Measured layer by layer and on ResNet-18: docs/design/winograd.md.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .rewrite import constant, rewrite_functions
from .winograd_kernels import input_transform_func

logger = logging.getLogger(__name__)

TILE = 4
"""Output tile size m of F(m x m, 3 x 3)."""

SMALL_TILE = 2
"""Output tile size on the small maps (``SMALL_TILE_BELOW``)."""

SMALL_TILE_BELOW = 14
"""Maps with a side of fewer pixels than this take ``SMALL_TILE``."""

MIN_SIZE = 7
"""Smallest output side (pixels) converted."""

MIN_CHANNELS = 32
"""Fewest input and output channels converted: the transforms cost about 36 / K (input)
and 16 / C (output) of the batched GEMM's multiplications."""


@functools.lru_cache(maxsize=None)
def transform_matrices(m: int = TILE, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, G)`` of F(m, r) in float64 (Cook-Toom, the interpolation points TVM uses):
    ``A`` is (m+r-1, m), ``B`` (m+r-1, m+r-1), ``G`` (m+r-1, r); computed once per (m, r),
    read-only."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    alpha = m + r - 1
    mats = _cook_toom_convolution(_interpolation_points(alpha), m, r)
    out = tuple(np.array(x, dtype=np.float64) for x in mats)
    for x in out:
        x.setflags(write=False)
    return out


def transformed_weight(w_ohwi: np.ndarray, m: int = TILE) -> np.ndarray:
    """``G g G^T`` of each filter of an OHWI 3x3 weight, as ((m+2)^2, C, K)."""
    _, _, g = transform_matrices(m)
    alpha = m + 2
    u = np.einsum("ax,kxyc,by->abck", g, w_ohwi.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(alpha * alpha, *u.shape[2:]).astype(w_ohwi.dtype))


def _tile_indices(n: int, h: int, w: int, m: int) -> tuple[np.ndarray, int, int]:
    """Row indices into the padded input flattened to (n * hp * wp, C), ordered
    ((r1, r2), (n, tile_h, tile_w)), and the tile grid (th, tw)."""
    alpha = m + 2
    th, tw = math.ceil(h / m), math.ceil(w / m)
    hp, wp = th * m + 2, tw * m + 2
    r1, r2, b, ti, tj = np.meshgrid(np.arange(alpha), np.arange(alpha), np.arange(n),
                                    np.arange(th), np.arange(tw), indexing="ij")
    rows = (b * hp + ti * m + r1) * wp + tj * m + r2
    return rows.reshape(-1).astype(np.int32), th, tw


def _eligible(call: relax.Call, min_size: int, min_channels: int) -> bool:
    """Whether ``call`` (a conv2d) is one this pass converts, judged from its attributes and
    types alone (the weight is read only for the convolutions that are)."""
    attrs = call.attrs
    shape = getattr(call.args[0].ty, "shape", None)
    w_shape = getattr(call.args[1].ty, "shape", None)
    if shape is None or w_shape is None or str(call.args[1].ty.dtype) != "float32":
        return False
    try:
        (_, h, wd, c), (k, kh, kw, ci) = (int(d) for d in shape), (int(d) for d in w_shape)
    except (TypeError, ValueError):
        return False  # symbolic sizes
    return (str(attrs.data_layout) == "NHWC" and str(attrs.kernel_layout) == "OHWI"
            and str(attrs.out_layout) == "NHWC" and int(attrs.groups) == 1
            and (kh, kw, ci) == (3, 3, c) and [int(v) for v in attrs.strides] == [1, 1]
            and [int(v) for v in attrs.dilation] == [1, 1]
            and [int(v) for v in attrs.padding] == [1, 1, 1, 1]
            and str(attrs.out_dtype) in ("", "None", "void", "float32") and min(h, wd) >= min_size
            and min(c, k) >= min_channels)


def _vector_lanes(c: int, lanes: int) -> int:
    """The widest of ``lanes`` (one register of floats) and its halves down to 2 that
    divides ``c``; 0 when none does."""
    while lanes >= 2 and c % lanes:
        lanes //= 2
    return lanes if lanes >= 2 else 0


def winograd_conv2d(x: relax.Expr, w_ohwi: np.ndarray, m: int = TILE,
                    builder: relax.BlockBuilder | None = None, lanes: int = 8) -> relax.Expr:
    """Relax expression of ``conv2d(x, w, padding 1)`` (NHWC / OHWI, 3x3, stride 1) by
    Winograd F(m x m, 3 x 3); ``x`` must have a static shape. With ``builder`` (the module's)
    the input transform is ``winograd_kernels``' kernel on vectors of ``lanes`` floats (or
    the widest half of it that divides the channels), added to it."""
    n, h, wd, c = (int(d) for d in x.ty.shape)
    k = w_ohwi.shape[0]
    alpha = m + 2
    a_mat, b_mat, _ = transform_matrices(m)
    th, tw = math.ceil(h / m), math.ceil(wd / m)
    p = n * th * tw
    f32 = "float32"
    lanes = _vector_lanes(c, lanes)
    if builder is not None and lanes:
        func = input_transform_func((n, h, wd, c), (th, tw), m, lanes,
                                    np.ascontiguousarray(b_mat.T, np.float64).tobytes())
        v = relax.call_tir(builder.add_func(func, "winograd_input_transform"), [x],
                           relax.TensorType([alpha * alpha, p, c], f32))
    else:
        hp, wp = th * m + 2, tw * m + 2
        padded = relax.op.nn.pad(x, [0, 0, 1, hp - h - 1, 1, wp - wd - 1, 0, 0])
        rows, _, _ = _tile_indices(n, h, wd, m)
        # "clip": the indices are in bounds; TVM's "fast" mode would log a warning per kernel
        tiles = relax.op.take(relax.op.reshape(padded, [n * hp * wp, c]), relax.const(rows),
                              axis=0, mode="clip")  # (alpha^2 * P, C)
        v = relax.op.matmul(relax.const(np.kron(b_mat.T, b_mat.T).astype(f32)),
                            relax.op.reshape(tiles, [alpha * alpha, p * c]))
        v = relax.op.reshape(v, [alpha * alpha, p, c])
    prod = relax.op.matmul(v, relax.const(transformed_weight(w_ohwi, m)))  # (alpha^2, P, K)
    y = relax.op.matmul(relax.const(np.kron(a_mat.T, a_mat.T).astype(f32)),
                        relax.op.reshape(prod, [alpha * alpha, p * k]))  # (m^2, P * K)
    y = relax.op.permute_dims(relax.op.reshape(y, [m, m, n, th, tw, k]), [2, 3, 0, 4, 1, 5])
    y = relax.op.reshape(y, [n, th * m, tw * m, k])
    if th * m != h or tw * m != wd:
        y = relax.op.strided_slice(y, axes=[1, 2], begin=[0, 0], end=[h, wd])
    return y


@tvm.transform.module_pass(opt_level=0, name="relax_tune.WinogradConvolutions")
class WinogradConvolutions:
    """Rewrite eligible 3x3 stride-1 convolutions (see the module docstring) into Winograd
    F(m x m, 3 x 3) made of the input transform's kernel, two matmuls and a transpose; others
    are left. ``lanes``: floats in one of the target's SIMD registers."""

    def __init__(self, tile: int = TILE, min_size: int | None = None,
                 min_channels: int | None = None, lanes: int = 8,
                 small_tile_below: int | None = None):
        self.tile = tile
        self.min_size = MIN_SIZE if min_size is None else min_size
        self.min_channels = MIN_CHANNELS if min_channels is None else min_channels
        self.lanes = lanes
        self.small_tile_below = (SMALL_TILE_BELOW if small_tile_below is None
                                 else small_tile_below)

    def tile_for(self, h: int, w: int) -> int:
        """The output tile size for an ``h`` x ``w`` map."""
        return SMALL_TILE if min(h, w) < self.small_tile_below else self.tile

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """``mod`` with its eligible convolutions computed by Winograd's algorithm."""
        x, w = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, w)
        converted = []
        builder = relax.BlockBuilder(mod)

        def rewrite(matched: relax.Expr, matches: dict) -> relax.Expr:
            if not _eligible(matched, self.min_size, self.min_channels):
                return matched
            weight = constant(matches[w])
            if weight is None:
                return matched  # not bound: nothing to transform at compile time
            shape = tuple(int(d) for d in matched.ty.shape)
            m = self.tile_for(shape[1], shape[2])
            converted.append((m, shape))
            return winograd_conv2d(matches[x], weight, m, builder, self.lanes)

        out = rewrite_functions(mod, pattern, rewrite, builder)
        if not converted:
            return mod
        logger.info("%d 3x3 convolutions computed by Winograd F(m, 3): (m, output shape) %s",
                    len(converted), sorted(set(converted)))
        return out
