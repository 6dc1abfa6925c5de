"""Binding of what the other GPU rules left unbound (elementwise blocks, transposes, pads,
reductions not worth tiling) to blockIdx.x / threadIdx.x."""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .. import analysis as A
from ..rule import Postproc, ScheduleRule
from .params import GPUParams
from .tiling import is_thread_bound

logger = logging.getLogger("relax_tune.space.gpu")


def _outer_spatial(sch: Schedule, block: SBlockRV) -> tuple[list[LoopRV], int]:
    """The outermost run of free spatial loops around ``block`` and their extent product."""
    out: list[LoopRV] = []
    extent = 1
    for loop in sch.get_loops(block):
        e = A.loop_extent(sch, loop)
        if e is None or A.loop_iter_type(sch, loop) != "S" or not A.loop_is_free(sch, loop):
            break
        out.append(loop)
        extent *= e
        if not A.loop_has_single_child(sch, loop):
            break
    return out, extent


def bind_block(sch: Schedule, block: SBlockRV, threads) -> None:
    """Fuse the outer spatial loops of ``block``, split them by ``threads`` (an int or a
    sampled ExprRV) and bind the parts to blockIdx.x and threadIdx.x; a block without such
    loops gets a unit loop bound to blockIdx.x."""
    loops, _ = _outer_spatial(sch, block)
    if not loops:
        sch.bind(sch.add_unit_loop(block), "blockIdx.x")
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, inner = sch.split(fused, [None, threads])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")


def _needs_binding(sch: Schedule, block: SBlockRV) -> bool:
    return not A.is_root(sch, block) and not is_thread_bound(sch, block)


class AutoBind(ScheduleRule):
    """Bind each block not yet bound to a thread (and not nested in a bound loop nest) with
    a sampled number of threads per block, at most the spatial extent rounded up to a power
    of two."""

    name = "auto_bind"

    def __init__(self, params: GPUParams) -> None:
        self.params = params

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Bind ``block`` if it is unbound; returns ``[sch]``."""
        if not _needs_binding(sch, block):
            return [sch]
        _, extent = _outer_spatial(sch, block)
        cap = min(self.params.max_threads_per_block, 1 << max(0, (extent - 1).bit_length()))
        counts = [t for t in self.params.bind_threads if t <= cap] or [min(cap, self.params.warp_size)]
        name = sch.get(block).name_hint
        trial = sch.copy()
        try:
            blk = trial.get_sblock(name)
            threads = (counts[0] if len(counts) == 1 else
                       trial.sample_categorical(counts, [1.0 / len(counts)] * len(counts)))
            bind_block(trial, blk, threads)
        except Exception as err:  # leave it to RewriteUnboundBlock
            logger.debug("cannot bind %s: %s", name, err)
            return [sch]
        return [trial]


class RewriteUnboundBlock(Postproc):
    """Bind every block still without a thread binding (``threads`` threads per block, or
    fewer for a small loop nest), so that every candidate is a valid GPU kernel."""

    name = "rewrite_unbound_block"

    def __init__(self, params: GPUParams, threads: int = 256) -> None:
        self.params = params
        self.threads = min(threads, params.max_threads_per_block)

    def apply(self, sch: Schedule) -> bool:
        """Bind the unbound blocks; False when one cannot be bound."""
        for block in A.collect_blocks(sch):
            if not A.block_exists(sch, block) or not _needs_binding(sch, block):
                continue
            _, extent = _outer_spatial(sch, block)
            threads = max(1, min(self.threads, 1 << max(0, (extent - 1).bit_length())))
            bind_block(sch, block, threads)
        return True
