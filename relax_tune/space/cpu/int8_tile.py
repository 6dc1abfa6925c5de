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
