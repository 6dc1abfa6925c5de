"""Random compute location: blocks that no other rule placed get a sampled loop of their
consumer to be computed at (``sample_compute_location`` + ``compute_at``); a tiled block's
padding is not left in a pass of its own (``PadInsideTiles``)."""

from __future__ import annotations

import logging

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize, Schedule
from tvm.s_tir.schedule import SBlockRV
from tvm.s_tir.schedule.analysis import is_output_block

from . import analysis as A
from .params import ANN_TILED
from .rule import Postproc, ScheduleRule


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


class PadInsideTiles(Postproc):
    """Reject a candidate whose sampled compute location left a tiled block's padding in a
    pass of its own at the root: a loop nest that copies the whole input into a padded
    buffer, which the tiled block then reads back. Timed alone the two passes cost what the
    pad computed inside the block's tiles costs (its input stays in cache between them); in
    a model, the input comes from the layer before, and the extra pass over it is paid in
    full. MobileNetV2's 56x56x144 depthwise convolution, timed right after the 1x1
    convolution that produces its input: 400 us with its pad at the root, 327 us with the
    pad computed at its parallel loop, alone 324 and 318 us (AMD EPYC Zen 1, 2 threads,
    docs/results/zen1-epyc.md, session 36). Only a pad whose location the sketch samples
    (``RandomComputeLocation``): one a rule placed at the root on purpose stays."""

    name = "pad_inside_tiles"

    def apply(self, sch: Schedule) -> bool:
        """False for a candidate with a tiled block's pad at the root (see the class). No
        ``precheck`` of its own: as the first CPU postprocessor it runs before the expensive
        ones anyway, and a precheck would do the same walk twice a replay."""
        pads = root_pads_of_tiled_blocks(sch.mod[A.func_name_of(sch)])
        # the IR first: reading the trace costs more, and most candidates have no such pad
        return not pads or not set(pads) & _sampled_blocks(sch)


def _sampled_blocks(sch: Schedule) -> set[str]:
    """Names of the blocks whose compute location the trace samples (a padded sketch's
    zero-padded copies, placed at the root by ``pad_einsum`` on purpose, are not)."""
    names = set()
    for inst in sch.trace.insts:
        if inst.kind.name == "SampleComputeLocation":
            try:
                names.add(str(sch.get(inst.inputs[0]).name_hint))
            except Exception:  # noqa: BLE001 - a block the schedule no longer has
                continue
    return names


def root_pads_of_tiled_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` that pad (a spatial block with an if-then-else, alone
    in a loop nest directly under the root block) the input of a tiled block (``ANN_TILED``)
    that lies in another loop nest. Reads the IR only (schedule queries would be traced)."""
    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    if root is None:
        return []
    body = root.body
    nests = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    blocks_of = [_blocks_in(nest) for nest in nests]
    pads = {}
    for i, blocks in enumerate(blocks_of):
        if len(blocks) == 1 and _pads(blocks[0]):
            pads[blocks[0].writes[0].source] = (i, blocks[0].name_hint)
    found = []
    for i, blocks in enumerate(blocks_of):
        for blk in blocks:
            if ANN_TILED not in blk.annotations:
                continue
            for read in blk.reads:
                where = pads.get(read.source)
                if where is not None and where[0] != i:
                    found.append(where[1])
    return found


def _blocks_in(stmt) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, [(SBlock, found.append)])
    return found


def _pads(blk) -> bool:
    """Whether ``blk`` copies a tensor with a condition: spatial, one write, a branch."""
    return (len(blk.writes) == 1 and all(int(iv.iter_type) == A.DATA_PAR for iv in blk.iter_vars)
            and bool(A.stmt_has_if_then_else(blk)))
