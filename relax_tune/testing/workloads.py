"""Workloads shared by the measurement tests and the benchmarks (kernels built in code)."""

from __future__ import annotations

import json

import tvm
from tvm import te, tirx, topi
from tvm.s_tir import Schedule

from relax_tune import utils


def matmul_mod(n: int = 64) -> tvm.IRModule:
    """C = A @ B for n x n float32 matrices, normalised as a workload."""
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return utils.normalize_mod(te.create_prim_func([A, B, C]))


def symbolic_matmul() -> tirx.PrimFunc:
    """C = A @ B with A of n x 64 (``n`` symbolic) and B of 64 x 48, float32."""
    n = tirx.Var("n", "int64")
    a = te.placeholder((n, 64), "float32", name="A")
    b = te.placeholder((64, 48), "float32", name="B")
    return te.create_prim_func([a, b, topi.matmul(a, b)])


def tiled_matmul_trace(mod: tvm.IRModule, k_inside_rows: bool = True) -> list:
    """A hand schedule of ``matmul_mod`` as plain JSON: rows split by 8, columns by 16
    (vectorised), outer rows parallel; the reduction loop under the row tile
    (``k_inside_rows``) or above it."""
    sch = Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [None, 8])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(*((i0, j0, i1, k, j1) if k_inside_rows else (i0, j0, k, i1, j1)))
    sch.parallel(i0)
    sch.vectorize(j1)
    return json.loads(json.dumps(utils.trace_to_json(sch.trace)))
