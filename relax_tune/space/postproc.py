"""Postprocessors that do not belong to a single rule."""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from . import analysis as A
from .rule import Postproc

logger = logging.getLogger("relax_tune.space")


class RewriteReductionBlock(Postproc):
    """Move the init statement of every reduction block out of its reduction loops
    (``decompose_reduction`` at the outermost loop that is not purely spatial), so the
    reduction's inner loops carry no initialisation branch."""

    name = "rewrite_reduction_block"

    def apply(self, sch: Schedule) -> bool:
        """Decompose every reduction block that still has an init; always True unless a
        primitive raises."""
        for block in self._reduction_blocks(sch):
            loops = A.loops_of(sch, block)
            for loop in loops:
                if A.loop_iter_type(sch, loop) != "S":
                    sch.decompose_reduction(block, loop)
                    break
        return True

    @staticmethod
    def _reduction_blocks(sch: Schedule) -> list[SBlockRV]:
        return [b for b in A.collect_blocks(sch)
                if not A.is_root(sch, b) and A.node(sch, b).init is not None]
