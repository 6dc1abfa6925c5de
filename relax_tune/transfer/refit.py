"""Replaying a schedule of one workload on an alike workload of other shapes.

A trace's tile sizes (``SamplePerfectTile`` decisions) multiply to its own loops' extents,
so they do not fit another shape. :func:`refit_trace` replays the trace on the new workload
and fits each tiling as it goes: from the innermost factor out, each becomes the divisor of
what is left of the new extent closest in size to the source's factor, and the outermost
takes the rest. The inner tiles (registers, vector lanes, cache blocks) are what a tuned
schedule found and what carries over between shapes; the outer ones are mostly parallel work and
follow the shape. A compute location that does not exist in the new loop nest is sampled
afresh on a second try. The result goes through the design space's postprocessing and
checks like any candidate.

A split by fixed factors (``split(loop, [None, 8])``: whole vectors of a 64-channel loop)
does not carry over to an extent they do not divide: a 58-channel loop becomes 8 x 8
iterations under a predicate, which LLVM does not vectorise, and the kernel ran slower
than the untuned function (ShuffleNetV2's 1x1 convolutions, 1.58 ms against 0.93). Such a
trace does not carry over (:func:`refit_trace` says so).

A nearest divisor can be larger than the source's tile: a register tile of 5 rows becomes
7 on a 14x14 map, and 7 rows of two vectors need more registers than the target has (the
postprocessing rejects it). ``register_fallbacks`` lists other register tiles of the same
cache tiles to try then: each tiling's innermost factor capped at the source's, or one
tiling's innermost moved a level out (7 rows of one vector instead of two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm.s_tir import Schedule, Trace
from tvm.s_tir.schedule import Instruction, InstructionKind, SBlockRV

from ..space import sketch_part
from ..utils import error_line, replay_schedule


def _nearest_divisor(n: int, size: int) -> int:
    """The divisor of ``n`` closest to ``size`` in ratio (the smaller one on a tie)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divisors = small + [n // d for d in small]
    return min(divisors, key=lambda d: (abs(math.log(d / max(size, 1))), d))


def fit_tile(factors: list[int], extent: int) -> list[int]:
    """Tile sizes for a loop of ``extent`` shaped like ``factors`` (outermost first): from
    the innermost out, each the divisor of what is left closest in size to the source's,
    the outermost the rest."""
    out = [1] * len(factors)
    rest = extent
    for i in range(len(factors) - 1, 0, -1):
        out[i] = _nearest_divisor(rest, int(factors[i]))
        rest //= out[i]
    out[0] = rest
    return out


def _move_out(tile: list[int], cap: int) -> list[int]:
    """``tile`` with its innermost factor cut to its largest divisor up to ``cap``, the
    rest of it joining the level above."""
    inner = max(d for d in range(1, max(cap, 1) + 1) if tile[-1] % d == 0)
    return tile[:-2] + [tile[-2] * (tile[-1] // inner), inner]


def register_fallbacks(refitted: "Refitted") -> list[Trace]:
    """Other register tiles for ``refitted``'s trace, the same cache tiles (every tiling's
    product of inner levels unchanged): first each grown innermost factor capped at the
    source's, then, for one tiling of three levels or more at a time, its innermost moved
    a level out. Distinct, and none the trace itself."""
    base = refitted.trace
    tiles = [(inst, [int(x) for x in base.decisions[inst]]) for inst in base.insts
             if inst.kind.name == "SamplePerfectTile" and inst in base.decisions]
    sources = refitted.sources if len(refitted.sources) == len(tiles) else []  # aligned
    choices = [[(inst, _move_out(t, src[-1])) for (inst, t), src in zip(tiles, sources)
                if len(t) > 1 and t[-1] > src[-1]]]
    choices += [[(inst, _move_out(t, 1))] for inst, t in tiles if len(t) > 2 and t[-1] > 1]
    out, seen = [], {str([t for _, t in tiles])}
    for changes in choices:
        changed = {id(inst): t for inst, t in changes}
        key = str([changed.get(id(inst), t) for inst, t in tiles])
        if not changes or key in seen:
            continue
        seen.add(key)
        trace = base
        for inst, t in changes:
            trace = trace.with_decision(inst, t, True)
        out.append(trace)
    return out


def kept_share(factors: list[int], fitted: list[int]) -> float:
    """How close the fitted inner tiles (all factors but the outermost) are in size to the
    source's: the smaller of their products over the larger (1.0: the same tile)."""
    source = max(1, math.prod(int(f) for f in factors[1:]))
    kept = max(1, math.prod(fitted[1:]))
    return min(source, kept) / max(source, kept)


def _uneven_split(sch: Schedule, inputs) -> str:
    """Why a split of ``inputs`` (its loop, then its factors: None, constants or sampled
    values) leaves a remainder, or "" (also where an extent or factor is not a constant)."""
    extent = sch.get(inputs[0]).extent
    if not isinstance(extent, tvm.tirx.IntImm):
        return ""
    factors: list[int | None] = []
    for factor in inputs[1:]:
        value = factor if factor is None or isinstance(factor, (int, tvm.tirx.IntImm)) \
            else sch.get(factor)
        if value is not None and not isinstance(value, (int, tvm.tirx.IntImm)):
            return ""
        factors.append(None if value is None else int(value))
    known = math.prod(f for f in factors if f is not None)
    rest = int(extent) % known if None in factors else int(extent) - known
    return f"a loop of {int(extent)} split by {factors} leaves a remainder" if rest else ""


def _apply(sketch: Trace, mod: tvm.IRModule, keep_locations: bool,
           shares: list[float], sources: list[list[int]], uneven: list[str]) -> Schedule:
    sch = replay_schedule(mod, seed=1)

    def provide(inst, inputs, _attrs, decision):
        name = inst.kind.name
        if name == "Split" and not uneven:
            why = _uneven_split(sch, inputs)
            if why:
                uneven.append(why)
        if name == "SamplePerfectTile" and decision is not None:
            extent = sch.get(inputs[0]).extent
            if isinstance(extent, tvm.tirx.IntImm):
                factors = [int(x) for x in decision]
                fitted = fit_tile(factors, int(extent))
                shares.append(kept_share(factors, fitted))
                sources.append(factors)
                return fitted
        if name == "SampleComputeLocation" and not keep_locations:
            return None
        return decision

    sketch.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
    return sch


@dataclass
class Refitted:
    """A trace carried over to a new workload: its sketch part with the fitted decisions,
    and ``kept``: over its tilings, the least size ratio of fitted to source inner tiles
    (``kept_share``; 1.0: every register, vector and cache tile of the source carried over;
    near 0: the new extents have no divisor near the source's tiles, and the schedule is
    another one)."""

    trace: Trace
    kept: float
    sources: list = field(default_factory=list)
    """The source's factors of each fitted tiling, in the trace's order."""


def _rvs(values) -> list:
    """The random variables among an instruction's inputs (nested lists flattened)."""
    out = []
    for value in values:
        if isinstance(value, (list, tuple, tvm_ffi.Array)):
            out += _rvs(value)
        elif value is not None and not isinstance(value, (int, float, str, tvm.tirx.IntImm,
                                                          tvm.tirx.FloatImm)):
            out.append(value)
    return out


_QUERIES = frozenset({"GetSBlock", "GetLoops", "GetConsumers", "GetProducers",
                      "GetChildBlocks"})
"""Instructions that only look a block or loop up: dropped where nothing uses what they
return (a ``GetConsumers`` of the last block returns one block more on a workload with
another block after it, and a replay stops at the count it does not expect)."""


def _flat(values) -> list:
    out = []
    for value in values:
        out += _flat(value) if isinstance(value, (list, tuple, tvm_ffi.Array)) else [value]
    return out


def block_names(trace: Trace, mod: tvm.IRModule) -> dict:
    """The name of the block behind each of ``trace``'s block variables, the trace replayed
    on ``mod`` (the workload it was made on): what a ``GetConsumers`` returned there."""
    sch = replay_schedule(mod, seed=1)
    names: dict = {}

    def provide(inst, inputs, _attrs, decision):
        for rv, value in zip(_flat(inst.inputs), _flat(inputs)):
            if isinstance(rv, SBlockRV):
                names[rv] = str(sch.get(value).name_hint)
        return decision

    trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
    return names


def adapt_blocks(trace: Trace, names: dict, renames: dict) -> Trace:
    """``trace`` for a workload whose blocks after the anchor differ (``renames``, from
    ``similarity.epilogue_renames``: a source block's name to the new one's, or to None where
    the new workload lacks it): each block looked up by its new name, a consumer or producer
    lookup by name too (``names``, from :func:`block_names`: the new workload's consumers are
    other blocks, or none), and every instruction on a missing block dropped with whatever
    uses its results; then the lookups whose results nothing uses."""
    dead: set = set()
    kept = []
    get_block = InstructionKind.get("GetSBlock")
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "GetSBlock":
            name = renames.get(str(inst.attrs[0]), str(inst.attrs[0]))
            if name is None:
                dead.update(inst.outputs)
                continue
            inst = Instruction(get_block, [], [name, *inst.attrs[1:]], inst.outputs)
        elif kind in ("GetConsumers", "GetProducers") and not any(
                rv in dead for rv in _rvs(inst.inputs)):
            for out in inst.outputs:
                name = renames.get(names.get(out), names.get(out))
                if name is None:
                    dead.add(out)
                else:
                    kept.append(Instruction(get_block, [], [name, "main"], [out]))
            continue
        if any(rv in dead for rv in _rvs(inst.inputs)):
            dead.update(inst.outputs)
            continue
        kept.append(inst)
    used: set = set()
    needed = []
    for inst in reversed(kept):
        if inst.kind.name in _QUERIES and not any(rv in used for rv in inst.outputs):
            continue
        used.update(_rvs(inst.inputs))
        needed.append(inst)
    kept = needed[::-1]
    decisions = {inst: trace.decisions[inst] for inst in kept if inst in trace.decisions}
    return Trace(kept, decisions)


def refit_trace(source: Schedule, mod: tvm.IRModule, renames: dict | None = None,
                source_mod: tvm.IRModule | None = None) -> tuple[Refitted | None, str]:
    """``source``'s trace (a schedule of an alike workload) replayed on ``mod`` with its
    tiles fitted, or None and why not; with ``renames`` (``similarity.epilogue_renames``),
    its blocks after the anchor first adapted to ``mod``'s (``adapt_blocks``; ``source_mod``
    is the workload ``source`` was made on)."""
    sketch = sketch_part(source.trace)
    if renames is not None:
        try:
            sketch = adapt_blocks(sketch, block_names(sketch, source_mod), renames)
        except Exception as err:  # noqa: BLE001 - a trace that does not replay at home
            return None, f"does not replay on its own workload: {error_line(err)}"
    error = ""
    for keep_locations in (True, False):
        shares: list[float] = []
        sources: list[list[int]] = []
        uneven: list[str] = []
        try:
            sch = _apply(sketch, mod, keep_locations, shares, sources, uneven)
        except Exception as err:  # noqa: BLE001 - a trace that does not carry over
            error = error_line(err, with_type=True)
            continue
        if uneven:
            return None, f"does not carry over: {uneven[0]}"
        return Refitted(sketch_part(sch.trace), min(shares, default=1.0), sources), ""
    return None, f"does not replay on this workload: {error}"
