"""What the int8 sketches (``int8_dot``'s ``vpdpbusd``/``vpmaddwd`` one, ``amx_tiles``'s)
share once their loops are ordered: the accumulator tile in a tile-sized buffer written
back (with the epilogue, inlined later) per tile, the outer tiles as parallel jobs, and the
weight packed in the layout the instruction reads, in a layout-rewrite block (folded at
compile time with ``cpu_weight_prepack``, else run once per call)."""

from __future__ import annotations

from typing import Callable

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from .layout_rewrite import PREPROC_ANNOTATION


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
