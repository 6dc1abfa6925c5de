"""In-kernel packing of GEMM operands: a sketch may ask (a sampled choice) that an input its
tiled block reads with reuse, such as B of ``A @ B``, be copied at the start of every call
into the layout the tile loops walk it in, tile by tile.

Why: row-major B is read 16 floats at a time with a 4 KiB stride along k, so every B line
of a register tile's panel maps to the same L1 set and the panel cannot stay in L1. Packed
([N/16, K, 16] for a 16-wide tile), the panel is contiguous. The copy is part of the timed
kernel, so the search keeps it only where it pays (measured:
docs/design/weight-prepack.md).

Weights that are constant get the same layout for free at compile time (``RewriteLayout``,
``layout_free_buffers``); this covers operands that arrive at run time (activations,
weights the model does not mark constant).
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule

from .. import analysis as A
from .layout_rewrite import layout_free_buffers, pack_buffer
from ..params import ANN_PACK, TargetParams
from ..rule import Postproc

logger = logging.getLogger(__name__)


MIN_REUSE = 16
"""An operand is packed only if each element is read for at least this many outputs (the
extents of the spatial loops it is not indexed by): below that the copy costs about as
much as the reads it speeds up (a 1x784x256 dense reads each weight once)."""


def packable_reads(func: tirx.PrimFunc, blk: Any, min_reuse: int = MIN_REUSE) -> list[int]:
    """Indices into ``blk.reads`` of operands worth packing in the kernel: parameters of
    ``func`` (not written, not layout-free weights) indexed by plain block variables only,
    among them the innermost spatial one (the vectorised loop walks the operand), and
    reused across at least ``min_reuse`` outputs (spatial loops that do not index it)."""
    spatial = [iv for iv in blk.iter_vars
               if int(iv.iter_type) == A.DATA_PAR and A._const_int(iv.dom.extent) != 1]
    if not spatial:
        return []
    vec_var = spatial[-1].var
    params = list(func.params)
    skip = [r.source for r in blk.writes] + layout_free_buffers(func)
    out = []
    for index, region in enumerate(blk.reads):
        buf = region.source
        if not any(buf.same_as(p) for p in params) or any(buf.same_as(s) for s in skip):
            continue
        mins = [r.min for r in region.region]
        if not all(isinstance(m, tirx.Var) or A._const_int(m) is not None for m in mins):
            continue
        used = [m for m in mins if isinstance(m, tirx.Var)]
        if not any(m.same_as(vec_var) for m in used):
            continue
        reuse = 1
        for iv in spatial:
            if not any(m.same_as(iv.var) for m in used):
                reuse *= A._const_int(iv.dom.extent) or 1
        if reuse >= min_reuse:
            out.append(index)
    return out


class PackOperands(Postproc):
    """Pack the operands of every block whose sketch sampled ``ANN_PACK`` = 1: a copy block
    at the start of the kernel (parallel over its outer loop, vectorised inner loop) writes
    the operand in the order the block's final loop nest reads it (``pack_buffer``, as the
    compile-time weight packing). An operand read by more than one block, or with no
    suggested layout, stays as it is."""

    name = "pack_operands"

    def __init__(self, params: TargetParams) -> None:
        self.params = params

    def apply(self, sch: Schedule) -> bool:
        """Insert the packing copies; True unless a primitive fails (the candidate is then
        dropped)."""
        func_name = A.func_name_of(sch)
        func = sch.mod[func_name]
        for blk in _asked(func):
            for buffer in [blk.reads[i].source for i in packable_reads(func, blk)]:
                packer = pack_buffer(sch, func_name, buffer)
                if packer is not None:
                    self._parallel_copy(sch, packer, str(buffer.dtype))
        return True

    def _parallel_copy(self, sch: Schedule, packer: Any, dtype: str) -> None:
        loops = sch.get_loops(packer)
        if not loops:
            return
        lanes = self.params.lanes(dtype)
        inner = loops[-1]
        extent = A.loop_extent(sch, inner)
        if len(loops) > 1:
            sch.parallel(loops[0])
        if lanes > 1 and extent is not None and extent % lanes == 0:
            _, vec = sch.split(inner, [None, lanes])
            sch.vectorize(vec)


def _asked(func: tirx.PrimFunc) -> list[Any]:
    """The blocks annotated ``ANN_PACK`` = 1."""
    blocks: list[Any] = []

    def visit(block: Any) -> None:
        value = block.annotations.get(ANN_PACK) if block.annotations else None
        if value is not None and A._const_int(value) == 1:
            blocks.append(block)

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, visit)])
    return blocks
