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
workload lacks are dropped and the others renamed to the new workload's blocks
(:func:`epilogue_renames`, ``refit.adapt_blocks``); :func:`anchor_distance` says how close
they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import tvm
import tvm_ffi

_SUFFIX = re.compile(r"_\d+$")
_NUMBER = re.compile(r"\d+$")  # TVM numbers a fused function's second add T_add1
_KIND = {0: "S", 2: "R"}  # IterVar.iter_type: data-parallel, reduction; others "O"


@dataclass(frozen=True)
class Shape:
    """A workload's structure (``key``) and its blocks' loop extents in block order
    (``extents``; None where one is symbolic: such a workload is never matched); its
    structure up to and including its last reduction block (``anchor``; None without one)
    and how many of ``extents`` belong to those blocks (``anchor_loops``); the blocks after
    it (``epilogue``: each block's name and what it computes, ``_signature``)."""

    key: str
    extents: tuple[int, ...] | None
    anchor: str | None = None
    anchor_loops: int = 0
    epilogue: tuple[tuple[str, str], ...] = ()


def _numel(shape) -> int | None:
    try:
        return math.prod(int(d) for d in shape)
    except TypeError:  # a symbolic extent
        return None


def _signature(part: str, block) -> str:
    """What an epilogue block computes, whatever TVM numbered it: its structure and, for
    each buffer it reads, whether the read is whole (``F``, a residual) or broadcast
    (``B``, a bias row): an ONNX convolution whose folded bias is zero has no bias add, and
    its residual add is then named ``T_add`` where a convolution with a bias calls it
    ``T_add1``."""
    domain = _numel(iv.dom.extent for iv in block.iter_vars)
    reads = "".join("F" if _numel(r.source.shape) == domain else "B" for r in block.reads)
    name, rest = part.split(":", 1)
    return f"{_NUMBER.sub('', name)}:{rest}:{reads}"


def workload_shape(mod: tvm.IRModule) -> Shape:
    """The structure key and loop extents of ``mod``'s ``main`` function."""
    blocks: list = []
    tvm_ffi.structural_walk(mod["main"].body, [(tvm.s_tir.SBlock, blocks.append)])
    parts: list[str] = []
    epilogue: list[tuple[str, str]] = []
    extents: list[int] | None = []
    anchor, anchor_loops, loops = None, 0, 0
    for block in blocks:
        if block.name_hint == "root":
            continue
        kinds = "".join(_KIND.get(int(iv.iter_type), "O") for iv in block.iter_vars)
        dtypes = ",".join(str(r.source.dtype) for r in (*block.reads, *block.writes))
        parts.append(f"{_SUFFIX.sub('', block.name_hint)}:{kinds}:{dtypes}")
        epilogue.append((str(block.name_hint), _signature(parts[-1], block)))
        for iv in block.iter_vars:
            ext = iv.dom.extent
            if extents is not None and isinstance(ext, tvm.tirx.IntImm):
                extents.append(int(ext))
            else:
                extents = None
        loops += len(block.iter_vars)
        if "R" in kinds:
            anchor, anchor_loops, epilogue = "|".join(parts), loops, []
    return Shape("|".join(parts), None if extents is None else tuple(extents), anchor,
                 anchor_loops, tuple(epilogue) if anchor else ())


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


def epilogue_renames(new: Shape, source: Shape) -> dict[str, str | None] | None:
    """How a schedule of ``source`` names ``new``'s blocks after their common anchor: each
    of ``source``'s epilogue blocks to the ``new`` block computing the same (in order), or
    to None where ``new`` lacks it (a bias add, a ReLU); None when ``new`` has an epilogue
    block ``source`` lacks (it would run as its own loop nest) or another anchor."""
    if new.anchor is None or new.anchor != source.anchor:
        return None
    renames: dict[str, str | None] = {}
    rest = list(source.epilogue)
    for name, signature in new.epilogue:
        while rest and rest[0][1] != signature:
            renames[rest.pop(0)[0]] = None
        if not rest:
            return None
        renames[rest.pop(0)[0]] = name
    renames.update((name, None) for name, _ in rest)
    return renames


def _log_ratios(xs: tuple[int, ...], ys: tuple[int, ...]) -> float:
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(xs, ys))
