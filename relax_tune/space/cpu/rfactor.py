"""rfactor of reductions whose spatial extent is too small to keep the cores busy (a full sum,
a softmax over few rows), or that run across the rows of their input (a global average pool
over an NHWC tensor): part of the reduction becomes a spatial, parallel axis."""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..params import TargetParams
from ..rule import ScheduleRule

logger = logging.getLogger(__name__)


MIN_COLUMN_ROWS = 64
"""Fewer rows than this and a reduction across them runs faster untuned, on one core, than
any parallel schedule: a 7x7x1152 mean took 2.0 us untuned against 9.9 us in the column
sketch and 4.4 us in the channel sketch; 14x14x240, 19.1 us against 2.8 and 2.5 (AMD EPYC
Zen 4, 2 threads)."""


class AddRFactor(ScheduleRule):
    """For a reduction block that multi-level tiling leaves alone and whose spatial extent is
    at most the target's parallel budget and below its reduction extent: move the reduction
    loops innermost, fuse them, split the fused loop in two with ``sample_perfect_tile`` and
    offer one sketch with ``rfactor`` at each of the two parts, besides the block unchanged.
    A reduction across the rows of its input, whatever its spatial extent, gets the column
    and channel sketches instead (``_channel_sketch``): rows split over the cores, each part
    summing whole contiguous rows
    (the squeeze of a squeeze-and-excite block: a 112x112x32 mean in 11 us, against 333 us
    untuned and 170 us for the best row sketch; AMD EPYC Zen 4, 2 threads).

    Args:
        params: the target's parameters (the parallel budget).
        max_innermost_factor: largest inner part of the split reduction loop.
    """

    name = "add_rfactor"

    def __init__(self, params: TargetParams, max_innermost_factor: int = 64) -> None:
        self.params = params
        self.max_innermost_factor = max_innermost_factor

    def needs_rfactor(self, spatial: int, reduce: int) -> bool:
        """Whether a plain reduction of these extents has too little spatial work to
        parallelise."""
        return spatial <= self.params.max_parallel_extent and reduce > max(spatial, 1) \
            and reduce >= 2 * self.params.num_cores

    def needs_column_rfactor(self, sch: Schedule, block: SBlockRV, reduce: int) -> bool:
        """Whether the plain reduction ``block`` runs across ``MIN_COLUMN_ROWS`` rows of its
        input or more (``reduces_across_rows``), whatever its spatial extent."""
        return reduce >= max(MIN_COLUMN_ROWS, 2 * self.params.num_cores) \
            and reduces_across_rows(sch, block)

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """For a plain reduction (``_plain_reduction_extents``): the column and channel
        sketches alone for one across rows (``needs_column_rfactor``; the block unchanged
        and the row sketches read one element per cache line there); else ``[sch]`` plus up
        to two row sketches (``needs_rfactor``)."""
        extents = _plain_reduction_extents(sch, block)
        if extents is None:
            return [sch]
        spatial, reduce = extents
        if self.needs_column_rfactor(sch, block, reduce):
            column = [sk for sk in (self._column_sketch(sch.copy(), block),
                                    self._channel_sketch(sch.copy(), block)) if sk is not None]
            if column:
                return column
        if self.needs_rfactor(spatial, reduce):
            return [sch, *self._row_sketches(sch, block)]
        return [sch]

    def _row_sketches(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """The reduction loops innermost, fused, split in two (sampled), with rfactor at
        the outer part, then at the inner part."""
        name = sch.get(block).name_hint
        base = sch.copy()
        try:
            kinds, spatial, reduce = _loops_by_kind(base, block)
            if any(k not in ("S", "R") for k in kinds):
                return []
            if kinds != ["S"] * len(spatial) + ["R"] * len(reduce):
                base.reorder(*spatial, *reduce)
            fused = base.fuse(*reduce) if len(reduce) > 1 else reduce[0]
            factors = base.sample_perfect_tile(fused, n=2,
                                               max_innermost_factor=self.max_innermost_factor)
            parts = base.split(fused, factors)
        except Exception as err:  # a primitive refused: keep the block as it is
            logger.debug("cannot prepare %s for rfactor: %s", name, err)
            return []
        results = []
        for part in parts:
            trial = base.copy()
            try:
                trial.rfactor(part, factor_axis=len(spatial))
                results.append(trial)
            except Exception as err:
                logger.debug("cannot rfactor %s: %s", name, err)
        return results

    def _column_sketch(self, sch: Schedule, block: SBlockRV) -> Schedule | None:
        """The reduction loops outermost, the first of them split into a sampled number of
        parts (a divisor of its extent, from the cores to the parallel budget), rfactor at
        the parts: each part sums its rows with the spatial loops innermost, contiguous and
        vectorised, in parallel with the others; then the parts' sums are added. Splitting
        one loop, not the fused reduction, keeps the input's indices linear for the
        vectoriser."""
        try:
            _, spatial, reduce = _loops_by_kind(sch, block)
            extent = A.loop_extent(sch, reduce[0])
            counts = [n for n in range(self.params.num_cores, self.params.max_parallel_extent + 1)
                      if extent and n > 1 and extent % n == 0]
            if not counts:
                return None
            sch.reorder(*reduce, *spatial)
            count = sch.sample_categorical(counts, [1.0 / len(counts)] * len(counts))
            outer, _ = sch.split(reduce[0], [count, None])
            sch.rfactor(outer, factor_axis=0)
            return sch
        except Exception as err:  # noqa: BLE001 - a primitive refused: no column sketch
            logger.debug("no column rfactor for %s: %s", sch.get(block).name_hint, err)
            return None

    def _channel_sketch(self, sch: Schedule, block: SBlockRV) -> Schedule | None:
        """The innermost spatial loop split into chunks of a sampled whole number of
        registers, the reduction loops between the chunks and their lanes: the cores take
        chunks of channels, each summing its chunk of every row in a vector loop, with no
        partial sums to add (the column sketch adds its parts' sums in a second pass over the
        channels)."""
        try:
            _, spatial, reduce = _loops_by_kind(sch, block)
            extent = A.loop_extent(sch, spatial[-1]) if spatial else None
            lanes = self.params.lanes(A.write_dtype(sch, block))
            widths = [w for w in range(lanes, 4 * lanes + 1, lanes)
                      if extent and extent % w == 0 and extent // w >= self.params.num_cores]
            if not widths:
                return None
            width = sch.sample_categorical(widths, [1.0 / len(widths)] * len(widths))
            outer, inner = sch.split(spatial[-1], [None, width])
            sch.reorder(*spatial[:-1], outer, *reduce, inner)
            return sch
        except Exception as err:  # noqa: BLE001 - a primitive refused: no channel sketch
            logger.debug("no channel sketch for %s: %s", sch.get(block).name_hint, err)
            return None


def _loops_by_kind(sch: Schedule, block: SBlockRV) -> tuple[list[str], list, list]:
    """``(kinds, spatial loops, reduction loops)`` of ``block``'s loops, outermost first
    ("S", "R" or another iterator kind per loop)."""
    loops = sch.get_loops(block)
    kinds = [A.loop_iter_type(sch, lp) for lp in loops]
    return (kinds, [lp for lp, k in zip(loops, kinds) if k == "S"],
            [lp for lp, k in zip(loops, kinds) if k == "R"])


def _plain_reduction_extents(sch: Schedule, block: SBlockRV) -> tuple[int, int] | None:
    """``(spatial extent, reduction extent)`` of a reduction block that multi-level tiling
    leaves alone, with trivial bindings, one write, constant extents and only spatial and
    reduction iterators; None for any other block."""
    if A.is_root(sch, block) or A.needs_multi_level_tiling(sch, block):
        return None
    if not A.is_reduction_block(sch, block) or not A.is_trivial_binding(sch, block):
        return None
    blk = sch.get(block)
    if len(blk.writes) != 1:
        return None
    types = A.iter_types(sch, block)
    if any(t not in (A.DATA_PAR, A.COMM_REDUCE) for t in types):
        return None
    extents = [A._const_int(iv.dom.extent) for iv in blk.iter_vars]
    if any(e is None for e in extents):
        return None
    spatial = reduce = 1
    for t, e in zip(types, extents):
        if t == A.DATA_PAR:
            spatial *= e
        else:
            reduce *= e
    return spatial, reduce


def reduces_across_rows(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` reads its input along a spatial loop and across its reduction
    loops: a mean over the height and width of an NHWC tensor, a sum over a matrix's rows.
    Reduction loops innermost then read one element per cache line."""
    loops = A.loops_of(sch, block)
    try:
        strides = A.loop_strides(sch, block, loops)
    except Exception:  # noqa: BLE001 - accesses not analysable: not this case
        return False
    if not strides:
        return False
    kinds = [A.loop_iter_type(sch, lp) for lp in loops]
    n_reads = len(sch.get(block).reads)
    for per_loop in strides[:n_reads]:
        if any(s is None for s in per_loop):
            return False
        reduce_moves = [s for s, k in zip(per_loop, kinds) if k == "R" and s != 0]
        if any(s == 1 for s, k in zip(per_loop, kinds) if k == "S") and reduce_moves \
                and all(s > 1 for s in reduce_moves):
            return True
    return False
