"""Parallelise outer loops, vectorise inner loops and unroll with a sampled step.

The rule only records intent on the root block (the budget for parallel jobs and vector
width, and a sampled ``pragma_auto_unroll_max_step``); the postprocessor, run on each
sampled candidate, reads those annotations and rewrites the concrete loop nest, whose
extents depend on the sampled tiles. Both run at trace level, so a candidate's trace
replays to the same program (``tvm.compile`` ignores block annotations, hence the rewrite).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from . import analysis as A
from .params import ANN_PARALLEL, ANN_UNROLL, ANN_VECTORIZE, TargetParams, dtype_bytes
from .rule import Postproc, ScheduleRule

logger = logging.getLogger("relax_tune.space")


class ParallelVectorizeUnroll(ScheduleRule):
    """On the root block: annotate the parallel budget (cores x jobs per core, sampled with
    ``sample_categorical`` among ``jobs_per_core_choices``), the vector budget (bytes;
    sampled among ``spatial_vectorize_bytes_choices`` when the function has no reduction) and,
    when the function has a reduction, a ``sample_categorical`` over
    ``unroll_max_steps`` (uniform). Other blocks are left alone."""

    name = "parallel_vectorize_unroll"

    def __init__(self, params: TargetParams, parallel: bool = True, vectorize: bool = True,
                 unroll: bool = True) -> None:
        self.params = params
        self.parallel = parallel
        self.vectorize = vectorize
        self.unroll = unroll

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Annotate ``block`` if it is the root block; returns ``[sch]``."""
        if not A.is_root(sch, block):
            return [sch]
        if self.parallel and self.params.max_parallel_extent > 1:
            choices = self.params.parallel_extent_choices
            if len(choices) > 1:
                budget = sch.sample_categorical(choices, [1.0 / len(choices)] * len(choices))
                sch.annotate(block, ANN_PARALLEL, budget)
            else:
                sch.annotate(block, ANN_PARALLEL, int(choices[0]))
        has_reduction = _has_reduction(sch)
        if self.vectorize and self.params.max_vectorize_bytes > 1:
            widths = self.params.spatial_vectorize_bytes_choices
            if has_reduction or len(widths) == 1:
                sch.annotate(block, ANN_VECTORIZE, int(self.params.max_vectorize_bytes))
            else:
                width = sch.sample_categorical(widths, [1.0 / len(widths)] * len(widths))
                sch.annotate(block, ANN_VECTORIZE, width)
        steps = [int(s) for s in self.params.unroll_max_steps]
        if self.unroll and steps and any(s > 0 for s in steps) and has_reduction:
            if len(steps) == 1:
                sch.annotate(block, ANN_UNROLL, steps[0])
            else:
                step = sch.sample_categorical(steps, [1.0 / len(steps)] * len(steps))
                sch.annotate(block, ANN_UNROLL, step)
        return [sch]


def _has_reduction(sch: Schedule) -> bool:
    """Whether any block of the function has a non-spatial iter var (read from the IR, so
    nothing is added to the trace)."""
    found = []

    def on_block(blk) -> None:
        if any(int(iv.iter_type) != A.DATA_PAR for iv in blk.iter_vars):
            found.append(blk)

    tvm_ffi.structural_walk(sch.mod[A.func_name_of(sch)].body, [(tvm.s_tir.SBlock, on_block)])
    return bool(found)


def _vector_reach(infos: list, max_extent: int) -> tuple[int, bool]:
    """How many innermost loops of ``infos`` may form one vector loop of at most
    ``max_extent`` lanes (free spatial loops of known extent, each its parent's only child),
    and whether the innermost alone, such a loop, is wider than that (then it is split)."""
    reach, prod = 0, 1
    for info in reversed(infos):
        if not info.free or info.iter_type != "S" or not info.single_child \
                or info.extent is None:
            break
        if prod * info.extent > max_extent:
            return reach, reach == 0
        prod *= info.extent
        reach += 1
    return reach, False


def _reads_by_data(sch: Schedule, block: SBlockRV) -> bool:
    """Whether the block body loads an element at an index read from a buffer (a gather,
    such as an int8 table lookup fused into the kernel)."""
    found = []
    load_type = tvm.ir.expr.TensorLoad  # what ``tirx.BufferLoad`` makes in this TVM

    def on_load(load: Any) -> None:
        for index in load.indices:
            if not found:
                tvm_ffi.structural_walk(index, [(load_type, lambda _: found.append(True))])

    tvm_ffi.structural_walk(A.node(sch, block).body, [(load_type, on_load)])
    return bool(found)


def _ann_int(annotations, key: str) -> int | None:
    if key not in annotations:
        return None
    try:
        return int(annotations[key])
    except (TypeError, ValueError):
        try:
            return int(annotations[key].value)
        except Exception:
            return None


class RewriteParallelVectorizeUnroll(Postproc):
    """Turn the root annotations of :class:`ParallelVectorizeUnroll` into loop kinds, for
    every block directly under the root:

    - vectorise: fuse the innermost free spatial loops whose accesses stay linear, while the
      product fits the vector budget; an innermost loop that alone exceeds it is split by
      its largest divisor that fits (preferring multiples of the lanes) when all accesses
      are contiguous along it;
    - parallelise: fuse the outermost free spatial loops until the parallel budget is
      reached (or a loop has several children), and mark the fused loop parallel;
    - unroll: for blocks with a reduction, annotate the outermost loop with
      ``pragma_auto_unroll_max_step`` and ``pragma_unroll_explicit``.
    """

    name = "rewrite_parallel_vectorize_unroll"

    def __init__(self, params: TargetParams, unroll_explicit: bool = True) -> None:
        self.params = params
        self.unroll_explicit = unroll_explicit

    def apply(self, sch: Schedule) -> bool:
        """Rewrite ``sch``; False when a primitive refused (the candidate is dropped)."""
        name = A.func_name_of(sch)
        body = sch.mod[name].body
        if not isinstance(body, tvm.s_tir.SBlockRealize):
            return True
        anns = body.block.annotations
        if not any(key in anns for key in (ANN_PARALLEL, ANN_VECTORIZE, ANN_UNROLL)):
            return True
        root = sch.get_sblock(str(body.block.name_hint), name)
        max_par = _ann_int(anns, ANN_PARALLEL)
        max_vec_bytes = _ann_int(anns, ANN_VECTORIZE)
        unroll = _ann_int(anns, ANN_UNROLL)
        if max_par is None and max_vec_bytes is None and unroll is None:
            return True
        for key, value in ((ANN_PARALLEL, max_par), (ANN_VECTORIZE, max_vec_bytes),
                           (ANN_UNROLL, unroll)):
            if value is not None:
                sch.unannotate(root, key)
        for block in A.child_blocks(sch, root):
            loops = list(A.loops_of(sch, block))
            if not loops:
                continue
            if max_vec_bytes:
                loops = self._vectorize(sch, block, loops, max_vec_bytes)
            if max_par and max_par > 1:
                loops = self._parallelize(sch, block, loops, max_par)
            if unroll and unroll > 0:
                self._unroll(sch, block, loops, unroll)
        return True

    # -- vectorise ------------------------------------------------------------------------

    def _vectorize(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV],
                   max_vec_bytes: int) -> list[LoopRV]:
        dtype = A.write_dtype(sch, block)
        max_extent = max(1, max_vec_bytes // dtype_bytes(dtype))
        if max_extent <= 1:
            return loops
        lanes = self.params.lanes(dtype)
        if _reads_by_data(sch, block):
            # a gather is one load per lane: wider than a register of indices it gains
            # nothing, and LLVM took 2.5 s to compile one 256-lane table lookup
            max_extent = min(max_extent, self.params.lanes("int32"))
            if max_extent <= 1:
                return loops
        infos = A.loop_infos(sch, loops)
        reach, too_big = _vector_reach(infos, max_extent)
        if not reach and not too_big:
            return loops
        # only the loops the vector loop can take are analysed (a loop's strides do not
        # depend on the loops outside it): a tiled nest's other loops cost as much again
        n = max(1, reach)
        fusible = A.vectorizable_suffix(sch, block, loops[-n:], [i.extent for i in infos[-n:]])
        if too_big and fusible:
            return self._split_vectorize(sch, block, loops, infos[-1].extent, max_extent, lanes)
        chosen = list(range(len(loops) - min(reach, fusible), len(loops)))
        if not chosen or math.prod(infos[i].extent for i in chosen) <= 1:
            return loops
        if len(chosen) > 1:
            fused = sch.fuse(*[loops[i] for i in chosen])
        else:
            fused = loops[chosen[0]]
        sch.vectorize(fused)
        return loops[:chosen[0]] + [fused]

    def _split_vectorize(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV],
                         extent: int | None, max_extent: int, lanes: int) -> list[LoopRV]:
        if extent is None or not A.is_contiguous_innermost(sch, block, loops):
            return loops
        divisors = [d for d in range(2, max_extent + 1) if extent % d == 0]
        if not divisors:
            return loops
        multiples = [d for d in divisors if d % lanes == 0]
        # Without a multiple of the lanes, at most one register: an odd width such as 29
        # lanes compiles slowly (LLVM legalises it piece by piece) into poor code.
        factor = max(multiples) if multiples else max([d for d in divisors if d <= lanes],
                                                      default=1)
        if factor < min(lanes, 4):
            return loops
        outer, vec = sch.split(loops[-1], [None, factor])
        sch.vectorize(vec)
        return loops[:-1] + [outer, vec]

    # -- parallelise ----------------------------------------------------------------------

    def _parallelize(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV],
                     max_par: int) -> list[LoopRV]:
        chosen: list[int] = []
        prod = 1
        for i, info in enumerate(A.loop_infos(sch, loops)):
            if not info.free or info.iter_type != "S" or info.extent is None:
                break
            chosen.append(i)
            prod *= info.extent
            if prod >= max_par or not info.single_child:
                break
        if not chosen or prod <= 1:
            return loops
        fused = sch.fuse(*[loops[i] for i in chosen]) if len(chosen) > 1 else loops[chosen[0]]
        sch.parallel(fused)
        return [fused] + loops[chosen[-1] + 1:]

    # -- unroll ---------------------------------------------------------------------------

    def _unroll(self, sch: Schedule, block: SBlockRV, loops: list[LoopRV], step: int) -> None:
        if A.is_spatial(sch, block):
            return
        outer = loops[0]
        node = A.node(sch, outer)
        if int(node.kind) in (A.FOR_VECTORIZED, A.FOR_THREAD_BINDING):
            return
        if "pragma_auto_unroll_max_step" in node.annotations:
            return
        sch.annotate(outer, "pragma_auto_unroll_max_step", _unroll_step(sch, loops, step))
        sch.annotate(outer, "pragma_unroll_explicit", int(self.unroll_explicit))


MAX_FULL_UNROLL = 256
"""Most iterations a whole loop nest may be unrolled into. Unrolled past that (a small
reduction whose every loop fits under a 512 step: 512 copies of a 32-lane FMA), LLVM's
compile time explodes (docs/design/cpu-space-limits.md)."""


def _unroll_step(sch: Schedule, loops: list[LoopRV], step: int) -> int:
    """``step``, lowered to ``MAX_FULL_UNROLL`` when the serial loops under the outer one
    would all be unrolled into more iterations than that."""
    trips = 1
    for loop in loops[1:]:
        node = A.node(sch, loop)
        extent = A._const_int(node.extent)
        if extent is None:
            return int(step)
        if int(node.kind) != A.FOR_VECTORIZED:
            trips *= extent
    return MAX_FULL_UNROLL if MAX_FULL_UNROLL < trips <= step else int(step)

