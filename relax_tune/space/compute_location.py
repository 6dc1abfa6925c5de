"""Random compute location: blocks that no other rule placed get a sampled loop of their
consumer to be computed at (``sample_compute_location`` + ``compute_at``)."""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV
from tvm.s_tir.schedule.analysis import is_output_block

from . import analysis as A
from .params import ANN_TILED
from .rule import ScheduleRule

logger = logging.getLogger("relax_tune.space")


class RandomComputeLocation(ScheduleRule):
    """For a block directly under the root, on loops of its own, trivially bound, not tiled,
    not an output and with consumers: ``loc = sample_compute_location(block)`` then
    ``compute_at(block, loc)``. The decision ranges over the legal locations TVM collects
    (-1 keeps the block where it is, -2 inlines it), so every draw is valid."""

    name = "random_compute_location"

    def applicable(self, sch: Schedule, block: SBlockRV) -> bool:
        """Whether ``block`` is one this rule may move."""
        if A.is_root(sch, block):
            return False
        blk = sch.get(block)
        if ANN_TILED in blk.annotations or not A.is_trivial_binding(sch, block):
            return False
        # Look on a copy: getters are traced, and a GetLoops whose output count depends on
        # an earlier sampled location would make the sketch fail to replay.
        probe = sch.copy()
        try:
            if is_output_block(probe, block) or len(probe.get_consumers(block)) == 0:
                return False
            loops = probe.get_loops(block)
        except Exception:
            return False
        if not loops:
            return False
        # its loops must be its own: a block already computed at another one stays there
        return all(A.loop_has_single_child(probe, lp) for lp in loops)

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Move ``block`` to a sampled location; ``[sch]``."""
        if not self.applicable(sch, block):
            return [sch]
        trial = sch.copy()
        try:
            loc = trial.sample_compute_location(block)
            trial.compute_at(block, loc, preserve_unit_loops=True)
        except Exception as err:
            logger.debug("no random compute location for %s: %s", sch.get(block).name_hint, err)
            return [sch]
        return [trial]
