"""rfactor of reductions whose spatial extent is too small to keep the cores busy (a full sum,
a softmax over few rows): part of the reduction becomes a spatial, parallel axis."""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..params import TargetParams
from ..rule import ScheduleRule

logger = logging.getLogger(__name__)


class AddRFactor(ScheduleRule):
    """For a reduction block that multi-level tiling leaves alone and whose spatial extent is
    at most the target's parallel budget and below its reduction extent: move the reduction
    loops innermost, fuse them, split the fused loop in two with ``sample_perfect_tile`` and
    offer one sketch with ``rfactor`` at each of the two parts, besides the block unchanged.

    Args:
        params: the target's parameters (the parallel budget).
        max_innermost_factor: largest inner part of the split reduction loop.
    """

    name = "add_rfactor"

    def __init__(self, params: TargetParams, max_innermost_factor: int = 64) -> None:
        self.params = params
        self.max_innermost_factor = max_innermost_factor

    def needs_rfactor(self, sch: Schedule, block: SBlockRV) -> bool:
        """Whether ``block`` is a plain reduction with too little spatial work to parallelise."""
        if A.is_root(sch, block) or A.needs_multi_level_tiling(sch, block):
            return False
        if not A.is_reduction_block(sch, block) or not A.is_trivial_binding(sch, block):
            return False
        blk = sch.get(block)
        if len(blk.writes) != 1:
            return False
        types = A.iter_types(sch, block)
        if any(t not in (A.DATA_PAR, A.COMM_REDUCE) for t in types):
            return False
        extents = [A._const_int(iv.dom.extent) for iv in blk.iter_vars]
        if any(e is None for e in extents):
            return False
        spatial = reduce = 1
        for t, e in zip(types, extents):
            if t == A.DATA_PAR:
                spatial *= e
            else:
                reduce *= e
        return spatial <= self.params.max_parallel_extent and reduce > max(spatial, 1) \
            and reduce >= 2 * self.params.num_cores

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """``[sch]`` plus up to two rfactor sketches."""
        if not self.needs_rfactor(sch, block):
            return [sch]
        name = sch.get(block).name_hint
        base = sch.copy()
        try:
            loops = base.get_loops(block)
            kinds = [A.loop_iter_type(base, lp) for lp in loops]
            if any(k not in ("S", "R") for k in kinds):
                return [sch]
            spatial = [lp for lp, k in zip(loops, kinds) if k == "S"]
            reduce = [lp for lp, k in zip(loops, kinds) if k == "R"]
            if kinds != ["S"] * len(spatial) + ["R"] * len(reduce):
                base.reorder(*spatial, *reduce)
            fused = base.fuse(*reduce) if len(reduce) > 1 else reduce[0]
            factors = base.sample_perfect_tile(fused, n=2,
                                               max_innermost_factor=self.max_innermost_factor)
            parts = base.split(fused, factors)
        except Exception as err:  # a primitive refused: keep the block as it is
            logger.debug("cannot prepare %s for rfactor: %s", name, err)
            return [sch]
        results = [sch]
        for part in parts:
            trial = base.copy()
            try:
                trial.rfactor(part, factor_axis=len(spatial))
                results.append(trial)
            except Exception as err:
                logger.debug("cannot rfactor %s: %s", name, err)
        logger.debug("rfactor of %s: %d sketches", name, len(results))
        return results
