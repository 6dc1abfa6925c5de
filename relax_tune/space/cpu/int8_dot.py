"""Int8 kernels on the target's dot-product instruction: a whole-function schedule for the
integer convolutions and matmuls ``lowering.int8`` makes (``C[.., o] += u8 A[.., r] * s8
W[.., o, .., r, ..]`` in int32, then the requantisation epilogue).

The instruction (``int8_intrin.int8_dot_intrinsic``: AVX512-VNNI's ``vpdpbusd``, 16 lanes x
4 bytes; AVX-VNNI's 256-bit one, 8 x 4; AVX2's ``vpmaddwd`` on s16 pairs, 8 x 2) adds
``depth`` products to each of ``lanes`` int32 lanes, so the schedule

- splits the output channel ``o`` by ``lanes`` and the innermost reduction ``r`` (the
  input's contiguous axis: NHWC channels, a matmul's ``k``) by ``depth``, and tensorizes
  that tile with the intrinsic (``depth`` bytes of ``A`` broadcast, a tile of ``W``);
- packs the weight so each tile is contiguous, ``[o/lanes, .., r/depth, lanes, depth]``
  (widened to s16 for AVX2, ``unsafe_set_dtype``, the values unchanged): a ``cache_read``
  annotated as a layout-rewrite block, so with bound weights (``cpu_weight_prepack``) it
  runs once at compile time and otherwise once per call;
- keeps a register tile of ``rows x vectors`` accumulators (rows from the spatial axis
  before ``o``: a matmul's ``m``, a convolution's output width; vectors of ``lanes``
  channels), both sampled (``sample_perfect_tile``), in a tile-sized buffer written back
  with the epilogue inlined into the write-back, and runs the outer tiles in parallel, a
  convolution's output rows partly inside each job (sampled), under its channel tile, so
  the job's weights serve all its rows (``int8_tile.rows_into_jobs``).

Where the target has AMX tiles the rule also offers AMX sketches of the same function
(``amx_tiles``), and the tuner measures both kinds.

Output channels that are no multiple of AVX512-VNNI's 16 lanes but of 8 (MobileNetV2's 24)
take its 256-bit form (``int8_intrin.half_width``). Functions of another shape, sizes the
instruction does not tile (``o`` not a multiple of ``lanes``, ``r`` of ``depth``: a first
convolution's 3 channels, a depthwise one), and targets without an instruction are left to
the block rules (``sketches`` returns ``[]``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.sym import detect_linear_equation

from .. import analysis as A
from ..params import TargetParams
from ..rule import FunctionRule
from .amx_tiles import AMX_DEPTH, AMX_LANES, amx_choices, schedule_amx
from .int8_intrin import DotInstruction, dot_instruction, half_width, marked_narrow, \
    narrow_variant, register
from .int8_tile import pad_in_jobs, padding_block_name, rows_into_jobs, \
    write_back_and_pack
from .layout_rewrite import PREPROC_ANNOTATION

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Shape:
    """What the schedule needs to know of the integer reduction block."""

    block: str
    spatial: list[int]   # positions of the spatial iter vars (one loop each, in order)
    reduce: list[int]    # positions of the reduction iter vars
    o: int               # the output channel's position
    r: int               # the contiguous reduction axis' position
    m: int               # the spatial axis before o: the register tile's rows
    weight_read: int     # the index of the weight in the block's reads
    weight_dims: list[int]  # the iter var position each weight dimension is indexed by
    m_stride: int | None = None  # m's coefficient in the input's index (a stride), if one


def _loads(stmt, buffer) -> list:
    out: list = []
    tvm_ffi.structural_walk(stmt, [(tvm.ir.TensorLoad, lambda load: out.append(load)
                                    if load.source.same_as(buffer) else None)])
    return out


def _position(expr, iter_vars: list) -> int | None:
    if not isinstance(expr, tirx.Var):
        return None
    return next((i for i, v in enumerate(iter_vars) if v.same_as(expr)), None)


def recognise(sch: Schedule, lanes: int, depth: int) -> _Shape | None:
    """The integer reduction of ``sch``'s function in a shape a ``lanes`` x ``depth``
    intrinsic tiles, or None."""
    blocks = [b for b in A.collect_blocks(sch) if not A.is_root(sch, b)]
    reductions = [b for b in blocks if A.node(sch, b).init is not None]
    if len(reductions) != 1:
        return None
    block_rv = reductions[0]
    block = A.node(sch, block_rv)
    if len(block.reads) != 2 or len(block.writes) != 1 or not A.is_trivial_binding(
            sch, block_rv) or len(A.loops_of(sch, block_rv)) != len(block.iter_vars):
        return None
    (a, w), c = (r.source for r in block.reads), block.writes[0].source
    if (str(a.dtype), str(w.dtype), str(c.dtype)) != ("uint8", "int8", "int32"):
        return None
    a_loads, w_loads, c_stores = _loads(block.body, a), _loads(block.body, w), []
    tvm_ffi.structural_walk(block.body, [(tirx.BufferStore, lambda s: c_stores.append(s))])
    if len(a_loads) != 1 or len(w_loads) != 1 or len(c_stores) != 1:
        return None
    ivs = [iv.var for iv in block.iter_vars]
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    extents = [A._const_int(iv.dom.extent) for iv in block.iter_vars]
    dims = [_position(e, ivs) for e in w_loads[0].indices]
    r = _position(a_loads[0].indices[-1], ivs)
    o = _position(c_stores[0].indices[-1], ivs)
    if None in dims or len(set(dims)) != len(dims) or r is None or o is None \
            or r not in dims or o not in dims or kinds[o] != A.DATA_PAR \
            or kinds[r] != A.COMM_REDUCE or [d for d in dims if kinds[d] == A.DATA_PAR] != [o]:
        return None
    if extents[o] is None or extents[r] is None or extents[o] % lanes or extents[r] % depth:
        return None
    spatial = [i for i, k in enumerate(kinds) if k == A.DATA_PAR]
    before = [i for i in spatial if i < o]
    if not before or any(e is None for e in extents):
        return None
    return _Shape(str(block.name_hint), spatial, [i for i in range(len(kinds)) if
                                                  i not in spatial], o, r, before[-1], 1, dims,
                  _coefficient(a_loads[0].indices, ivs[before[-1]]))


def narrow_pair_weight(func: tirx.PrimFunc, lanes: int, depth: int
                       ) -> tuple[int, int] | None:
    """For an integer reduction a ``lanes`` x ``depth`` instruction tiles, whose weight is a
    parameter of ``func``: ``(the weight's parameter index, its axis along the contiguous
    reduction)``, the axis along which the packed tile puts each pair of bytes a
    ``vpmaddubsw`` sums (indices 2i and 2i+1). None for any other function."""
    sch = Schedule(tvm.IRModule({"main": func}))
    shape = recognise(sch, lanes, depth)
    if shape is None:
        return None
    weight = A.node(sch, sch.get_sblock(shape.block)).reads[shape.weight_read].source
    index = next((i for i, p in enumerate(func.params) if p.same_as(weight)), None)
    return None if index is None else (index, shape.weight_dims.index(shape.r))


def _coefficient(indices, var) -> int | None:
    """The constant factor of ``var`` in the one index of ``indices`` that uses it."""
    found = []
    for index in indices:
        linear = detect_linear_equation(index, [var])
        if len(linear) == 2 and isinstance(linear[0], tirx.IntImm) and linear[0].value:
            found.append(int(linear[0].value))
    return found[0] if len(found) == 1 else None


class Int8DotProduct(FunctionRule):
    """Schedule an integer convolution or matmul on the int8 dot-product instruction (see
    the module docstring); ``[]`` for other functions or when ``intrinsic`` is None.

    Args:
        params: the target's parameters (cores).
        intrinsic: the tensor intrinsic's name (``int8_intrin.int8_dot_intrinsic``).
        max_register_rows: largest number of rows in the register tile (one fewer for
            instructions on 16 registers).
        max_register_vectors: largest number of ``lanes``-channel vectors in the register
            tile.
        max_job_rows: largest number of a convolution's output rows a parallel job
            computes with the same weights (``int8_tile.rows_into_jobs``).
    """

    name = "int8_dot_product"

    def __init__(self, params: TargetParams, intrinsic: str | None,
                 max_register_rows: int = 8, max_register_vectors: int = 4,
                 amx: bool = False, max_job_rows: int = 8) -> None:
        self.params = params
        self.intrinsic = intrinsic
        self.amx = amx
        self.instruction: DotInstruction | None = \
            dot_instruction(intrinsic) if intrinsic is not None else None
        self.max_register_rows = max_register_rows
        self.max_register_vectors = max_register_vectors
        self.max_job_rows = max_job_rows

    def sketches(self, sch: Schedule) -> list[Schedule]:
        """For an integer reduction the instructions tile: one sketch on the dot-product
        instruction, and with ``amx`` one on AMX tiles per arrangement of accumulator
        tiles (``amx_tiles.schedule_amx``); ``[]`` otherwise."""
        out: list[Schedule] = []
        inst, shape = self._instruction_for(sch)
        if shape is not None:
            out += self._try(sch, lambda s: self._schedule(s, shape, inst))
        amx_shape = recognise(sch, AMX_LANES, AMX_DEPTH) if self.amx else None
        if amx_shape is not None:
            for tiles, vectors in amx_choices(sch, amx_shape):
                # a convolution's whole window in one call where its input allows
                out += self._try(sch, lambda s, t=tiles, v=vectors: schedule_amx(
                    s, amx_shape, t, v, self._inline, window=True)) or self._try(
                    sch, lambda s, t=tiles, v=vectors: schedule_amx(
                        s, amx_shape, t, v, self._inline))
        return out

    def _instruction_for(self, sch: Schedule) -> tuple[DotInstruction | None, _Shape | None]:
        """The instruction for ``sch``'s function and the reduction it tiles: the narrow
        variant (``vpmaddubsw``) on a function marked ``NARROW_PAIRS_ATTR`` where it tiles,
        else the target's own; ``(_, None)`` where neither tiles it."""
        if self.instruction is None:
            return None, None
        candidates = [self.instruction]
        narrow = narrow_variant(self.instruction.name)
        if narrow is not None and marked_narrow(sch.mod["main"]):
            candidates.insert(0, narrow)
        half = half_width(self.instruction.name)
        if half is not None:
            candidates.append(half)
        for inst in candidates:
            shape = recognise(sch, inst.lanes, inst.depth)
            if shape is not None:
                register(inst.name)
                return inst, shape
        return None, None

    @staticmethod
    def _try(sch: Schedule, schedule) -> list[Schedule]:
        try:
            out = sch.copy()
            schedule(out)
        except Exception as err:  # a primitive refused: leave it to the other sketches
            logger.debug("int8 dot-product schedule failed: %s", err)
            return []
        return [out]

    def _schedule(self, sch: Schedule, shape: _Shape, inst: DotInstruction) -> None:
        lanes, depth = inst.lanes, inst.depth
        pad = padding_block_name(sch, shape.block)
        self._inline(sch, shape.block, sch.compute_inline)  # producers, epilogue chain
        main = sch.get_sblock(shape.block)
        loops = A.loops_of(sch, main)
        o0, o1 = sch.split(loops[shape.o], [None, lanes])
        o0a, o0b = sch.split(o0, sch.sample_perfect_tile(
            o0, n=2, max_innermost_factor=self.max_register_vectors))
        r0, r1 = sch.split(loops[shape.r], [None, depth])
        # 16 ymm registers (AVX2, AVX-VNNI): up to 7 rows, for 7-row tiles of one vector
        # (7 accumulators): 7x7 and 14x14 layers have no row count from 3 to 6, and their
        # 1-row tiles read each weight once per pixel (7-bit 7x7x512 conv: 676 against 727
        # us, AMD EPYC without AVX-512, 2 threads, 40 trials each); wider tiles of more
        # rows spill and lose when measured
        rows = self.max_register_rows if inst.registers >= 32 else self.max_register_rows - 1
        m0, m1 = sch.split(loops[shape.m], sch.sample_perfect_tile(
            loops[shape.m], n=2, max_innermost_factor=rows))
        outer = [loops[i] for i in shape.spatial if i not in (shape.m, shape.o)]
        outer, rows_in_job = rows_into_jobs(sch, outer, self.max_job_rows)
        inner_reduce = [loops[i] for i in shape.reduce if i != shape.r]
        sch.reorder(*outer, m0, o0a, *rows_in_job, *inner_reduce, r0, m1, o0b, o1, r1)
        # the weight packed so each lanes x depth step reads contiguous memory
        nd, bo = len(shape.weight_dims), shape.weight_dims.index(shape.o)
        br = shape.weight_dims.index(shape.r)

        def packed(*d):
            middle = [d[i] // depth if i == br else d[i] for i in range(nd) if i != bo]
            return [d[bo] // lanes, *middle, d[bo] % lanes, d[br] % depth]

        tile_loop = rows_in_job[0] if rows_in_job else o0a  # a register tile each
        back, packer = write_back_and_pack(sch, main, tile_loop, [*outer, m0, o0a],
                                           shape.weight_read, packed)
        if inst.weight_dtype != "int8":  # widened once, when packed (AVX2's s16 pairs)
            sch.unsafe_set_dtype(packer, 0, inst.weight_dtype)
        sch.decompose_reduction(main, (inner_reduce + [r0])[0])
        sch.tensorize(o1, inst.name)
        # the epilogue's last block computed in the write-back, per tile
        self._inline(sch, shape.block, sch.reverse_compute_inline,
                     str(A.node(sch, back).name_hint))
        sch.vectorize(A.loops_of(sch, back)[-1])
        pad_in_jobs(sch, pad, A.loops_of(sch, back)[0])

    @staticmethod
    def _inline(sch: Schedule, main_name: str, inline, back_name: str = "") -> None:
        """``inline`` (compute_inline: dequantized residuals and the epilogue chain into
        their consumers; reverse_compute_inline: the epilogue into the write-back) every
        block it takes; a block that cannot move stays a loop nest of its own. The input's
        padding block stays (inlined, its ``if_then_else`` would be in the instruction's
        load): ``pad_in_jobs`` places it."""
        keep = {main_name, back_name, f"{main_name}_init", f"{main_name}_update",
                *([padding_block_name(sch, main_name)] if inline == sch.compute_inline else [])}
        progress = True
        while progress:
            progress = False
            for block in A.collect_blocks(sch):
                node = A.node(sch, block)
                if A.is_root(sch, block) or str(node.name_hint) in keep \
                        or PREPROC_ANNOTATION in node.annotations:
                    continue
                try:
                    inline(block)
                except Exception:  # noqa: BLE001 - not inlinable this way
                    continue
                progress = True
                break
