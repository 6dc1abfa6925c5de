"""The AMX sketch of an integer convolution or matmul (``int8_dot.recognise``'s shape): the
output in tiles of ``rows`` x ``16 * vectors`` int32, each computed by one ``amx_intrin``
call over the whole contiguous reduction (channels, ``k``) and, for a convolution whose
input pixels are read at a constant stride, its whole kernel window (otherwise one call
per kernel position).

- ``rows``: the largest divisor of the spatial axis before the output channel (a matmul's
  ``m``, a convolution's output width) up to 16, an AMX tile's most rows: 16 of 128
  tokens, 14 of 56 or 28 pixels, 7 of 7;
- ``row_tiles`` x ``vectors`` accumulator tiles a call (1 x 1-3, 2 x 1, and 2 x 2 with
  16-row tiles: ``amx_intrin.fits``; one sketch each): each loaded slice of the input
  serves ``vectors`` tiles, each weight tile ``row_tiles``;
- the tiles grouped in blocks of row tiles x channel tiles x (a convolution's) output
  rows, one parallel job each, their sizes sampled (``BLOCK``): what the search tunes.
  Inside a job the channel tiles are outermost, so a channel tile's weights are read
  from memory once and reused over the job's rows (ResNet-18's 7x7x512 layers: one row
  tile a row, 2.4 MB of weights; with one output row a job, the weights were streamed 7
  times: 200-209 us, 88-90 us with the rows in the job; Xeon, 2 threads, 32 trials each);
- the weight packed once (``PREPROC_ANNOTATION``) as ``[.., o/16, r/4, 16, 4]``: the
  dot-product kernels' tile rows, with the other weight axes (kernel positions) first so
  that a call's weight tiles are one region of it.

The tile is accumulated in a tile-sized buffer and written back with the requantisation
epilogue, the outer tiles in parallel, as in the ``vpdpbusd`` sketch.
"""

from __future__ import annotations

from typing import Callable

from tvm.s_tir import Schedule

from .. import analysis as A
from .amx_intrin import AmxTile, fits, register
from .int8_tile import pad_in_jobs, padding_block_name, rows_into_jobs, \
    write_back_and_pack

AMX_LANES = 16
"""Output channels of one accumulator tile (64 bytes of int32)."""
AMX_DEPTH = 64
"""Reduction bytes of one tile row of ``A``."""
MIN_ROWS = 4
"""Fewer rows than this leave most of each ``tdpbusd`` idle: the shape is left to VNNI."""
BLOCK = 8
"""Most row tiles, and most channel tiles, a parallel job's block has (sampled)."""


def _extent(sch: Schedule, shape, axis: int) -> int:
    return int(A.node(sch, sch.get_sblock(shape.block)).iter_vars[axis].dom.extent)


def tile_rows(extent: int) -> int:
    """The largest divisor of ``extent`` up to 16."""
    return max(d for d in range(1, min(extent, 16) + 1) if extent % d == 0)


def amx_choices(sch: Schedule, shape) -> list[tuple[int, int]]:
    """The ``(row_tiles, vectors)`` an AMX sketch may take for ``shape``: accumulators
    that fit the tiles (``amx_intrin.fits``), ``vectors`` dividing the output channels'
    16-blocks, ``row_tiles`` the rows' tiles; ``[]`` when the rows would be too few for
    AMX."""
    extent = _extent(sch, shape, shape.m)
    rows = tile_rows(extent)
    if rows < MIN_ROWS:
        return []
    blocks = _extent(sch, shape, shape.o) // AMX_LANES
    return [(t, v) for t in (1, 2) for v in (1, 2, 3)
            if fits(t, v, rows) and blocks % v == 0 and extent % (t * rows) == 0]


def schedule_amx(sch: Schedule, shape, row_tiles: int, vectors: int,
                 inline: Callable[..., None], window: bool = False) -> None:
    """Schedule ``sch`` (see the module docstring) with ``row_tiles`` x ``vectors``
    accumulator tiles a call; ``inline`` is ``Int8DotProduct._inline``. With ``window``, a
    convolution's kernel positions run inside the call (its accumulators stay in the tiles
    over the whole window); raises when the function has no kernel window (two reduction
    axes besides the channels, not both of extent 1), or when the input's rows are not
    read at a constant stride."""
    rows = tile_rows(_extent(sch, shape, shape.m))
    steps = _extent(sch, shape, shape.r) // AMX_DEPTH
    stride = shape.m_stride
    if stride is None:
        raise ValueError("the input's rows are not read at a constant stride")
    positions = tuple(_extent(sch, shape, i) for i in shape.reduce if i != shape.r)
    if window and (len(positions) != 2 or positions == (1, 1)):
        raise ValueError("not a convolution window")  # before any primitive runs
    pad = padding_block_name(sch, shape.block)
    inline(sch, shape.block, sch.compute_inline)
    main = sch.get_sblock(shape.block)
    loops = A.loops_of(sch, main)
    inner_reduce = [loops[i] for i in shape.reduce if i != shape.r]
    o0, o1 = sch.split(loops[shape.o], [None, AMX_LANES])
    o0a, o0b = (o0, None) if vectors == 1 else sch.split(o0, [None, vectors])
    # without a window the whole reduction is one call's; the window's call is the loop
    # nest from its first position down, with no split loop in between
    reduce = [loops[shape.r]] if window else sch.split(loops[shape.r],
                                                       [None, AMX_DEPTH * steps])
    if row_tiles == 1:
        m0, m1 = sch.split(loops[shape.m], [None, rows])
        mt = []
    else:
        m0, mt_loop, m1 = sch.split(loops[shape.m], [None, row_tiles, rows])
        mt = [mt_loop]
    # a block of row tiles x channel tiles per parallel job (sampled), tile by tile inside
    m0a, m0b = sch.split(m0, sch.sample_perfect_tile(m0, n=2, max_innermost_factor=BLOCK))
    oa, ob = sch.split(o0a, sch.sample_perfect_tile(o0a, n=2, max_innermost_factor=BLOCK))
    outer = [loops[i] for i in shape.spatial if i not in (shape.m, shape.o)]
    outer, rows_in_job = rows_into_jobs(sch, outer, BLOCK)
    sch.reorder(*outer, m0a, oa, ob, *rows_in_job, m0b, *inner_reduce, *reduce[:-1], *mt, m1,
                *([] if o0b is None else [o0b]), o1, reduce[-1])
    nd, bo = len(shape.weight_dims), shape.weight_dims.index(shape.o)
    br = shape.weight_dims.index(shape.r)

    def packed(*d):
        others = [d[i] for i in range(nd) if i not in (bo, br)]
        return [*others, d[bo] // AMX_LANES, d[br] // 4, d[bo] % AMX_LANES, d[br] % 4]

    back, _ = write_back_and_pack(sch, main, m0b, [*outer, m0a, oa], shape.weight_read,
                                  packed)
    sch.decompose_reduction(main, (inner_reduce + reduce)[0])
    tile = AmxTile(rows, vectors, steps, positions if window else None, stride, row_tiles)
    register(tile.name)
    sch.tensorize(inner_reduce[0] if window else (mt + [m1])[0], tile.name)
    inline(sch, shape.block, sch.reverse_compute_inline, str(A.node(sch, back).name_hint))
    sch.vectorize(A.loops_of(sch, back)[-1])
    pad_in_jobs(sch, pad, A.loops_of(sch, back)[0])
