"""Block and loop analysis on a ``tvm.s_tir.Schedule``: what the rules ask before they act.

Everything here reads the schedule and never changes it. It is built on the block fields
(iter vars, read/write regions, init), ``tvm.sym`` (linear-equation detection) and the
``s_tir.schedule.*`` analysis helpers that TVM registers as FFI functions.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

logger = logging.getLogger("relax_tune.space")

_ffi = tvm_ffi.get_global_func
_IS_REDUCTION_BLOCK = _ffi("s_tir.schedule.IsReductionBlock")
_GET_LOOP_ITER_TYPE = _ffi("s_tir.schedule.GetLoopIterType")
_IS_TRIVIAL_BINDING = _ffi("s_tir.schedule.IsTrivialBinding")
stmt_has_if_then_else = _ffi("s_tir.schedule.HasIfThenElse")  # (a block, a statement)
_GET_SBLOCK_REALIZE = _ffi("s_tir.schedule.GetSBlockRealize")
_IS_SPATIAL_PRIM_FUNC = _ffi("s_tir.schedule.IsSpatialPrimFunc")


def _unchecked(method: Any) -> Any:
    """The plain method under TVM's ``type_checked`` wrapper. The wrapper checks every
    argument against its type hints in Python on every call; in the search's hot loop
    (thousands of reads per candidate) that cost a third of the search time, for arguments
    that are schedule random variables by construction."""
    return getattr(method, "__wrapped__", method)


_SCHEDULE_GET = _unchecked(Schedule.get)
_SCHEDULE_GET_SREF = _unchecked(Schedule.get_sref)
_SCHEDULE_GET_LOOPS = _unchecked(Schedule.get_loops)
_SCHEDULE_GET_CHILD_BLOCKS = _unchecked(Schedule.get_child_blocks)
_SCHEDULE_GET_CONSUMERS = _unchecked(Schedule.get_consumers)


def node(sch: Schedule, rv: Any) -> Any:
    """``sch.get(rv)`` (the block or loop statement) without the type-check overhead."""
    return _SCHEDULE_GET(sch, rv)


def loops_of(sch: Schedule, block: SBlockRV) -> list[LoopRV]:
    """``sch.get_loops(block)`` without the type-check overhead."""
    return list(_SCHEDULE_GET_LOOPS(sch, block))


def child_blocks(sch: Schedule, rv: Any) -> list[SBlockRV]:
    """``sch.get_child_blocks(rv)`` without the type-check overhead."""
    return list(_SCHEDULE_GET_CHILD_BLOCKS(sch, rv))


def consumers_of(sch: Schedule, block: SBlockRV) -> list[SBlockRV]:
    """``sch.get_consumers(block)`` without the type-check overhead."""
    return list(_SCHEDULE_GET_CONSUMERS(sch, block))

DATA_PAR = int(tirx.IterVar.DataPar)
COMM_REDUCE = int(tirx.IterVar.CommReduce)

FOR_SERIAL = 0
FOR_PARALLEL = 1
FOR_VECTORIZED = 2
FOR_UNROLLED = 3
FOR_THREAD_BINDING = 4


# ------------------------------------------------------------------------------------------
# Blocks


def func_name_of(sch: Schedule) -> str:
    """The name of the function the schedule works on ("main", or the module's only one)."""
    names = [gv.name_hint for gv, f in sch.mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    if "main" in names or not names:
        return "main"
    return str(names[0])


def collect_blocks(sch: Schedule, func_name: str | None = None) -> list[SBlockRV]:
    """Every block of the function in pre-order (the root first, then program order)."""
    func_name = func_name or func_name_of(sch)
    func = sch.mod[func_name]
    names: list[str] = []

    def visit(stmt: Any) -> None:
        if isinstance(stmt, tvm.s_tir.SBlockRealize):
            names.append(str(stmt.block.name_hint))
            visit(stmt.block.init)
            visit(stmt.block.body)
            return
        if isinstance(stmt, tvm.s_tir.SBlock):
            names.append(str(stmt.name_hint))
            visit(stmt.init)
            visit(stmt.body)
            return
        for child in _children(stmt):
            visit(child)

    visit(func.body)
    seen: set[str] = set()
    blocks = []
    for name in names:
        if name in seen:  # a name used twice cannot be looked up uniquely: skip it
            continue
        seen.add(name)
        try:
            blocks.append(sch.get_sblock(name, func_name))
        except Exception:  # pragma: no cover - duplicate names raise in get_sblock
            logger.debug("cannot look up block %r", name)
    return blocks


def _children(stmt: Any) -> list:
    """The statements directly under ``stmt`` (loops, sequences, branches, allocations)."""
    if stmt is None:
        return []
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    out = []
    for attr in ("body", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if child is not None and isinstance(child, tirx.Stmt):
            out.append(child)
    return out


def block_exists(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` still names a block of the schedule (inlining removes blocks)."""
    try:
        node(sch, block)
        return True
    except Exception:
        return False


def is_root(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` is the root block of its function."""
    try:
        return _SCHEDULE_GET_SREF(sch, block).parent is None
    except Exception:
        return False


def get_root(sch: Schedule, block: SBlockRV) -> SBlockRV:
    """The root block of the function holding ``block`` (a fresh ``GetSBlock`` in the trace)."""
    sref = _SCHEDULE_GET_SREF(sch, block)
    while sref.parent is not None:
        sref = sref.parent
    return sch.get_sblock(str(sref.stmt.name_hint), func_name_of(sch))


def iter_types(sch: Schedule, block: SBlockRV) -> list[int]:
    """The iter-var types of ``block`` (``DATA_PAR``, ``COMM_REDUCE`` or other ints)."""
    return [int(iv.iter_type) for iv in node(sch, block).iter_vars]


def is_spatial(sch: Schedule, block: SBlockRV) -> bool:
    """Whether every iter var of ``block`` is data-parallel."""
    return all(t == DATA_PAR for t in iter_types(sch, block))


def is_reduction_block(sch: Schedule, block: SBlockRV) -> bool:
    """TVM's notion of a reduction block (complete reduction with an init) in its scope."""
    try:
        scope = get_root(sch, block)
        return bool(_IS_REDUCTION_BLOCK(sch, block, scope))
    except Exception:
        return False


def is_trivial_binding(sch: Schedule, block: SBlockRV) -> bool:
    """Whether each block iter is bound to exactly one loop variable, in order."""
    try:
        return bool(_IS_TRIVIAL_BINDING(sch, block))
    except Exception:
        return False


def has_if_then_else(sch: Schedule, block: SBlockRV) -> bool:
    """Whether the block body contains an if-then-else or a select (e.g. a pad block)."""
    try:
        realize = _GET_SBLOCK_REALIZE(sch, block)
        if not _is_true(realize.predicate):
            return True
        return bool(stmt_has_if_then_else(node(sch, block)))
    except Exception:
        return True


def _is_true(expr: Any) -> bool:
    try:
        return bool(int(expr.value))
    except Exception:
        return False


def is_spatial_prim_func(sch: Schedule, func_name: str = "main") -> bool:
    """Whether the function holds only spatial blocks (TVM's IsSpatialPrimFunc)."""
    try:
        return bool(_IS_SPATIAL_PRIM_FUNC(sch.mod[func_name]))
    except Exception:
        return False


def called_ops(sch: Schedule, block: SBlockRV) -> set[str]:
    """Names of the operators called in the block body (e.g. ``{"tirx.exp"}``)."""
    names: set[str] = set()

    def on_call(call: Any) -> None:
        op = getattr(call, "op", None)
        name = getattr(op, "name", None)
        if name is not None:
            names.add(str(name))

    blk = node(sch, block)
    tvm_ffi.structural_walk(blk.body, [(tvm.ir.Call, on_call)])
    return names


def write_dtype(sch: Schedule, block: SBlockRV) -> str:
    """The element type of the (first) buffer ``block`` writes ("float32" if it writes none)."""
    blk = node(sch, block)
    if len(blk.writes) == 0:
        return "float32"
    return _buffer_dtype(blk.writes[0].source)


def _buffer_dtype(buf: Any) -> str:
    dtype = getattr(buf, "dtype", None)
    if dtype is None:
        ty = getattr(buf, "ty", None)
        dtype = getattr(ty, "dtype", None)
    return str(dtype) if dtype is not None else "float32"


def _const_int(expr: Any) -> int | None:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    return None


def _buffer_shape(buf: Any) -> list[int | None]:
    shape = getattr(buf, "shape", None) or []
    return [_const_int(d) for d in shape]


# ------------------------------------------------------------------------------------------
# Loops


def loop_extent(sch: Schedule, loop: LoopRV) -> int | None:
    """The constant extent of ``loop`` (None when symbolic)."""
    return _const_int(node(sch, loop).extent)


def loop_iter_type(sch: Schedule, loop: LoopRV) -> str:
    """"S" when only data-parallel block iters use the loop, "R" when a reduction iter does,
    "O" otherwise (TVM's GetLoopIterType)."""
    try:
        return str(_GET_LOOP_ITER_TYPE(sch, loop))
    except Exception:
        return "O"


def loop_kind(sch: Schedule, loop: LoopRV) -> int:
    """The loop kind as an int (``FOR_SERIAL``, ``FOR_PARALLEL``, ``FOR_VECTORIZED``...)."""
    return int(node(sch, loop).kind)


def loop_is_free(sch: Schedule, loop: LoopRV) -> bool:
    """A serial loop without annotations: free to fuse, parallelise or vectorise."""
    stmt = node(sch, loop)
    return int(stmt.kind) == FOR_SERIAL and len(stmt.annotations) == 0


def loop_has_single_child(sch: Schedule, loop: LoopRV) -> bool:
    """Whether the loop body is one statement (so the loop can be fused with its child)."""
    return not isinstance(node(sch, loop).body, tirx.SeqStmt)


@dataclass(frozen=True)
class LoopInfo:
    """What the postprocessors ask about a loop, read once."""

    extent: int | None
    kind: int
    free: bool
    single_child: bool
    iter_type: str


def loop_infos(sch: Schedule, loops: list[LoopRV]) -> list[LoopInfo]:
    """:class:`LoopInfo` of each loop (one ``sch.get`` per loop)."""
    out = []
    for loop in loops:
        stmt = node(sch, loop)
        kind = int(stmt.kind)
        out.append(LoopInfo(extent=_const_int(stmt.extent), kind=kind,
                            free=kind == FOR_SERIAL and len(stmt.annotations) == 0,
                            single_child=not isinstance(stmt.body, tirx.SeqStmt),
                            iter_type=loop_iter_type(sch, loop)))
    return out


# ------------------------------------------------------------------------------------------
# Access patterns


def _linear_coef(expr: Any, var: Any) -> int | None:
    """The constant coefficient of ``var`` in ``expr`` (0 if unused), None when non-linear."""
    if isinstance(expr, tirx.IntImm):
        return 0
    try:
        res = tvm.sym.detect_linear_equation(expr, [var])
    except Exception:
        return None
    if len(res) != 2:
        return None
    return _const_int(res[0])


# loop_strides' block-var coefficients of access indices, by block (kept by loop transforms)
_INDEX_COEFS: dict[int, list] = {}


def loop_strides(sch: Schedule, block: SBlockRV, loops: list[LoopRV]) -> list[list[int | None]] | None:
    """For each buffer access of ``block`` (reads then writes), the stride in elements of the
    flattened index per loop of ``loops`` (0: the loop does not move the access; None: not
    linear). Returns None when a buffer shape is symbolic."""
    realize = _GET_SBLOCK_REALIZE(sch, block)
    blk = realize.block
    bindings = list(zip([iv.var for iv in blk.iter_vars], list(realize.iter_values)))
    loop_vars = [node(sch, lp).loop_var for lp in loops]
    # coefficient of every loop var in every block-var binding
    bind_coef = [[_linear_coef(value, lv) for lv in loop_vars] for _, value in bindings]
    @functools.cache
    def within_iters() -> tvm.sym.Analyzer:
        """An analyzer with the iters' ranges, made where first needed."""
        analyzer = tvm.sym.Analyzer()
        for iv in blk.iter_vars:
            analyzer.bind(iv.var, iv.dom)
        return analyzer

    def index_coef(index: Any, bvar: Any) -> int | None:
        coef = _linear_coef(index, bvar)
        if coef is not None:
            return coef
        # under the iters' ranges a split group axis's ``(g * G + f) // G * G`` is ``g * G``
        # (space.cpu.group_axis)
        return _linear_coef(within_iters().simplify(index), bvar)
    accesses = list(blk.reads) + list(blk.writes)
    key = tvm_ffi.structural_hash(tvm.runtime.convert([blk.iter_vars, blk.reads, blk.writes]),
                                  map_free_vars=True)
    if key not in _INDEX_COEFS:
        if len(_INDEX_COEFS) >= 4096:
            _INDEX_COEFS.clear()
        _INDEX_COEFS[key] = [[[index_coef(rng.min, bvar) for bvar, _ in bindings]
                              for rng in access.region] for access in accesses]
    idx_coefs = _INDEX_COEFS[key]
    out: list[list[int | None]] = []
    for access, idx_coef in zip(accesses, idx_coefs):
        shape = _buffer_shape(access.source)
        if any(d is None for d in shape):
            return None
        buf_strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            buf_strides[d] = buf_strides[d + 1] * int(shape[d + 1])
        if any(c is None for row in idx_coef for c in row):
            out.append([None] * len(loop_vars))
            continue
        per_loop: list[int | None] = []
        for li in range(len(loop_vars)):
            total: int | None = 0
            for d, row in enumerate(idx_coef):
                for bi, c_idx in enumerate(row):
                    if c_idx == 0:
                        continue
                    c_bind = bind_coef[bi][li]
                    if c_bind is None:
                        total = None
                        break
                    total += c_idx * c_bind * buf_strides[d]
                if total is None:
                    break
            per_loop.append(total)
        out.append(per_loop)
    return out


def stepped_strides(sch: Schedule, block: SBlockRV, loop: LoopRV
                    ) -> list[tuple[int | None, int]]:
    """For each buffer access of ``block`` (reads then writes): how far its flattened index
    moves, in elements, when ``loop`` takes its first step with every other loop at its
    start, and the access's element bytes. Evaluated, not derived, so it holds where
    ``loop_strides`` gives up: indices of inlined reshapes and transposes divide and take
    remainders. None where an index is not a constant at those points."""
    realize = _GET_SBLOCK_REALIZE(sch, block)
    blk = realize.block
    stepped = node(sch, loop).loop_var
    starts = {lp.loop_var: lp.min for lp in (node(sch, rv) for rv in loops_of(sch, block))}

    def offsets(step: int) -> list[int | None]:
        ana = tvm.sym.Analyzer()
        for var, start in starts.items():
            ana.bind(var, start + step if var.same_as(stepped) else start)
        for iv, value in zip(blk.iter_vars, realize.iter_values):
            ana.bind(iv.var, ana.simplify(value))
        out: list[int | None] = []
        for access in list(blk.reads) + list(blk.writes):
            shape = _buffer_shape(access.source)
            index = [_const_int(ana.simplify(rng.min)) for rng in access.region]
            if any(v is None for v in shape + index):
                out.append(None)
                continue
            flat = 0
            for extent, at in zip(shape, index):
                flat = flat * extent + at
            out.append(flat)
        return out

    try:
        before, after = offsets(0), offsets(1)
    except Exception:  # noqa: BLE001 - an index the analyzer cannot bind: unknown
        return []
    sizes = [max(1, tvm.DataType(_buffer_dtype(a.source)).bits // 8)
             for a in list(blk.reads) + list(blk.writes)]
    return [(None if b is None or a is None else a - b, size)
            for b, a, size in zip(before, after, sizes)]


def vectorizable_suffix(sch: Schedule, block: SBlockRV, loops: list[LoopRV],
                        extents: list[int | None] | None = None) -> int:
    """How many innermost loops of ``loops`` can be fused into one vector loop with linear
    accesses (MetaSchedule's rule: the innermost used loop may have any stride, each further
    loop must continue it contiguously; loops that no access uses are always fine)."""
    try:
        strides = loop_strides(sch, block, loops)
    except Exception:
        return 0
    if strides is None:
        return 0
    extents = [loop_extent(sch, lp) for lp in loops] if extents is None else extents
    best = len(loops)
    for per_loop in strides:
        fusible = 0
        prev: int | None = None
        for i in range(len(loops) - 1, -1, -1):
            s = per_loop[i]
            if s is None:
                break
            if s == 0:
                fusible += 1
                continue
            if prev is None:
                if s != 1 and fusible != 0:
                    break
                fusible += 1
                prev = i
                continue
            ext = extents[prev]
            if ext is None or s != (per_loop[prev] or 0) * ext:
                break
            fusible += 1
            prev = i
        best = min(best, fusible)
    return best


def is_contiguous_innermost(sch: Schedule, block: SBlockRV, loops: list[LoopRV]) -> bool:
    """Whether every access of ``block`` moves by 0 or 1 element along the innermost loop."""
    try:
        strides = loop_strides(sch, block, loops)
    except Exception:
        return False
    if strides is None:
        return False
    return all(per_loop[-1] in (0, 1) for per_loop in strides)


def read_write_pattern(read_region: Any, write_region: Any) -> tuple[bool, bool, bool]:
    """``(exists, injective, ordered)`` of the read-to-write index mapping, as TVM's
    AnalyzeReadWritePattern: every read index must be a write index variable (optionally
    shifted by a constant) or a constant."""
    var2idx: dict[Any, int] = {}
    for i, rng in enumerate(write_region.region):
        if _const_int(rng.extent) is None or not isinstance(rng.min, tvm.ir.Var):
            return False, False, False
        var2idx[rng.min] = i
    mapped: list[int] = []
    for rng in read_region.region:
        if _const_int(rng.extent) is None:
            return False, False, False
        if _const_int(rng.min) is not None:
            continue
        var = _var_with_shift(rng.min)
        if var is None or var not in var2idx:
            return False, False, False
        mapped.append(var2idx[var])
    ordered = all(a <= b for a, b in zip(mapped, mapped[1:]))
    injective = len(mapped) == len(set(mapped))
    return True, injective, ordered


def _var_with_shift(expr: Any) -> Any:
    if isinstance(expr, tvm.ir.Var):
        return expr
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        if isinstance(expr.a, tvm.ir.Var) and isinstance(expr.b, tirx.IntImm):
            return expr.a
        if isinstance(expr, tirx.Add) and isinstance(expr.b, tvm.ir.Var) and isinstance(
                expr.a, tirx.IntImm):
            return expr.b
    return None


def is_elementwise_consumer(sch: Schedule, producer: SBlockRV, consumer: SBlockRV) -> bool:
    """Whether ``consumer`` is spatial and reads the producer's output exactly where it
    writes its own (same index variables in the same order, full extent): the consumer can
    then be computed at any spatial tile of the producer."""
    try:
        pblk, cblk = node(sch, producer), node(sch, consumer)
    except Exception:
        return False
    if len(pblk.writes) != 1 or len(cblk.writes) != 1:
        return False
    if not all(int(iv.iter_type) == DATA_PAR for iv in cblk.iter_vars):
        return False
    out = pblk.writes[0].source
    reads = [r for r in cblk.reads if r.source.same_as(out)]
    if len(reads) != 1:
        return False
    read, write = reads[0], cblk.writes[0]
    if len(read.region) != len(write.region):
        return False
    for r, w in zip(read.region, write.region):
        if _const_int(r.extent) != 1 or _const_int(w.extent) != 1:
            return False
        if not isinstance(r.min, tvm.ir.Var) or not r.min.same_as(w.min):
            return False
    return _buffer_shape(out) == _buffer_shape(write.source)


def needs_multi_level_tiling(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` is worth multi-level tiling (MetaSchedule's criterion): one write,
    some reads, not spatial, trivially bound, constant regions, no duplicated read buffer,
    not already tiled, and some read buffer is not indexed by some spatial iter (data reuse)."""
    from .params import ANN_TILED

    try:
        blk = node(sch, block)
    except Exception:
        return False
    if ANN_TILED in blk.annotations:
        return False
    if len(blk.writes) != 1 or len(blk.reads) == 0 or is_spatial(sch, block):
        return False
    if not is_trivial_binding(sch, block):
        return False
    if any(_const_int(iv.dom.extent) is None for iv in blk.iter_vars):
        return False
    write_buf = blk.writes[0].source
    spatial_vars = [iv.var for iv in blk.iter_vars
                    if int(iv.iter_type) == DATA_PAR and _const_int(iv.dom.extent) != 1]
    seen: list[Any] = []
    unused = 0
    for region in blk.reads:
        buf = region.source
        if any(buf.same_as(b) for b in seen):
            return False
        seen.append(buf)
        if buf.same_as(write_buf):
            continue
        used: set[Any] = set()
        for rng in region.region:
            if _const_int(rng.extent) is None:
                return False
            used.update(tirx.analysis.undefined_vars(rng.min))
        unused += sum(1 for v in spatial_vars if v not in used)
    return unused >= 1


def try_on_copy(sch: Schedule, action: Any) -> bool:
    """Whether ``action(copy_of_sch)`` succeeds without a ScheduleError (``sch`` untouched)."""
    trial = sch.copy()
    try:
        action(trial)
        return True
    except Exception:  # ScheduleError, or a TVM internal error raised by the primitive
        return False
