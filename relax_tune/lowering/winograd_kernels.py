"""Winograd's input transform as one scheduled kernel: gather and ``B^T d B`` per tile.

``winograd.winograd_conv2d`` computes the input tiles' transform ``V = B^T d B``. Done as
Relax operations it was a gather of every (m+2) x (m+2) tile (``take``) and one dense matmul
with the 36 x 36 Kronecker product of ``B^T`` with itself: 1,296 multiply-adds per tile and
channel, of which 484 multiply by a non-zero, and two passes over a tensor 2.25x the
input's size. Applied as two 6 x 6 products with the zeros left out, the transform is 264
operations, most of them additions (the coefficients are small integers), and the tiles are
read straight from the input, a zero vector where a tile reaches past its edge (the padding
no longer a pass of its own over memory).

``input_transform_func`` writes that kernel for one shape: parallel over tiles, a loop over
channel groups of one SIMD register each, and in its body the 36 vector loads of the tile,
``B^T d`` and ``(B^T d) B`` as vector expressions (explicit ``Ramp`` vectors, built with
TVM's IR builder: parsing the same function as TVMScript took 2.8 s), and the 36 stores.
It is marked ``tirx.is_scheduled`` and opaque, so neither the search nor ``FuseOps`` touch
it.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .rewrite import OPAQUE


def _combination(coefs, values: list, lanes: int):
    """``sum(c * value)`` over the non-zero coefficients, as vector expressions of ``lanes``
    floats (a coefficient of +-1 is an addition or subtraction)."""
    out = None
    for c, value in zip(coefs, values):
        c = float(c)
        if c == 0.0:
            continue
        term = value if abs(c) == 1.0 else value * T.Broadcast(T.float32(abs(c)), lanes)
        if out is None:
            out = term if c > 0 else T.Broadcast(T.float32(0.0), lanes) - term
        else:
            out = out + term if c > 0 else out - term
    return T.Broadcast(T.float32(0.0), lanes) if out is None else out


@functools.lru_cache(maxsize=None)
def input_transform_func(shape: tuple[int, int, int, int], tiles: tuple[int, int],
                         m: int, lanes: int, bt: bytes) -> tvm.tirx.PrimFunc:
    """The kernel of ``V[a * (m+2) + b, p, c] = sum_ij bt[a, i] bt[b, j] xp[n, ti*m + i,
    tj*m + j, c]`` for the NHWC input ``x`` of ``shape`` and the tile grid ``tiles`` (``p``
    runs over (n, ti, tj)), where ``xp`` is ``x`` padded with zeros, one pixel before and
    up to the tile grid after: the kernel reads ``x`` itself, zero where a tile reaches
    past it. ``bt``: the (m+2) x (m+2) float64 ``B^T`` as bytes (hashable). ``c`` must be
    a multiple of ``lanes``."""
    n, h, w, c = shape
    th, tw = tiles
    alpha = m + 2
    b_t = np.frombuffer(bt, dtype=np.float64).reshape(alpha, alpha)
    p_count = n * th * tw
    with IRBuilder() as builder:
        with T.prim_func(s_tir=True):
            T.func_name("winograd_input_transform")
            x = T.arg("x", T.Buffer((n, h, w, c), "float32"))
            v = T.arg("v", T.Buffer((alpha * alpha, p_count, c), "float32"))
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True,
                         "op_pattern": OPAQUE})
            with T.sblock("root"):
                with T.parallel(0, p_count) as p:
                    with T.serial(0, c // lanes) as co:
                        with T.sblock("winograd_input_transform"):
                            vec = T.Ramp(co * lanes, 1, lanes)
                            row0, col0 = p % (th * tw) // tw * m - 1, p % tw * m - 1
                            zero = T.Broadcast(T.float32(0.0), lanes)

                            def pixel(i, j):
                                row, col = row0 + i, col0 + j
                                return T.if_then_else(
                                    tvm.tirx.all(0 <= row, row < h, 0 <= col, col < w),
                                    x[p // (th * tw), row, col, vec], zero)

                            d = [[pixel(i, j) for j in range(alpha)] for i in range(alpha)]
                            # t = B^T d, then V = t B, written out whole: no let-bound
                            # vectors (each became a workspace allocation), LLVM merges the
                            # repeated loads and sums
                            t = [[_combination(b_t[a], [d[i][j] for i in range(alpha)], lanes)
                                  for j in range(alpha)] for a in range(alpha)]
                            for a in range(alpha):
                                for b in range(alpha):
                                    T.buffer_store(v, _combination(b_t[b], t[a], lanes),
                                                   [a * alpha + b, p, vec])
    return builder.get().without_attr("global_symbol")  # the module names it
