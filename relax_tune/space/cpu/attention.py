"""The fused attention schedule: scores, softmax and product with ``v`` per block of rows.

The function ``attention.FuseAttention`` makes holds, in order, the scores' matmul
(``S = q k``, reducing over the head dimension), elementwise blocks on S (a scale, a mask),
the softmax's four blocks over the last axis (row max, exp, row sum, division) and the
product with ``v`` (reducing over the keys). Every block but the last is a function of
whole rows of S, so all of them can be computed at a block of rows of the output: for each
head and block of ``rb`` rows, the ``rb x n`` scores live in a buffer that stays in cache,
as in PyTorch's ``scaled_dot_product_attention`` on CPU, instead of three passes over the
whole ``heads x n x n`` tensor. Sampled per candidate: the row block and its register
rows (``sample_perfect_tile``) and the scores' register tile (rows, vectors of keys). The
row reductions (max, sum) stay loops over the keys: ``host_target``'s reassociation flags
let LLVM vectorise them (an ``rfactor`` into vector partials is wrong on a partial tile:
the partials past ``n`` are never initialised).
"""

from __future__ import annotations

import logging

from tvm.s_tir import Schedule

from .. import analysis as A
from ..params import ANN_TILED, TargetParams
from ..rule import FunctionRule

logger = logging.getLogger(__name__)

SOFTMAX_BLOCKS = ("T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum", "T_softmax_norm")
"""The blocks ``LegalizeOps`` makes of a softmax, in order."""


class FusedAttention(FunctionRule):
    """Schedule a fused attention function (see the module docstring); other functions are
    not recognised (``sketches`` returns ``[]``).

    Args:
        params: the target's parameters (vector width).
        max_row_block: largest block of rows computed together.
        max_register_rows: largest number of output rows held in registers.
    """

    name = "fused_attention"

    def __init__(self, params: TargetParams, max_row_block: int = 32,
                 max_register_rows: int = 8) -> None:
        self.params = params
        self.max_row_block = max_row_block
        self.max_register_rows = max_register_rows

    def recognise(self, sch: Schedule) -> list | None:
        """The blocks (scores, elementwise..., softmax..., output) of a fused attention
        function, or None."""
        blocks = [b for b in A.collect_blocks(sch) if not A.is_root(sch, b)]
        names = [str(A.node(sch, b).name_hint) for b in blocks]
        if len(blocks) < 6 or tuple(names[-5:-1]) != SOFTMAX_BLOCKS:
            return None
        first, last = blocks[0], blocks[-1]
        for block in (first, last):
            if not A.is_reduction_block(sch, block) or len(A.loops_of(sch, block)) != 5:
                return None
        for block in blocks[1:-5]:
            if not A.is_spatial(sch, block):
                return None
        return blocks

    def sketches(self, sch: Schedule) -> list[Schedule]:
        """One sketch for a fused attention function, ``[]`` for any other."""
        blocks = self.recognise(sch)
        if blocks is None:
            return []
        try:
            out = sch.copy()
            self._schedule(out, [str(A.node(sch, b).name_hint) for b in blocks])
        except Exception as err:  # a primitive refused: leave it to the block rules
            logger.debug("fused attention schedule failed: %s", err)
            return []
        return [out]

    def _schedule(self, sch: Schedule, names: list[str]) -> None:
        lanes = max(1, self.params.vector_bytes // 4)
        scores, *elementwise = names[:-5]
        exp, norm = names[-4], names[-2]
        out = sch.get_sblock(names[-1])
        b, h, i, d, k = sch.get_loops(out)
        io, rows = sch.split(i, sch.sample_perfect_tile(
            i, n=2, max_innermost_factor=self.max_row_block))
        i1, i2 = sch.split(rows, sch.sample_perfect_tile(
            rows, n=2, max_innermost_factor=self.max_register_rows))
        sch.reorder(b, h, io, i1, k, i2, d)
        sch.annotate(out, ANN_TILED, "attention")  # LimitRegisterTile checks i2 x d
        for name in reversed(names[:-1]):  # every producer, consumers first
            sch.compute_at(sch.get_sblock(name), io, preserve_unit_loops=True)
        for name in elementwise:
            sch.compute_inline(sch.get_sblock(name))
        sch.parallel(sch.fuse(b, h, io))
        # the output: i2 x d accumulators in registers, d vectorised
        acc = sch.cache_write(out, 0, "local")
        sch.reverse_compute_at(acc, i1, preserve_unit_loops=True)
        sch.vectorize(d)
        sch.vectorize(sch.get_loops(acc)[-1])
        # the scores: rows x keys register tile, keys vectorised
        block = sch.get_sblock(scores)
        *_, si, sj, sc = sch.get_loops(block)
        si0, si1 = sch.split(si, sch.sample_perfect_tile(
            si, n=2, max_innermost_factor=self.max_register_rows))
        sj, lane = sch.split(sj, [None, lanes])  # whole vectors of keys, 1 to 4 of them
        sj0, sj1 = sch.split(sj, sch.sample_perfect_tile(sj, n=2, max_innermost_factor=4))
        sch.reorder(si0, sj0, sc, si1, sj1, lane)
        sj1 = sch.fuse(sj1, lane)
        sch.annotate(block, ANN_TILED, "attention")  # and si1 x sj1
        acc = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(acc, sj0, preserve_unit_loops=True)
        sch.vectorize(sj1)
        sch.vectorize(sch.get_loops(acc)[-1])
        for name in (exp, norm):
            _, j1 = sch.split(sch.get_loops(sch.get_sblock(name))[-1], [None, lanes])
            sch.vectorize(j1)
