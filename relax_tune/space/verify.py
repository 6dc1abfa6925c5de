"""Validity checks on sampled candidates: were the decisions honoured, and will the
scheduled function build and run correctly on the target?"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm import tirx
from tvm.s_tir import Schedule, Trace

from .params import ANN_PARALLEL, ANN_UNROLL, ANN_VECTORIZE, TargetParams, dtype_bytes, \
    target_params

logger = logging.getLogger("relax_tune.space")

SAMPLING_KINDS = ("SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical",
                  "SampleComputeLocation")
"""Instruction kinds whose outputs are random decisions."""

_VECTOR_LIMIT_REGISTERS = 8
"""A vectorised loop may cover at most this many SIMD registers of its widest element."""


# ------------------------------------------------------------------------------------------
# Decisions


def _plain(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    if isinstance(value, tirx.FloatImm):
        return float(value.value)
    try:
        return [_plain(v) for v in value]
    except TypeError:
        try:
            return int(value)
        except Exception:
            return str(value)


def sampling_instructions(trace: Trace) -> list:
    """The sampling instructions of ``trace`` before its postprocessing, in order."""
    out = []
    for inst in trace.insts:
        name = inst.kind.name
        if name == "EnterPostproc":
            break
        if name in SAMPLING_KINDS:
            out.append(inst)
    return out


def check_decision(inst: Any, decision: Any) -> str | None:
    """Static sanity of one decision for its sampling instruction (shape, range, limits
    that TVM does not enforce on replay, such as ``max_innermost_factor``)."""
    name = inst.kind.name
    value = _plain(decision)
    if value is None:
        return None
    if name in ("SamplePerfectTile", "SamplePartitionedTile"):
        n = len(inst.outputs)
        if not isinstance(value, list) or len(value) != n:
            return f"{name}: decision {value} does not have {n} factors"
        if any(not isinstance(v, int) or v < 1 for v in value):
            if value[0] == -1 and all(v == 1 for v in value[1:]):
                return f"{name}: the loop has a symbolic extent"
            return f"{name}: decision {value} has a factor below 1"
        if name == "SamplePerfectTile":
            attrs = [_plain(a) for a in inst.attrs]
            max_inner = attrs[1] if len(attrs) > 1 else -1
            if isinstance(max_inner, int) and max_inner > 0 and value[-1] > max_inner:
                return (f"{name}: innermost factor {value[-1]} exceeds "
                        f"max_innermost_factor {max_inner}")
        return None
    if name == "SampleCategorical":
        attrs = list(inst.attrs)
        n = len(attrs[0]) if attrs else 0
        if not isinstance(value, int) or not 0 <= value < n:
            return f"{name}: decision {value} is not an index into {n} candidates"
        return None
    if name == "SampleComputeLocation":
        if not isinstance(value, int) or value < -2:
            return f"{name}: decision {value} is not a location"
        return None
    return None


def validate_decisions(requested: Trace, replayed: Trace) -> str | None:
    """None when every decision that ``requested`` carries was honoured by the replay that
    produced ``replayed`` (TVM silently replaces a tile whose product is not the loop extent
    by ``[1, ..., 1, extent]`` and clamps compute locations), else the reason."""
    want = sampling_instructions(requested)
    got = sampling_instructions(replayed)
    if len(want) != len(got):
        return (f"the replay has {len(got)} sampling instructions, the trace "
                f"{len(want)}")
    for i, (w, g) in enumerate(zip(want, got)):
        if w.kind.name != g.kind.name:
            return f"sampling instruction {i} is {g.kind.name}, expected {w.kind.name}"
        g_dec = _plain(replayed.get_decision(g))
        w_dec = _plain(requested.get_decision(w))
        if w_dec is not None and w_dec != g_dec:
            return (f"sampling instruction {i} ({w.kind.name}): decision {w_dec} was "
                    f"replaced by {g_dec} on replay (invalid for this loop)")
        reason = check_decision(g, g_dec)
        if reason is not None:
            return f"sampling instruction {i}: {reason}"
    return None


# ------------------------------------------------------------------------------------------
# Schedules


def check_schedule(sch: Schedule, target: tvm.target.Target,
                   params: TargetParams | None = None) -> str | None:
    """None when the scheduled candidate looks valid to build and run on ``target``, else
    the reason. Checks, on the scheduled function:

    - sketch annotations left on the root block (postprocessing did not run);
    - thread bindings on a CPU target;
    - vectorised loops with a symbolic extent, or wider than
      ``_VECTOR_LIMIT_REGISTERS`` SIMD registers of their widest element;
    - a parallel loop nested in another parallel or in a vectorised loop;
    - a parallel loop over a reduction (its iterations would race on the output).
    """
    params = params or target_params(target)
    try:
        func = sch.mod["main"]
    except Exception:
        funcs = list(sch.mod.functions.values())
        if len(funcs) != 1:
            return "the schedule does not hold exactly one function"
        func = funcs[0]
    if not isinstance(func, tirx.PrimFunc):
        return "not a TIR function"
    checker = _Checker(params, is_gpu=params.kind in ("cuda", "rocm", "vulkan", "metal",
                                                      "opencl", "webgpu"))
    try:
        checker.visit(func.body, parallel=False, vector=False)
    except Exception as err:  # an IR shape the checker does not understand: say so
        return f"cannot check the schedule: {err}"
    return checker.error


class _Checker:
    """Walks a scheduled function body and records the first problem found."""

    def __init__(self, params: TargetParams, is_gpu: bool) -> None:
        self.params = params
        self.is_gpu = is_gpu
        self.error: str | None = None
        self.parallel_vars: list[Any] = []

    def fail(self, msg: str) -> None:
        if self.error is None:
            self.error = msg

    def visit(self, stmt: Any, parallel: bool, vector: bool) -> None:
        if stmt is None or self.error is not None:
            return
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.visit(s, parallel, vector)
            return
        if isinstance(stmt, tvm.s_tir.SBlockRealize):
            self._visit_block(stmt, parallel, vector)
            return
        if isinstance(stmt, tirx.For):
            self._visit_for(stmt, parallel, vector)
            return
        for attr in ("body", "then_case", "else_case"):
            child = getattr(stmt, attr, None)
            if child is not None and isinstance(child, tirx.Stmt):
                self.visit(child, parallel, vector)

    def _visit_block(self, realize: Any, parallel: bool, vector: bool) -> None:
        blk = realize.block
        for key in (ANN_PARALLEL, ANN_VECTORIZE, ANN_UNROLL):
            if key in blk.annotations:
                self.fail(f"block {blk.name_hint} still carries {key}: "
                          "postprocessing did not run")
                return
        if self.parallel_vars:
            for iv, value in zip(blk.iter_vars, realize.iter_values):
                if int(iv.iter_type) == int(tirx.IterVar.DataPar):
                    continue
                used = tirx.analysis.undefined_vars(value)
                for var in self.parallel_vars:
                    if any(var.same_as(u) for u in used):
                        self.fail(f"parallel loop {var} runs the reduction of block "
                                  f"{blk.name_hint}: its iterations would race")
                        return
        self.visit(blk.init, parallel, vector)
        self.visit(blk.body, parallel, vector)

    def _visit_for(self, loop: Any, parallel: bool, vector: bool) -> None:
        kind = int(loop.kind)
        extent = int(loop.extent.value) if isinstance(loop.extent, tirx.IntImm) else None
        name = str(loop.loop_var)
        if kind == 4 and not self.is_gpu:  # thread binding
            self.fail(f"loop {name} is bound to a thread on a CPU target")
            return
        if kind == 1:  # parallel
            if parallel:
                self.fail(f"parallel loop {name} is nested in another parallel loop")
                return
            if vector:
                self.fail(f"parallel loop {name} is inside a vectorised loop")
                return
            self.parallel_vars.append(loop.loop_var)
            self.visit(loop.body, True, vector)
            self.parallel_vars.pop()
            return
        if kind == 2:  # vectorized
            if extent is None:
                self.fail(f"vectorised loop {name} has a symbolic extent")
                return
            width = widest_element(loop.body)
            limit = max(1, _VECTOR_LIMIT_REGISTERS * self.params.vector_bytes // width)
            if extent > limit:
                self.fail(f"vectorised loop {name} has {extent} lanes of {width}-byte "
                          f"elements, past {limit} ({_VECTOR_LIMIT_REGISTERS} registers of "
                          f"{self.params.vector_bytes} bytes)")
                return
            self.visit(loop.body, parallel, True)
            return
        self.visit(loop.body, parallel, vector)


def widest_element(stmt: Any) -> int:
    """Bytes of the widest element ``stmt``'s stores write (4 where it cannot be read)."""
    widths = [1]

    def on_store(node: Any) -> None:
        buf = getattr(node, "buffer", None)
        dtype = getattr(buf, "dtype", None)
        if dtype is not None:
            widths.append(dtype_bytes(str(dtype)))

    try:
        import tvm_ffi

        tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, on_store)])
    except Exception:
        return 4
    return max(widths)
