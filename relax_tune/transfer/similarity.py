"""Which workloads are alike: the same computation on other shapes.

Two workloads are alike when their blocks match one for one: the same names (numeric
suffixes dropped), the same iteration kinds (spatial, reduction) in the same order and the
same dtypes read and written. A 3x3 convolution of 64 channels on 56x56 and one of 256
channels on 14x14 are alike; a convolution and a matmul are not. A trace of one replays on
the other once its tile sizes are fitted to the new extents (``refit.py``).

Among alike workloads the closest is the one whose loop extents differ least in ratio
(:func:`shape_distance`): its tiles need the least refitting.

Workloads that differ only after their last reduction block share an ``anchor``: the same
convolution or matmul with another elementwise epilogue (no bias add, a ReLU for a clip, an
extra residual add). Their tilings carry over once the instructions of the blocks the new
workload lacks are dropped (``refit.prune_missing_blocks``); :func:`anchor_distance` says
how close they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import tvm
import tvm_ffi

_SUFFIX = re.compile(r"_\d+$")
_KIND = {0: "S", 2: "R"}  # IterVar.iter_type: data-parallel, reduction; others "O"


@dataclass(frozen=True)
class Shape:
    """A workload's structure (``key``) and its blocks' loop extents in block order
    (``extents``; None where one is symbolic: such a workload is never matched); its
    structure up to and including its last reduction block (``anchor``; None without one)
    and how many of ``extents`` belong to those blocks (``anchor_loops``); the names of its
    blocks (``blocks``)."""

    key: str
    extents: tuple[int, ...] | None
    anchor: str | None = None
    anchor_loops: int = 0
    blocks: frozenset = frozenset()


def workload_shape(mod: tvm.IRModule) -> Shape:
    """The structure key and loop extents of ``mod``'s ``main`` function."""
    blocks: list = []
    tvm_ffi.structural_walk(mod["main"].body, [(tvm.s_tir.SBlock, blocks.append)])
    parts: list[str] = []
    names: set[str] = set()
    extents: list[int] | None = []
    anchor, anchor_loops, loops = None, 0, 0
    for block in blocks:
        names.add(str(block.name_hint))
        if block.name_hint == "root":
            continue
        kinds = "".join(_KIND.get(int(iv.iter_type), "O") for iv in block.iter_vars)
        dtypes = ",".join(str(r.source.dtype) for r in (*block.reads, *block.writes))
        parts.append(f"{_SUFFIX.sub('', block.name_hint)}:{kinds}:{dtypes}")
        for iv in block.iter_vars:
            ext = iv.dom.extent
            if extents is not None and isinstance(ext, tvm.tirx.IntImm):
                extents.append(int(ext))
            else:
                extents = None
        loops += len(block.iter_vars)
        if "R" in kinds:
            anchor, anchor_loops = "|".join(parts), loops
    return Shape("|".join(parts), None if extents is None else tuple(extents), anchor,
                 anchor_loops, frozenset(names))


def shape_distance(a: Shape, b: Shape) -> float:
    """How far apart two alike workloads' extents are: the sum of ``|log(a / b)|`` over
    their loops (0 for the same shapes; ``inf`` when they are not alike)."""
    if a.key != b.key or a.extents is None or b.extents is None \
            or len(a.extents) != len(b.extents):
        return math.inf
    return _log_ratios(a.extents, b.extents)


def anchor_distance(a: Shape, b: Shape) -> float:
    """``shape_distance`` over the anchors of two workloads alike up to their last reduction
    block (``inf`` when their anchors differ or either has none)."""
    if a.anchor is None or a.anchor != b.anchor or a.extents is None or b.extents is None:
        return math.inf  # equal anchors have equal loop counts: their kinds spell them out
    return _log_ratios(a.extents[:a.anchor_loops], b.extents[:b.anchor_loops])


def _log_ratios(xs: tuple[int, ...], ys: tuple[int, ...]) -> float:
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(xs, ys))
