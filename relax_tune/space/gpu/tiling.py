"""Multi-level tiling of reduction blocks for GPUs: structure "SSSRRSRS" with the three
outer spatial levels bound to blockIdx / vthread / threadIdx, inputs staged in shared
memory by a cooperative fetch, and the result accumulated in registers ("local")."""

from __future__ import annotations

import logging

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .. import analysis as A
from ..params import ANN_TILED, dtype_bytes
from ..rule import ScheduleRule
from .params import ANN_COOPERATIVE_FETCH, GPUParams

logger = logging.getLogger("relax_tune.space.gpu")

THREAD_TAGS = ("blockIdx.x", "vthread.x", "threadIdx.x")
"""What the first three spatial tile levels are bound to, outermost first."""


def is_thread_bound(sch: Schedule, block: SBlockRV) -> bool:
    """Whether some loop around ``block`` is bound to a GPU thread axis."""
    return any(A.loop_kind(sch, loop) == A.FOR_THREAD_BINDING for loop in sch.get_loops(block))


class MultiLevelTilingGPU(ScheduleRule):
    """Tile a reduction block worth tiling (MetaSchedule's criterion, as on CPU) into the
    levels of ``structure`` ("S" spatial, "R" reduction; default "SSSRRSRS"), then:

    - fuse the loops of the first three spatial levels and bind them to blockIdx.x,
      vthread.x and threadIdx.x;
    - stage every input in shared memory at the first reduction level; the copy loop is
      annotated for a cooperative fetch with a sampled vector length (completed by
      :class:`RewriteCooperativeFetch`);
    - accumulate in a "local" write cache placed under the threadIdx loop, into which an
      elementwise consumer (bias add, ReLU) is inlined when it can be.

    Tile sizes: for "SSSRRSRS" every inner level is drawn, innermost first, as a factor of
    what is left of the loop with a cap (see :meth:`_caps`): per-axis shares of the
    virtual-thread and thread limits, ``register_tile`` for the two register levels,
    ``reduction_tile`` for the two inner reduction levels; the outer level takes the rest.
    Other structures use one ``sample_perfect_tile`` per loop. The threads, shared memory
    and registers a sample needs are checked afterwards (:class:`VerifyGPUCode`); invalid
    samples are redrawn by the search.

    Args:
        params: the target's GPU limits.
        structure: the tile levels; it must start with "SSS" (the bound levels).
        shared_fetch: stage the inputs in shared memory.
    """

    name = "multi_level_tiling_gpu"

    def __init__(self, params: GPUParams, structure: str = "SSSRRSRS",
                 shared_fetch: bool = True) -> None:
        if not structure.startswith("SSS") or set(structure) - {"S", "R"}:
            raise ValueError(f"bad GPU tiling structure {structure!r}: it must start with "
                             "'SSS' (blockIdx, vthread, threadIdx) and use letters S and R")
        self.params = params
        self.structure = structure
        self.shared_fetch = shared_fetch
        self.s_levels = [i for i, c in enumerate(structure) if c == "S"]
        self.r_levels = [i for i, c in enumerate(structure) if c == "R"]

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Tile, bind and stage ``block`` when it needs it; returns ``[sch]``."""
        if not A.needs_multi_level_tiling(sch, block) or is_thread_bound(sch, block):
            return [sch]
        loops = sch.get_loops(block)
        types = A.iter_types(sch, block)
        if len(loops) != len(types) or any(t not in (A.DATA_PAR, A.COMM_REDUCE) for t in types):
            return [sch]
        extents = [A.loop_extent(sch, lp) for lp in loops]
        if any(e is None for e in extents):
            return [sch]
        if not any(t == A.DATA_PAR and e > 1 for t, e in zip(types, extents)):
            return [sch]  # nothing to spread over threads: cross-thread reduction's job
        name = sch.get(block).name_hint
        trial = sch.copy()
        try:
            self._schedule(trial, trial.get_sblock(name), types, extents)
        except Exception as err:  # a primitive refused: keep the block as it is
            logger.debug("cannot tile %s for the GPU: %s", name, err)
            return [sch]
        logger.debug("tiled %s (%s) for the GPU", name, self.structure)
        return [trial]

    def _schedule(self, sch: Schedule, block: SBlockRV, types: list[int],
                  extents: list[int]) -> None:
        tiles = self._tile(sch, block, types, extents)
        bound: list[LoopRV] = []
        for level, tag in zip(self.s_levels[:3], THREAD_TAGS):
            loops = tiles[level]
            loop = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            sch.bind(loop, tag)
            bound.append(loop)
        first_r = tiles[self.r_levels[0]] if self.r_levels else []
        self._local_accumulation(sch, block, bound[-1])
        if self.shared_fetch and first_r:
            self._shared_fetch(sch, block, first_r[-1])
        sch.annotate(block, ANN_TILED, self.structure)

    def _tile(self, sch: Schedule, block: SBlockRV, types: list[int],
              extents: list[int]) -> list[list[LoopRV]]:
        tiles: list[list[LoopRV]] = [[] for _ in self.structure]
        n_spatial = sum(1 for t, e in zip(types, extents) if t == A.DATA_PAR and e > 1)
        caps = self._caps(max(1, n_spatial))
        for loop, kind, extent in zip(sch.get_loops(block), types, extents):
            levels = self.s_levels if kind == A.DATA_PAR else self.r_levels
            if extent == 1 or len(levels) == 1:
                tiles[levels[0]].append(loop)
                continue
            if self.structure == "SSSRRSRS":
                parts = self._split_nested(sch, loop, caps if kind == A.DATA_PAR
                                           else self._reduction_caps())
            else:
                factors = sch.sample_perfect_tile(
                    loop, n=len(levels), max_innermost_factor=self.params.max_innermost_factor)
                parts = list(sch.split(loop, factors))
            for lvl, part in zip(levels, parts):
                tiles[lvl].append(part)
        for level in self.s_levels[:3]:
            if not tiles[level]:
                raise ValueError("no spatial loop to bind")
        sch.reorder(*[lp for level in tiles for lp in level])
        return tiles

    def _caps(self, n_spatial: int) -> list[int]:
        """Per-axis caps of the spatial levels below blockIdx: [vthread, threadIdx, outer
        register tile, inner register tile], so that the products over the axes stay near
        the target's limits (virtual threads, threads per block) and the registers."""
        def root(limit: int) -> int:
            return max(1, 1 << (int(limit).bit_length() - 1) // n_spatial)

        return [root(self.params.max_vthread), root(self.params.max_threads_per_block),
                self.params.register_tile, self.params.register_tile]

    def _reduction_caps(self) -> list[int]:
        """Caps of the two inner reduction levels (their product is the depth of the
        shared-memory tile)."""
        return [self.params.reduction_tile, self.params.reduction_tile]

    @staticmethod
    def _split_nested(sch: Schedule, loop: LoopRV, caps: list[int]) -> list[LoopRV]:
        """Split ``loop`` into ``len(caps) + 1`` levels, innermost first: each level is an
        innermost factor at most its cap drawn by a two-way ``sample_perfect_tile`` of what
        is left, and the outermost level takes the rest. Unlike one many-way perfect tile,
        this bounds every inner level, so large loops still give valid GPU tiles."""
        parts: list[LoopRV] = []
        rest = loop
        for cap in reversed(caps):
            factors = sch.sample_perfect_tile(rest, n=2, max_innermost_factor=max(1, cap))
            rest, inner = sch.split(rest, factors)
            parts.insert(0, inner)
        parts.insert(0, rest)
        return parts

    @staticmethod
    def _local_accumulation(sch: Schedule, block: SBlockRV, thread_loop: LoopRV) -> None:
        consumers = sch.get_consumers(block)
        epilogue = (consumers[0] if len(consumers) == 1
                    and A.is_elementwise_consumer(sch, block, consumers[0]) else None)
        cache = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(cache, thread_loop, preserve_unit_loops=True)
        if epilogue is None:
            return
        for how in ("inline", "compute_at"):
            trial = sch.copy()
            try:
                if how == "inline":
                    trial.reverse_compute_inline(epilogue)
                else:
                    trial.reverse_compute_at(epilogue, thread_loop, preserve_unit_loops=True)
            except Exception as err:  # ScheduleError: try the next way
                logger.debug("cannot %s the epilogue: %s", how, err)
                continue
            # replay the successful primitive on the real schedule (keeps one trace)
            if how == "inline":
                sch.reverse_compute_inline(epilogue)
            else:
                sch.reverse_compute_at(epilogue, thread_loop, preserve_unit_loops=True)
            return

    def _shared_fetch(self, sch: Schedule, block: SBlockRV, r_loop: LoopRV) -> None:
        n_reads = len(sch.get(block).reads)
        caches = []
        for i in range(n_reads):
            buf = sch.get(block).reads[i].source
            if buf.same_as(sch.get(block).writes[0].source):
                continue
            caches.append((sch.cache_read(block, i, "shared"), str(buf.dtype)))
        for cache, dtype in caches:
            sch.compute_at(cache, r_loop, preserve_unit_loops=True)
            inner = sch.get_loops(cache)[_depth(sch, r_loop):]
            if not inner:
                continue
            fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
            lens = [v for v in self.params.vector_load_lens
                    if v * dtype_bytes(dtype) <= self.params.max_vector_bytes] or [1]
            vec = sch.sample_categorical(lens, [1.0 / len(lens)] * len(lens))
            sch.annotate(fused, ANN_COOPERATIVE_FETCH, vec)


def _depth(sch: Schedule, loop: LoopRV) -> int:
    """How many loops enclose ``loop``, itself included."""
    depth = 1
    sref = sch.get_sref(loop).parent
    while sref is not None:
        if isinstance(sref.stmt, tirx.For):
            depth += 1
        sref = sref.parent
    return depth
