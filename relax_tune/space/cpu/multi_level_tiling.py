"""Multi-level tiling of reduction blocks (structure "SSRSRS" on CPU) with a write cache or a
fused elementwise epilogue placed at a tile level."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .. import analysis as A
from .operand_packing import packable_reads
from ..params import ANN_PACK, ANN_TILED, ANN_WHOLE_LOOP, TargetParams
from ..rule import Postproc, ScheduleRule

logger = logging.getLogger(__name__)


@dataclass
class _Tiled:
    """A schedule after tiling: the loops of each tile level, outermost level first."""

    sch: Schedule
    block: SBlockRV
    tiles: list[list[LoopRV]] = field(default_factory=list)


class MultiLevelTiling(ScheduleRule):
    """Tile every loop of a reduction block into levels and reorder them by ``structure``
    (one letter per level, "S" spatial / "R" reduction, outermost first), with the tile
    sizes drawn by ``sample_perfect_tile``.

    Sampling is biased toward useful tiles: the innermost spatial loop (the one that will be
    vectorised) is first split by the vector lanes when its extent allows, so its innermost
    tile is always a multiple of the lanes and at most ``max_vector_registers_per_loop``
    registers; other innermost spatial tiles are at most ``max_innermost_spatial``, the
    innermost reduction tile at most ``max_innermost_reduction``.

    The result is written back through a cache at each level of ``write_levels`` (one sketch
    per level, plus one without a cache), or, when the block's only consumer is an
    elementwise block (bias add, ReLU...), that consumer is fused at each level instead.

    A block with inputs worth packing (``operand_packing.packable_reads``: B of ``A @ B``)
    also samples whether the postprocessor packs them inside the kernel (``ANN_PACK``).

    Args:
        params: the target's parameters.
        structure: the tile levels, e.g. "SSRSRS".
        write_levels: 1-based spatial tile levels where the write cache / epilogue goes.
        keep_unfused: also keep the sketch without a write cache or fused epilogue.
        pack_operands: sample in-kernel packing for blocks with packable inputs.
        pad_awkward_extents: also offer a sketch with spatial extents that no perfect tile
            serves (primes such as 197) padded (``_padding``).
        pad_multiple: what non-vectorised spatial extents are padded to a multiple of.
    """

    name = "multi_level_tiling"

    def __init__(self, params: TargetParams, structure: str = "SSRSRS",
                 write_levels: tuple[int, ...] = (1, 2), keep_unfused: bool = True,
                 pack_operands: bool = True, pad_awkward_extents: bool = True,
                 pad_multiple: int = 8) -> None:
        if not structure or set(structure) - {"S", "R"} or "S" not in structure:
            raise ValueError(f"bad tiling structure {structure!r}: use letters S and R")
        self.params = params
        self.structure = structure
        self.write_levels = tuple(write_levels)
        self.keep_unfused = keep_unfused
        self.pack_operands = pack_operands
        self.pad_awkward_extents = pad_awkward_extents
        self.pad_multiple = pad_multiple
        self.s_levels = [i for i, c in enumerate(structure) if c == "S"]
        self.r_levels = [i for i, c in enumerate(structure) if c == "R"]

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Tile ``block`` when it needs it; returns one schedule per write-back variant."""
        if not A.needs_multi_level_tiling(sch, block):
            return [sch]
        loops = A.loops_of(sch, block)
        types = A.iter_types(sch, block)
        if len(loops) != len(types) or any(t not in (A.DATA_PAR, A.COMM_REDUCE) for t in types):
            return [sch]
        name = A.node(sch, block).name_hint
        variants = [sch]
        padded = self._padded(sch, block, loops, types)
        if padded is not None:
            variants.append(padded)
        results: list[Schedule] = []
        for variant in variants:
            try:
                tiled = self._tile(variant, block, A.loops_of(variant, block), types)
            except Exception as err:  # a primitive refused: keep the block as it is
                logger.debug("cannot tile %s: %s", name, err)
                results.append(variant)
                continue
            results.extend(self._write_back(tiled))
        logger.debug("tiled %s (%s): %d variants", name, self.structure, len(results))
        return results

    # -- padding --------------------------------------------------------------------------

    def _padding(self, sch: Schedule, loops: list[LoopRV], types: list[int],
                 lanes: int) -> list[int] | None:
        """Per block iter, the multiple to pad it to, for spatial extents no perfect tile
        serves (a ViT's 197 tokens: the row tile can only be 1, the vector axis can only be
        197 wide): the vectorised axis to a multiple of the lanes, other spatial axes to a
        multiple of ``pad_multiple``; None when every extent tiles well."""
        spatial = [i for i, t in enumerate(types) if t == A.DATA_PAR]
        extents = [A.loop_extent(sch, lp) for lp in loops]
        vec = next((i for i in reversed(spatial) if extents[i] != 1), None)
        padding = [1] * len(loops)
        for i in spatial:
            extent = extents[i]
            if extent is None or extent <= 1:
                continue
            multiple = lanes if i == vec and lanes > 1 else self.pad_multiple
            if extent <= multiple or extent % multiple == 0:
                continue
            if i != vec and _largest_divisor(extent, self.pad_multiple) >= 4:
                continue  # e.g. 196 = 4 x 49 tiles fine
            padding[i] = multiple
        return padding if any(p > 1 for p in padding) else None

    def _padded(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV],
                types: list[int]) -> Schedule | None:
        """A copy of ``sch`` with ``block``'s awkward spatial extents padded
        (``pad_einsum``: zero-padded input copies, a padded output sliced back), the slice
        inlined into an elementwise consumer so the epilogue can still be fused; None when
        nothing needs padding or the block cannot be padded."""
        if not self.pad_awkward_extents:
            return None
        padding = self._padding(sch, loops, types, self.params.lanes(A.write_dtype(sch, block)))
        if padding is None:
            return None
        padded = sch.copy()
        try:
            padded.pad_einsum(block, padding)
        except Exception as err:
            logger.debug("cannot pad %s: %s", A.node(sch, block).name_hint, err)
            return None
        consumers = A.consumers_of(padded, block)
        if len(consumers) == 1:  # the slice back to the unpadded buffer
            try:
                padded.compute_inline(consumers[0])
            except Exception:  # it writes the function's output: it stays a slice
                pass
        return padded

    # -- tiling ---------------------------------------------------------------------------

    def _tile(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV],
              types: list[int]) -> _Tiled:
        n_levels = len(self.structure)
        tiles: list[list[LoopRV]] = [[] for _ in range(n_levels)]
        spatial_idx = [i for i, t in enumerate(types) if t == A.DATA_PAR]
        vec_loop = None
        for i in reversed(spatial_idx):
            if A.loop_extent(sch, loops[i]) != 1:
                vec_loop = i
                break
        lanes = self.params.lanes(A.write_dtype(sch, block))
        whole = A.node(sch, block).annotations.get(ANN_WHOLE_LOOP)
        for i, (loop, kind) in enumerate(zip(loops, types)):
            extent = A.loop_extent(sch, loop)
            levels = self.s_levels if kind == A.DATA_PAR else self.r_levels
            if extent is None:
                raise ValueError("symbolic loop extent")
            if whole is not None and i == int(whole) and kind == A.DATA_PAR:
                # split only inside the levels where the write-back may go: a tile there
                # covers all of the loop
                levels = levels[max(self.write_levels, default=0):] or levels[-1:]
            if extent == 1 or len(levels) == 1:
                tiles[levels[0]].append(loop)
                continue
            if kind == A.COMM_REDUCE:
                parts = self._split(sch, loop, len(levels), self.params.max_innermost_reduction)
                for lvl, part in zip(levels, parts):
                    tiles[lvl].append(part)
            elif i == vec_loop and lanes > 1 and extent == lanes:
                tiles[levels[-1]].append(loop)
            elif i == vec_loop and lanes > 1 and extent % lanes == 0:
                outer, inner = sch.split(loop, [None, lanes])
                max_regs = max(1, self.params.max_vector_registers_per_loop)
                parts = self._split(sch, outer, len(levels), max_regs)
                for lvl, part in zip(levels, parts):
                    tiles[lvl].append(part)
                tiles[levels[-1]].append(inner)
            else:
                max_inner = (self.params.max_innermost_generic if i == vec_loop
                             else self.params.max_innermost_spatial)
                parts = self._split(sch, loop, len(levels), max_inner)
                for lvl, part in zip(levels, parts):
                    tiles[lvl].append(part)
        order = [lp for level in tiles for lp in level]
        if len(order) > 1:
            sch.reorder(*order)
        sch.annotate(block, ANN_TILED, self.structure)
        if self.pack_operands and packable_reads(sch.mod[A.func_name_of(sch)],
                                                 A.node(sch, block)):
            choice = sch.sample_categorical([0, 1], [0.5, 0.5])
            sch.annotate(block, ANN_PACK, choice)
        return _Tiled(sch, block, tiles)

    @staticmethod
    def _split(sch: Schedule, loop: LoopRV, n: int, max_innermost: int) -> list[LoopRV]:
        factors = sch.sample_perfect_tile(loop, n=n, max_innermost_factor=max_innermost)
        return list(sch.split(loop, factors))

    # -- write back -----------------------------------------------------------------------

    def _levels(self, tiled: _Tiled) -> list[tuple[int, LoopRV]]:
        out = []
        for level in self.write_levels:
            if 1 <= level <= len(self.s_levels):
                loops = tiled.tiles[self.s_levels[level - 1]]
                if loops:
                    out.append((level, loops[-1]))
        return out

    def _write_back(self, tiled: _Tiled) -> list[Schedule]:
        sch, block = tiled.sch, tiled.block
        levels = self._levels(tiled)
        if not levels:
            return [sch]
        consumers = A.consumers_of(sch, block)
        results: list[Schedule] = []
        if len(consumers) == 1 and A.is_elementwise_consumer(sch, block, consumers[0]):
            for _level, loop in levels:
                trial = sch.copy()
                try:
                    trial.reverse_compute_at(consumers[0], loop, preserve_unit_loops=True)
                    results.append(trial)
                except Exception as err:
                    logger.debug("cannot fuse the epilogue at a tile level: %s", err)
            if results:
                if self.keep_unfused:
                    results.insert(0, sch)
                return results
        if self.keep_unfused:
            results.append(sch.copy())
        try:
            cache = sch.cache_write(block, 0, "global")
        except Exception as err:
            logger.debug("cannot add a write cache: %s", err)
            return results or [sch]
        for _level, loop in levels:
            trial = sch.copy()
            try:
                trial.reverse_compute_at(cache, loop, preserve_unit_loops=True)
                results.append(trial)
            except Exception as err:
                logger.debug("cannot place the write cache at a tile level: %s", err)
        return results or [sch]


def accumulator_budget(params: TargetParams) -> int:
    """SIMD registers a register tile's accumulators may fill: all but those the operands
    need. An FMA of a broadcast input and a weight vector holds two; with 16 registers (AVX2)
    two reserved let a 7x7 map's tile of 7 pixels take two vectors (14 accumulators), where
    four held it to one: MobileNetV2's 7x7 1x1 convolutions tuned 11-15% faster (AMD EPYC Zen
    1, 48-64 trials each, docs/design/cpu-space-limits.md). With 32 registers four stay
    reserved (28 accumulators), as measured there before; two were not measured."""
    reserved = 2 if params.vector_registers <= 16 else 4
    return max(1, params.vector_registers - reserved)


class LimitRegisterTile(Postproc):
    """Reject candidates whose innermost tile of a tiled block cannot live in registers.

    The loops inside a tiled block's last reduction loop hold the accumulators the inner
    loop updates: their element count, in SIMD registers of the written type, must not
    exceed ``accumulator_budget`` (the rest holds the broadcast and loaded operands);
    otherwise every update spills. It must not be below ``min_registers`` either
    (or the largest tile the block's extents allow, when that is smaller): a single accumulator chain
    waits on the FMA latency every update. Rejected samples are simply redrawn, so this
    biases random sampling toward sane register tiles without constraining each tile alone.
    """

    name = "limit_register_tile"

    def __init__(self, params: TargetParams, min_registers: int = 4) -> None:
        self.params = params
        self.budget = accumulator_budget(params)
        self.min_registers = max(1, min(min_registers, self.budget))

    def apply(self, sch: Schedule) -> bool:
        """False when some tiled block's register tile is past the budget or too small."""
        for lanes, inner, whole in self._tiles(sch):
            regs = 1
            for loop in inner:
                extent = A._const_int(loop.extent) or 1
                regs *= -(-extent // lanes) if int(loop.kind) == A.FOR_VECTORIZED else extent
            if regs > self.budget:
                return False
            if regs < self.min_registers and regs < -(-whole // lanes):
                return False
        return True

    def precheck(self, sch: Schedule) -> bool:
        """Before vectorisation: reject a tile that is past the budget even if its
        accumulators were packed into full vectors, or below the minimum even if none were
        (vectorising only moves the count between those bounds)."""
        for lanes, inner, whole in self._tiles(sch):
            elems = 1
            for loop in inner:
                elems *= A._const_int(loop.extent) or 1
            if -(-elems // lanes) > self.budget:
                return False
            if elems < self.min_registers and elems < -(-whole // lanes):
                return False
        return True

    def _tiles(self, sch: Schedule):
        """(SIMD lanes of the written type, the loops of the register tile, elements of the
        whole spatial output) of every tiled reduction block. Reads the IR only: schedule
        queries would be recorded in the trace (in the sketch part, during ``precheck``)."""
        yield from _register_tiles(sch.mod[A.func_name_of(sch)].body, self.params)


def _updates(blk) -> bool:
    """Whether the block reads the buffer it writes (an update after decomposition)."""
    if len(blk.writes) != 1:
        return False
    out = blk.writes[0].source
    return any(r.source.same_as(out) for r in blk.reads)


def _largest_divisor(extent: int, bound: int) -> int:
    """The largest divisor of ``extent`` that is at most ``bound`` (1 at least)."""
    return max((d for d in range(1, min(extent, bound) + 1) if extent % d == 0), default=1)


def _reachable(extents: list[int], params: TargetParams, lanes: int) -> int:
    """The largest register tile, in elements, that ``MultiLevelTiling._tile`` can sample
    for spatial axes of these ``extents``: on the vectorised axis (the last one above 1)
    whole vectors, at most ``max_vector_registers_per_loop`` of them, when the lanes divide
    it; on the others a divisor up to ``max_innermost_generic``."""
    vec = max((i for i, e in enumerate(extents) if e != 1), default=None)
    whole = 1
    for i, extent in enumerate(extents):
        if i == vec and lanes > 1 and extent % lanes == 0:
            whole *= lanes * _largest_divisor(extent // lanes,
                                              max(1, params.max_vector_registers_per_loop))
        else:
            whole *= _largest_divisor(extent, params.max_innermost_generic)
    return whole


def _register_tiles(stmt, params: TargetParams, loops: tuple = ()):
    """(SIMD lanes of the written type, register-tile loops, reachable elements) of every
    tiled reduction block under ``stmt`` (an update after decomposition included). The
    register tile is the spatial loops inside the block's last reduction loop; ``loops``:
    the enclosing Fors. Reachable elements: the largest register tile the sampled tiles can
    give (``_reachable``): with prime extents such as a ViT's 197 tokens it is tiny, and no
    sample could meet the minimum; a classifier's 1 x 1000 output (125 vectors of 8:
    5 x 5 x 5) has one vector."""
    if isinstance(stmt, tvm.tirx.For):
        yield from _register_tiles(stmt.body, params, loops + (stmt,))
    elif isinstance(stmt, tvm.tirx.SeqStmt):
        for child in stmt.seq:
            yield from _register_tiles(child, params, loops)
    elif isinstance(stmt, tvm.s_tir.SBlockRealize):
        blk = stmt.block
        if ANN_TILED in blk.annotations and (blk.init is not None or _updates(blk)):
            reduce_vars: set = set()
            extents = []
            for iv, value in zip(blk.iter_vars, stmt.iter_values):
                if int(iv.iter_type) == A.DATA_PAR:
                    extents.append(A._const_int(iv.dom.extent) or 1)
                else:
                    reduce_vars |= set(tvm.tirx.analysis.undefined_vars(value))
            inner: list = []
            for loop in reversed(loops):
                if loop.loop_var in reduce_vars:
                    break
                inner.insert(0, loop)
            lanes = params.lanes(A._buffer_dtype(blk.writes[0].source))
            yield lanes, inner, _reachable(extents, params, lanes)
        yield from _register_tiles(blk.body, params, ())
    elif hasattr(stmt, "body") and isinstance(getattr(stmt, "body"), tvm.tirx.Stmt):
        yield from _register_tiles(stmt.body, params, loops)
