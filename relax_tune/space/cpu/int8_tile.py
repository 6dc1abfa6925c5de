"""What the int8 sketches (``int8_dot``'s ``vpdpbusd``/``vpmaddwd`` one, ``amx_tiles``'s)
share: a convolution's output rows partly inside the parallel job (``rows_into_jobs``), and
once their loops are ordered, the accumulator tile in a tile-sized buffer written back
(with the epilogue, inlined later) per tile, the outer tiles as parallel jobs, and the
weight packed in the layout the instruction reads, in a layout-rewrite block (folded at
compile time with ``cpu_weight_prepack``, else run once per call)."""

from __future__ import annotations

from typing import Callable

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .. import analysis as A
from .layout_rewrite import PREPROC_ANNOTATION


def rows_into_jobs(sch: Schedule, outer: list[LoopRV], most: int
                   ) -> tuple[list[LoopRV], list[LoopRV]]:
    """Split the last of ``outer`` (a convolution's output rows; a matmul has none) in two,
    the inner part's extent sampled up to ``most``: ``(outer with the outer part, [the inner
    part])`` (``(outer, [])`` when there is no such loop of more than one iteration). The
    sketch puts the inner part inside the parallel job, under its channel tiles, so that a
    job reads its weights once for all its rows (a 7x7 layer's job was one row, and its 2.4
    MB of weights were streamed once per row)."""
    if not outer or int(sch.get(outer[-1]).extent) <= 1:
        return outer, []
    rows_out, rows_in = sch.split(outer[-1], sch.sample_perfect_tile(
        outer[-1], n=2, max_innermost_factor=most))
    return [*outer[:-1], rows_out], [rows_in]


def write_back_and_pack(sch: Schedule, main: SBlockRV, tile_loop: LoopRV,
                        job_loops: list[LoopRV], weight_read: int,
                        packed: Callable) -> tuple[SBlockRV, SBlockRV]:
    """Write ``main``'s output through a buffer written back under ``tile_loop``, fuse
    ``job_loops`` into one parallel loop (before tensorizing: a tensorized block is no
    longer a plain reduction), and pack ``main``'s read ``weight_read`` by the index map
    ``packed``. Returns the write-back block and the packing block."""
    back = sch.cache_write(main, 0, "global")
    sch.reverse_compute_at(back, tile_loop, preserve_unit_loops=True)
    sch.parallel(sch.fuse(*job_loops))
    packer = sch.cache_read(main, weight_read, "global")
    sch.transform_layout(main, ("read", weight_read), packed)
    sch.annotate(packer, PREPROC_ANNOTATION, True)
    return back, packer


def padding_block_name(sch: Schedule, main_name: str) -> str:
    """The name of the block that writes the reduction's input with an ``if_then_else``
    (the convolution's own zero padding, from ``lowering.int8``), or ``""``."""
    for block in sch.get_producers(sch.get_sblock(main_name)):
        if A.has_if_then_else(sch, block) and not sch.get_producers(block):
            return str(A.node(sch, block).name_hint)
    return ""


def pad_in_jobs(sch: Schedule, pad_name: str, job_loop: LoopRV) -> None:
    """Compute the padding block ``pad_name`` (``padding_block_name``; nothing for ``""``)
    in each parallel job (under ``job_loop``) for the part of the input that job reads,
    its channels vectorised: the input is read where it is used, with no padded copy of
    the whole input written and read back (ResNet-18 int8's 16 pad kernels took 7% of the
    model)."""
    if not pad_name:
        return
    pad = sch.get_sblock(pad_name)
    sch.compute_at(pad, job_loop, preserve_unit_loops=True)
    sch.vectorize(A.loops_of(sch, pad)[-1])
