"""The group axis of a grouped convolution made a block iter of its own, so that every index
of the block is linear in the iters the tiling splits.

TOPI's grouped convolution reads its input at ``ff // G * G + rc`` (``G`` channels a
group): not linear in ``ff``, so no analysis can prove a vector loop over the output
channels, and the postprocessor vectorises none (RegNetX's 14x14x160 grouped convolution
ran 840 us a call predicted, against 64 us tuned; AMD EPYC Zen 4, 2 threads). With ``ff``
remapped to ``(ff // G, ff % G)`` the index is ``(g * G + f) // G * G + rc``, which the
analyzer simplifies to ``g * G + rc`` under the iters' ranges (``analysis.loop_strides``).

The channel within the group is split only inside the tiles the epilogue may be computed
under (``ANN_WHOLE_LOOP``): a tile of part of it and of several groups writes channels
with gaps between them, and the epilogue computed under that tile took the bounding range
of channels, reading ones no job had written yet (6 of 11 random candidates of a 28x28x64
convolution of 8 groups were wrong; such a candidate is what the no-measurement compile
may choose, unchecked).
"""

from __future__ import annotations

import logging

import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..params import ANN_WHOLE_LOOP
from ..rule import ScheduleRule

logger = logging.getLogger(__name__)


class SplitGroupAxis(ScheduleRule):
    """For a trivially bound reduction block whose reads divide a spatial iter by a constant
    that divides its extent (``v // G``): remap that iter to two, ``v // G`` and ``v % G``
    (``transform_block_layout``, which takes a block alone in its loop nest: it runs first,
    before any rule has moved a block). Other blocks are left as they are."""

    name = "split_group_axis"

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """``[sch]``, with the block's grouped iter split in place when it has one."""
        found = _grouped_iter(sch, block)
        if found is None:
            return [sch]
        position, group = found

        def index_map(*ivs):
            return (*ivs[:position], ivs[position] // group, ivs[position] % group,
                    *ivs[position + 1:])

        trial = sch.copy()
        try:
            ivs = A.node(sch, block).iter_vars  # in their own dtype: no casts in the indices
            trial.transform_block_layout(block, tirx.IndexMap.from_func(
                index_map, ndim=len(ivs), index_dtype=str(ivs[position].var.ty)))
            trial.annotate(block, ANN_WHOLE_LOOP, position + 1)
        except Exception as err:  # noqa: BLE001 - a block the primitive refuses stays as it is
            logger.debug("cannot split the group axis: %s", err)
            return [sch]
        return [trial]


def _grouped_iter(sch: Schedule, block: SBlockRV) -> tuple[int, int] | None:
    """(position of the iter, group size) of the first spatial iter of ``block`` that a read
    index divides by a constant ``G`` with ``1 < G < extent`` and ``extent % G == 0``; None
    when there is none or the block is not a trivially bound reduction."""
    try:
        blk = A.node(sch, block)
        if A.is_spatial(sch, block) or not A.is_trivial_binding(sch, block):
            return None
    except Exception:  # noqa: BLE001 - not a block this rule reads
        return None
    divisors: list[tuple[tirx.Var, int]] = []

    def visit(expr) -> None:
        if isinstance(expr, tirx.FloorDiv) and isinstance(expr.a, tirx.Var) \
                and isinstance(expr.b, tirx.IntImm):
            divisors.append((expr.a, int(expr.b.value)))

    for region in blk.reads:
        for rng in region.region:
            tvm_ffi.structural_walk(rng.min, [(tirx.FloorDiv, visit)])
    for position, iv in enumerate(blk.iter_vars):
        group = next((g for var, g in divisors if var.same_as(iv.var)), None)
        extent = A._const_int(iv.dom.extent)
        if group is None or extent is None or int(iv.iter_type) != A.DATA_PAR:
            continue
        if 1 < group < extent and extent % group == 0:
            return position, group
    return None
