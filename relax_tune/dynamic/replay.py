"""A static record's trace replayed on the symbolic function: one bucket's branch.

Branch ``b`` of a dispatch (``relax_tune.dynamic.dispatch``) is the best trace of the
size-``b`` task replayed on the *symbolic* function (``replay_symbolic``): tile sizes
become fixed split factors but one, which is ceil-divided (the outermost, or the one fused
into the parallel loop, ``parallel_variable_factors``), so the tiles are predicated and the
branch is correct at every size, tuned for ``b``. Full tiles then run without their
predicates (``relax_tune.dynamic.tiles``), and a loop the bucket vectorised whole is
vectorised in tiles (``vector_tile``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, Schedule

from ..utils import UncheckedSchedule, apply_trace_json, replay_schedule, trace_to_json
from .buckets import _dtype, symbolic_vars
from .tiles import _identity, unswitch_partial_tiles

logger = logging.getLogger(__name__)


def symbolic_trace_json(trace_json: list, variable: Mapping[int, int] | None = None) -> list:
    """A static record's trace made replayable on the symbolic function: every
    ``SamplePerfectTile`` is removed and the splits that used it get its decided factors
    as literals, one as ``None`` (ceil-divided: predicated tiles on a symbolic loop,
    exactly the decided tiles on a static one, wherever the ``None`` is): the outermost,
    or the one ``variable`` names (``{index of the SamplePerfectTile: factor position}``,
    ``parallel_variable_factors``)."""
    return _symbolic_trace(trace_json, variable or {})[0]


def _symbolic_trace(trace_json: list, variable: Mapping[int, int]
                    ) -> tuple[list, dict[int, int]]:
    """``symbolic_trace_json`` and ``{position of a Split in it: index of the
    SamplePerfectTile whose factors it uses}``."""
    insts, decisions = trace_json
    decided = {int(i): d for i, d in decisions}
    subst: dict[str, object] = {}
    sample_of: dict[str, int] = {}
    kept: list[list] = []
    new_index: dict[int, int] = {}
    splits: dict[int, int] = {}
    for index, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind == "SamplePerfectTile":
            factors = [int(f) for f in decided[index]]
            subst.update(zip(outputs, factors))
            subst[outputs[variable.get(index, 0)]] = "None"
            sample_of.update((out, index) for out in outputs)
            continue
        if kind == "Split" and any(isinstance(x, str) and x in sample_of for x in inputs[1:]):
            splits[len(kept)] = next(sample_of[x] for x in inputs[1:]
                                     if isinstance(x, str) and x in sample_of)
        new_index[index] = len(kept)
        kept.append([kind, [subst.get(x, x) if isinstance(x, str) else x for x in inputs],
                     attrs, outputs])
    return [kept, [[new_index[int(i)], d] for i, d in decisions if int(i) in new_index]], splits


def parallel_variable_factors(factors_of: Mapping[int, Sequence[int]],
                              parallel: Mapping[int, set[int]]) -> dict[int, int]:
    """Per tile (``factors_of``: ``{SamplePerfectTile index: decided factors}``), the factor
    to ceil-divide on replay when not the outermost: the largest factor (the outermost of
    equals) among those whose loops are fused into a parallel loop (``parallel``:
    ``{SamplePerfectTile index: factor positions}``), never the innermost (vectorised,
    unrolled).

    Ceil-dividing factor ``k`` pads the tile to a multiple of the product of the other
    factors, ``bucket / factors[k]`` rows, and the parallel loop's iterations go to the
    threads in contiguous chunks, so coarse padding is work one thread lacks while the
    other runs full tiles. A row tile ``[2, 32, 2, 2]`` decided at n=256, its first two
    loops in the parallel loop, becomes ``[2, None, 2, 2]``: at n=300 the 32 grows to 38
    (8 rows of padding) instead of a third outer tile of 44 of 128 rows, two of which one
    thread ran while the other ran the 44. A factor outside the parallel loop stays
    constant: there it is a register or cache tile, and made symbolic it loses more than
    the padding costs. Measured: docs/design/dynamic-shapes.md, "Which factor is
    ceil-divided"."""
    out = {}
    for index, positions in parallel.items():
        factors = factors_of[index]
        inner = [k for k in sorted(positions) if k < len(factors) - 1]
        at = max(inner, key=lambda k: (factors[k], -k), default=None)
        if at is not None and at > 0 and factors[at] > 1:
            out[index] = at
    return out


def replay_symbolic(mod: tvm.IRModule, trace_json: list,
                    sizes: Mapping[str, int] | None = None,
                    full_tiles: bool = True) -> tirx.PrimFunc:
    """The function of ``mod`` (a normalised symbolic workload) scheduled by a static
    record's trace (``symbolic_trace_json``), its full tiles unswitched from their
    predicates (``unswitch_partial_tiles``). Raises when the trace does not replay on
    symbolic extents (the caller tries the bucket's next record).

    TVM cannot vectorise a loop whose extent stays symbolic (a softmax row of length
    ``n``, vectorised whole at the bucket's size). With ``sizes`` (the bucket's
    ``{var name: size}``) such a loop is split by ``vector_tile`` of its extent at the
    bucket and the inner part vectorised; without, or when that tile is too short, the
    loop stays a plain loop. ``full_tiles=False`` leaves the predicates in place (tuning
    only asks whether a candidate replays; unswitching never fails)."""
    finish = _finish if full_tiles else (lambda func: func)
    sym, splits = _symbolic_trace(trace_json, {})
    sch = replay_schedule(mod)
    # Raises, e.g., for an rfactor of a reduction over n split by a factor that does not
    # divide n: TVM refuses to decompose its init (not quasi-affine), and rightly so, since
    # without the decomposition the rfactor slots past n would never be initialised.
    apply_trace_json(sym, sch)
    symbolic, parallel = _probe(mod, sch.trace, splits)
    decided = {int(i): [int(f) for f in d] for i, d in trace_json[1]
               if trace_json[0][int(i)][0] == "SamplePerfectTile"}
    variable = parallel_variable_factors(decided, parallel)
    if variable:
        sch = replay_schedule(mod)
        apply_trace_json(_symbolic_trace(trace_json, variable)[0], sch)
    trace = sch.trace
    if not symbolic:
        return finish(sch.mod["main"])
    tiles = {at: vector_tile(extent, mod["main"], sizes) for at, extent in symbolic.items()}
    # Splitting a loop by a fixed factor is always valid (the partial chunk is predicated);
    # TVM's dataflow check would refuse it under a cache-write copy whose bindings involve
    # the symbolic tiles.
    final = UncheckedSchedule(mod, error_render_level="none", enable_check=False)
    apply_trace_json(_mark_vector_tiles(trace_to_json(trace), tiles), final)
    _split_vector_tiles(final)
    return finish(final.mod["main"])


def _probe(mod: tvm.IRModule, trace, splits: Mapping[int, int]
           ) -> tuple[dict[int, object], dict[int, set[int]]]:
    """Replay ``trace`` (a symbolic replay's) once more on a fresh schedule, watching it:
    ``({position of a Vectorize on a symbolic loop: its extent}, {index of a
    SamplePerfectTile: positions of its factors whose loops end up in a parallel loop})``.
    ``splits``: ``{position of a Split: the SamplePerfectTile it uses}``."""
    symbolic: dict[int, object] = {}
    split_loops: dict[int, list[int]] = {}  # tile: its split's loop vars, outermost first
    fused_from: dict[int, list[int]] = {}  # a fused loop var: the loop vars it fused
    in_parallel: set[int] = set()
    state: dict = {"position": 0, "pending": None}
    # Loop identities are object handles: every loop seen is kept alive, so that no later
    # loop can be allocated at a handle already recorded.
    seen: list = []
    probe = replay_schedule(mod)

    def loops_now() -> list:
        loops = _loops(probe.mod["main"].body)
        seen.extend(loops)
        return loops

    def settle() -> None:  # what the instruction before did, now that it is applied
        pending, state["pending"] = state["pending"], None
        if pending is None:
            return
        kind, key, before = pending
        new = _new_loops_outer_first(loops_now(), before)
        if kind == "Split":
            split_loops[key] = new
        elif new:
            fused_from[new[0]] = key

    def inspect(inst, inputs, _attrs, decision):
        # called before each instruction is applied, in trace order
        settle()
        name, position = inst.kind.name, state["position"]
        if name == "Vectorize":
            extent = probe.get(inputs[0]).extent
            if not isinstance(extent, tirx.IntImm):
                symbolic[position] = extent
        elif name == "Split" and position in splits:
            state["pending"] = ("Split", splits[position], _loop_ids(loops_now()))
        elif name == "Fuse":
            state["pending"] = ("Fuse", [_identity(probe.get(rv).loop_var) for rv in inputs],
                                _loop_ids(loops_now()))
        elif name == "Parallel":
            todo = [_identity(probe.get(inputs[0]).loop_var)]
            while todo:
                var = todo.pop()
                in_parallel.add(var)
                todo += fused_from.get(var, [])
        state["position"] = position + 1
        return decision

    trace.apply_to_schedule(probe, remove_postproc=False, decision_provider=inspect)
    settle()
    parallel = {tile: {k for k, v in enumerate(loops) if v in in_parallel}
                for tile, loops in split_loops.items()}
    return symbolic, {tile: ks for tile, ks in parallel.items() if ks}


def _loops(stmt) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, [(tirx.For, found.append)])
    return found


def _loop_ids(loops: list) -> set[int]:
    return {_identity(f.loop_var) for f in loops}


def _new_loops_outer_first(loops: list, before: set[int]) -> list[int]:
    """The loop variables of ``loops`` (a function's, ``_loops``) not in ``before`` (the
    loops a Split or Fuse just made, one nest), outermost first: a loop holds every new
    loop inside it."""
    new = [f for f in loops if _identity(f.loop_var) not in before]
    inside = {_identity(f.loop_var): sum(1 for g in _loops(f.body)
                                         if _identity(g.loop_var) not in before)
              for f in new}
    return sorted(inside, key=lambda v: -inside[v])


VECTOR_TILE_KEY = "relax_tune.vector_tile"
"""Loop annotation standing in, during replay, for a Vectorize of a symbolic loop."""


MAX_VECTOR_TILE = 64
"""Longest tile a symbolic loop is split by to be vectorised (4 AVX-512 float vectors)."""


def vector_tile(extent, func: tirx.PrimFunc, sizes: Mapping[str, int] | None) -> int | None:
    """The tile a vectorised loop of symbolic ``extent`` is split by: the largest power of
    two up to its extent at the bucket's ``sizes`` and ``MAX_VECTOR_TILE``; None (do not
    vectorise) without sizes or below 4 lanes."""
    if not sizes:
        return None
    analyzer = tvm.sym.Analyzer()
    for var in symbolic_vars(func):
        if var.name in sizes:
            analyzer.bind(var, tirx.IntImm(_dtype(var), int(sizes[var.name])))
    at_bucket = analyzer.simplify(extent)
    if not isinstance(at_bucket, tirx.IntImm):
        return None
    tile = 1
    while tile * 2 <= min(int(at_bucket.value), MAX_VECTOR_TILE):
        tile *= 2
    return tile if tile >= 4 else None


def _mark_vector_tiles(trace_json: list, tiles: Mapping[int, int | None]) -> list:
    """``trace_json`` with each Vectorize at a position of ``tiles`` replaced by an
    annotation of its loop with the tile (``VECTOR_TILE_KEY``), or dropped where the tile
    is None. (Splitting there would change the loops every later GetLoops returns.)"""
    insts, decisions = trace_json
    out, new_index = [], {}
    for index, inst in enumerate(insts):
        if index in tiles:
            if tiles[index] is not None:
                out.append(["Annotate", [inst[1][0], int(tiles[index])],
                            [VECTOR_TILE_KEY], []])
            continue
        new_index[index] = len(out)
        out.append(inst)
    return [out, [[new_index[int(i)], d] for i, d in decisions if int(i) in new_index]]


def _split_vector_tiles(sch: Schedule) -> None:
    """Each loop annotated ``VECTOR_TILE_KEY`` split by its tile, the inner loop
    vectorised (the outer ceil-divided; the partial chunk is predicated)."""
    names: list[str] = []
    tvm_ffi.structural_walk(sch.mod["main"].body,
                            [(SBlock, lambda b: names.append(str(b.name_hint)))])
    for name in names:
        if name == "root":
            continue
        for loop in sch.get_loops(sch.get_sblock(name)):
            stmt = sch.get(loop)
            if VECTOR_TILE_KEY not in stmt.annotations:
                continue  # (a loop shared with an earlier block is done already)
            tile = int(stmt.annotations[VECTOR_TILE_KEY])
            sch.unannotate(loop, VECTOR_TILE_KEY)
            _, inner = sch.split(loop, [None, tile])
            sch.vectorize(inner)
            break  # this block's loops changed; a loop is annotated once per block chain


def _finish(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``unswitch_partial_tiles``, never failing the branch: the predicated function if it
    cannot be done."""
    try:
        return unswitch_partial_tiles(func)
    except Exception as err:  # the predicated function is correct, only slower
        logger.debug("full tiles not unswitched (%s)", err)
        return func
