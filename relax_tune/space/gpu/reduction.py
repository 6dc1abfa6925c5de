"""Cross-thread reduction: the threads of a block cooperate on one reduction (softmax's max
and sum, layer_norm's mean and variance, row sums, matrix-vector products)."""

from __future__ import annotations

import logging
import math

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..rule import ScheduleRule
from .params import GPUParams
from .tiling import is_thread_bound

logger = logging.getLogger("relax_tune.space.gpu")


class CrossThreadReduction(ScheduleRule):
    """For a reduction block whose reduction is at least a warp long and at least as long as
    its spatial extent: fuse the spatial loops (bound to blockIdx.x) and the reduction loops,
    split the reduction by a sampled thread count (bound to threadIdx.x), so TVM lowers it
    to a warp/shared-memory all-reduce. Branches: the block as it was (for the other rules)
    and the cross-thread version.

    Args:
        params: the target's GPU limits (thread counts come from ``reduction_threads``).
    """

    name = "cross_thread_reduction"

    def __init__(self, params: GPUParams) -> None:
        self.params = params

    def applies(self, sch: Schedule, block: SBlockRV) -> bool:
        """Whether ``block`` is a reduction this rule should offer to spread over threads."""
        if A.is_root(sch, block) or sch.get(block).init is None or is_thread_bound(sch, block):
            return False
        loops = sch.get_loops(block)
        types = A.iter_types(sch, block)
        if len(loops) != len(types) or not A.is_trivial_binding(sch, block):
            return False
        if any(t not in (A.DATA_PAR, A.COMM_REDUCE) for t in types):
            return False
        extents = [A.loop_extent(sch, lp) for lp in loops]
        if any(e is None for e in extents):
            return False
        spatial = math.prod(e for e, t in zip(extents, types) if t == A.DATA_PAR)
        reduce = math.prod(e for e, t in zip(extents, types) if t == A.COMM_REDUCE)
        return reduce >= self.params.warp_size and reduce >= spatial

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """``[sch, cross-thread copy]`` when the rule applies, else ``[sch]``."""
        if not self.applies(sch, block):
            return [sch]
        name = sch.get(block).name_hint
        trial = sch.copy()
        try:
            self._schedule(trial, trial.get_sblock(name))
        except Exception as err:  # a primitive refused: keep only the original
            logger.debug("no cross-thread reduction for %s: %s", name, err)
            return [sch]
        return [sch, trial]

    def _schedule(self, sch: Schedule, block: SBlockRV) -> None:
        loops = sch.get_loops(block)
        types = A.iter_types(sch, block)
        s_loops = [lp for lp, t in zip(loops, types) if t == A.DATA_PAR]
        r_loops = [lp for lp, t in zip(loops, types) if t == A.COMM_REDUCE]
        reduce = math.prod(A.loop_extent(sch, lp) or 1 for lp in r_loops)
        sch.reorder(*s_loops, *r_loops)
        if s_loops:
            outer = sch.fuse(*s_loops) if len(s_loops) > 1 else s_loops[0]
        else:
            outer = sch.add_unit_loop(r_loops[0])
        sch.bind(outer, "blockIdx.x")
        fused = sch.fuse(*r_loops) if len(r_loops) > 1 else r_loops[0]
        cap = min(self.params.max_threads_per_block, 1 << max(0, (reduce - 1).bit_length()))
        counts = [t for t in self.params.reduction_threads if t <= cap] or [1]
        threads = sch.sample_categorical(counts, [1.0 / len(counts)] * len(counts))
        _, inner = sch.split(fused, [None, threads])
        sch.bind(inner, "threadIdx.x")
