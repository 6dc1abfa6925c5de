"""Dynamic shapes: tune a function with a symbolic dimension at hinted sizes, run it at all.

A TIR function whose parameter shapes hold a symbolic variable (a sequence length ``n``)
cannot be scheduled for one size. relax_tune handles it in two halves:

- Tuning (``extract.extract_tasks`` with ``shape_hints``): the function is specialised at
  each hinted size (``specialize``), one ordinary static task per size, weighted like the
  function's call sites (times the hint's weight). Records are ordinary records of the
  specialised workloads, readable by MetaSchedule.
- Applying (``ApplyDatabase``): ``dispatch_function`` makes one PrimFunc with the symbolic
  signature whose body is an ``if n <= l1 ... elif n <= l2 ... else`` chain, ``l`` the
  limits between neighbouring buckets (``upper_limit``: nearest bucket on a log scale).
  Branch ``b`` is the best trace of the size-``b`` task replayed on the *symbolic*
  function (``replay_symbolic``): tile sizes become fixed split factors but one, which is
  ceil-divided (the outermost, or the one fused into the parallel loop,
  ``parallel_variable_factors``), so the tiles are predicated and the branch is correct at
  every size, tuned for ``b``; full tiles run without their predicates
  (``unswitch_partial_tiles``; a partial vector tile runs in chunks of 16 lanes, then 4),
  and a loop the bucket vectorised whole is vectorised in tiles (``vector_tile``). Sizes
  above the largest bucket run the untuned function. A bucket whose best record is its
  baseline (the untuned function) runs the untuned body: never slower than untuned per
  bucket. With a measured plan (``dispatch_plan``) the branches serve the ranges timed
  fastest instead of the nearest bucket's (``dispatch_function``'s ``served``).
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize, Schedule, Trace

from ..utils import RelaxTuneError, trace_to_json

logger = logging.getLogger(__name__)

DEFAULT_MAX_SIZE = 1024
"""Largest default hinted size of a symbolic dimension without an upper-bound annotation."""

ShapeHints = Mapping[str, Mapping[int, float]]
"""``{var name: {size: weight}}``: the sizes a symbolic variable is tuned at."""


# ------------------------------------------------------------------------------------------
# Hints

def default_sizes(upper_bound: int | None = None) -> list[int]:
    """The sizes tuned when no hint names a variable: 1 and the powers of 4 up to the
    variable's upper bound (``tir_var_upper_bound`` of the Relax function), or up to
    ``DEFAULT_MAX_SIZE``; the bound itself when it is no power of 4."""
    bound = int(upper_bound) if upper_bound else DEFAULT_MAX_SIZE
    sizes = [1]
    while sizes[-1] * 4 <= bound:
        sizes.append(sizes[-1] * 4)
    if sizes[-1] != bound:
        sizes.append(bound)
    return sizes


def normalize_hints(hints) -> dict[str, dict[int, float]] | None:
    """``shape_hints`` in its one form ``{name: {size: weight}}``, or None.

    Accepted: ``{"n": [1, 16, 64]}`` (even weights), ``{"n": {16: 2.0, 64: 1.0}}`` (what
    matters more weighs more), or the command line's text ``"n=1,16,64;m=8"``. Anything
    else raises ``RelaxTuneError`` naming the bad part."""
    if hints is None:
        return None
    if isinstance(hints, str):
        return parse_shape_hints(hints)
    if not isinstance(hints, Mapping):
        raise RelaxTuneError(f"shape_hints must be a dict {{var name: [sizes]}}, e.g. "
                             f"{{'n': [1, 16, 64]}}, not {hints!r}")
    out: dict[str, dict[int, float]] = {}
    for name, sizes in hints.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise RelaxTuneError(f"shape_hints: {name!r} is not a symbolic variable name "
                                 "(e.g. 'n')")
        if isinstance(sizes, Mapping):
            pairs = list(sizes.items())
        elif isinstance(sizes, (list, tuple, set, frozenset, range)):
            pairs = [(s, 1.0) for s in sorted(sizes) if _is_int(s)] + \
                [(s, 1.0) for s in sizes if not _is_int(s)]
        else:
            raise RelaxTuneError(f"shape_hints[{name!r}] must be a list of sizes or a dict "
                                 f"{{size: weight}}, not {sizes!r}")
        if not pairs:
            raise RelaxTuneError(f"shape_hints[{name!r}] is empty: give at least one size")
        table: dict[int, float] = {}
        for size, weight in pairs:
            if not _is_int(size) or size < 1:
                raise RelaxTuneError(f"shape_hints[{name!r}]: size {size!r} is not a "
                                     "positive integer")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or \
                    not weight > 0:
                raise RelaxTuneError(f"shape_hints[{name!r}]: weight {weight!r} of size "
                                     f"{size} is not a positive number")
            table[int(size)] = float(weight)
        out[name] = dict(sorted(table.items()))
    return out


def parse_shape_hints(text: str | Sequence[str]) -> dict[str, dict[int, float]]:
    """Parse the command line's ``--dynamic`` values: ``"n=1,16,64"`` (several variables
    separated by ``;`` or given as several strings); a size may carry a weight,
    ``"n=16:2,64"``. A malformed part raises ``RelaxTuneError`` naming it."""
    parts = [text] if isinstance(text, str) else list(text)
    out: dict[str, dict[int, float]] = {}
    for part in (p.strip() for chunk in parts for p in chunk.split(";")):
        if not part:
            continue
        name, eq, sizes = part.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise RelaxTuneError(f"--dynamic {part!r}: write NAME=SIZE,SIZE,... "
                                 "(e.g. n=1,16,64,256)")
        if name in out:
            raise RelaxTuneError(f"--dynamic: {name!r} is given twice")
        table: dict[int, float] = {}
        for item in sizes.split(","):
            size, _, weight = item.strip().partition(":")
            if not re.fullmatch(r"[0-9]+", size) or int(size) < 1:
                raise RelaxTuneError(f"--dynamic {part!r}: {item.strip()!r} is not a positive "
                                     "integer size (SIZE or SIZE:WEIGHT)")
            try:
                w = float(weight) if weight else 1.0
            except ValueError:
                w = -1.0
            if not w > 0:
                raise RelaxTuneError(f"--dynamic {part!r}: weight {weight!r} of size {size} "
                                     "is not a positive number")
            table[int(size)] = w
        out[name] = dict(sorted(table.items()))
    if not out:
        raise RelaxTuneError("--dynamic: no sizes given; write e.g. n=1,16,64,256")
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# ------------------------------------------------------------------------------------------
# Symbolic variables and specialisation

def symbolic_vars(func: tirx.PrimFunc) -> list[tirx.Var]:
    """The symbolic variables of the parameter shapes, in first-seen order."""
    out: list[tirx.Var] = []
    for param in func.params:
        for dim in getattr(param, "shape", None) or []:
            if isinstance(dim, tirx.IntImm):
                continue
            if isinstance(dim, tirx.Var):
                if not any(v.same_as(dim) for v in out):
                    out.append(dim)
                continue
            for var in _vars_in(dim):
                if not any(v.same_as(var) for v in out):
                    out.append(var)
    return out


def _vars_in(expr) -> list[tirx.Var]:
    found: list[tirx.Var] = []
    tvm_ffi.structural_walk(expr, [(tirx.Var, found.append)])
    return found


def specialize(func: tirx.PrimFunc, sizes: Mapping[str, int]) -> tirx.PrimFunc:
    """``func`` with each symbolic variable named in ``sizes`` bound to that size.

    A variable is bound through the first parameter buffer that has it as a whole dimension
    (TVM's ``PrimFunc.specialize``). ``RelaxTuneError`` when a variable appears only inside
    shape expressions (``2 * n``): such a function cannot be specialised here."""
    for name, size in sizes.items():
        var = next((v for v in symbolic_vars(func) if v.name == name), None)
        if var is None:
            continue
        param = next((p for p in func.params
                      if any(d.same_as(var) for d in (getattr(p, "shape", None) or []))), None)
        if param is None:
            raise RelaxTuneError(f"symbolic variable {name!r} is no whole dimension of any "
                                 "parameter; the function cannot be specialised")
        shape = [tirx.IntImm(_dtype(var), int(size)) if d.same_as(var) else d
                 for d in param.shape]
        if any(not isinstance(d, (tirx.IntImm, tirx.Var)) for d in shape):
            raise RelaxTuneError(f"parameter {param.name!r} has a computed dimension; the "
                                 "function cannot be specialised")
        buf = tirx.decl_buffer(shape, param.dtype, name=param.name)
        func = func.specialize({param: buf})
    return func


@dataclass(frozen=True)
class Bucket:
    """One hinted point of a symbolic function: ``sizes`` (``{var name: size}``) and how
    much it matters (``weight``, the product of the hints' weights)."""

    sizes: tuple[tuple[str, int], ...]
    weight: float = 1.0

    @property
    def label(self) -> str:
        """``n=16`` / ``n=16,m=8``: the suffix of the task name."""
        return ",".join(f"{k}={v}" for k, v in self.sizes)


def buckets_for(func: tirx.PrimFunc, hints: ShapeHints | None,
                upper_bounds: Mapping[str, int] | None = None) -> list[Bucket]:
    """Every combination of hinted sizes of ``func``'s symbolic variables (a variable
    without a hint takes ``default_sizes`` of its upper bound), smallest first."""
    hints = hints or {}
    upper_bounds = upper_bounds or {}
    per_var = []
    for var in symbolic_vars(func):
        table = hints.get(var.name)
        if table is None:
            table = {s: 1.0 for s in default_sizes(upper_bounds.get(var.name))}
        per_var.append([(var.name, size, weight) for size, weight in table.items()])
    out = []
    for combo in itertools.product(*per_var):
        weight = 1.0
        for _, _, w in combo:
            weight *= w
        out.append(Bucket(tuple((name, size) for name, size, _ in combo), weight))
    return sorted(out, key=lambda b: (_volume(b), b.sizes))


def _volume(bucket: Bucket) -> int:
    v = 1
    for _, size in bucket.sizes:
        v *= size
    return v


# ------------------------------------------------------------------------------------------
# Replaying a static trace on the symbolic function

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
    thread ran while the other ran the 44 (Llama's MLP matmul at n=300 on bucket 256's
    record: 1.8x its time at 256, 2 cores). A factor outside the parallel loop stays
    constant: there it is a register or cache tile (made symbolic, the Llama block ran
    1.35x slower at n=16, and BERT's FFN down 1.4x slower at n=256 with its 128-row cache
    tile symbolic)."""
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
    sch = Schedule(mod, error_render_level="none")
    # Raises, e.g., for an rfactor of a reduction over n split by a factor that does not
    # divide n: TVM refuses to decompose its init (not quasi-affine), and rightly so, since
    # without the decomposition the rfactor slots past n would never be initialised.
    Trace.apply_json_to_schedule(sym, sch)
    symbolic, parallel = _probe(mod, sch.trace, splits)
    decided = {int(i): [int(f) for f in d] for i, d in trace_json[1]
               if trace_json[0][int(i)][0] == "SamplePerfectTile"}
    variable = parallel_variable_factors(decided, parallel)
    if variable:
        sch = Schedule(mod, error_render_level="none")
        Trace.apply_json_to_schedule(_symbolic_trace(trace_json, variable)[0], sch)
    trace = sch.trace
    if not symbolic:
        return finish(sch.mod["main"])
    tiles = {at: vector_tile(extent, mod["main"], sizes) for at, extent in symbolic.items()}
    # Splitting a loop by a fixed factor is always valid (the partial chunk is predicated);
    # TVM's dataflow check would refuse it under a cache-write copy whose bindings involve
    # the symbolic tiles.
    final = Schedule(mod, error_render_level="none", enable_check=False)
    Trace.apply_json_to_schedule(_mark_vector_tiles(trace_to_json(trace), tiles), final)
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
    probe = Schedule(mod, error_render_level="none")

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


# ------------------------------------------------------------------------------------------
# Full tiles without predicates

UNSWITCH_DEPTH = 4
"""Full-tile tests nested in one loop nest at most (each adds a copy of the code below it
without the predicates it covers)."""


def unswitch_partial_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a schedule replayed on symbolic extents) with every full tile run without
    its predicates.

    A tile that does not divide ``n`` is guarded by a block predicate (``T.where(i < n)``)
    evaluated in the innermost loop: a symbolic division per element that also keeps LLVM
    from unrolling and vectorising the tile as it does in the static kernel the record was
    timed as (the BERT layer's projections ran 4x slower at the bucket's own size). Here a
    loop's body becomes ``if <every predicate holds for the whole body>: <body without
    them> else: <body as it was>``: the test is each predicate's upper bound over the loops
    inside (``tvm.sym.Analyzer.int_set``), evaluated once per iteration of the loop. Each
    predicate is tested at the outermost loop whose inner loops it depends on all have a
    constant extent (``_full_tile_guard``): a row-tiled matmul's row tiles at its parallel
    loop (only the last iteration is partial), a reduction over ``n`` split by 16 inside
    its chunk loop (only the last chunk is partial). Up to ``UNSWITCH_DEPTH`` tests nest.
    A predicate whose bound cannot be expressed stays where it is. The result shares
    definitions between the two copies; ``dispatch_function``'s print/parse renews them."""
    root = func.body
    if not isinstance(root, SBlockRealize):
        return func
    allowed = {_identity(v) for v in symbolic_vars(func)}
    analyzer = tvm.sym.Analyzer()
    body = _unswitch_stmt(root.block.body, allowed, UNSWITCH_DEPTH, analyzer,
                          above=_above_intermediates(root.block))
    body = _chunk_partial_vectors(body, allowed, analyzer)
    if body.same_as(root.block.body):
        return func
    block = _rebuild_block(root.block, body=body)
    return func.with_body(SBlockRealize(root.iter_values, root.predicate, block))


VECTOR_CHUNKS = (16, 4)
"""Lanes per chunk of a partial vector tile, then per chunk of the chunk that straddles the
end (one AVX-512 float32 register, two AVX2 ones; then one SSE register)."""


def _chunk_partial_vectors(stmt, defined: set, analyzer) -> tirx.Stmt:
    """``stmt`` with each vectorised loop whose blocks are predicated on its own lanes run
    in chunks of ``VECTOR_CHUNKS`` lanes, every full chunk without the predicate.

    What unswitching leaves predicated is the partial tile: a 64-lane vector tile over
    ``n`` with lanes past ``n``. TVM cannot vectorise a predicated body and runs the
    whole tile as a scalar loop; the BERT layer's q k^T at n=300 (bucket 256, its
    last column tile 44 of 64 lanes) ran 7x slower than at n=256 (Zen 4). In chunks,
    only the lanes of the one chunk that straddles ``n`` run scalar, and chunks wholly
    past ``n`` are skipped."""
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_chunk_partial_vectors(s, defined, analyzer) for s in stmt.seq]
        if all(a.same_as(b) for a, b in zip(parts, stmt.seq)):
            return stmt
        return tirx.SeqStmt(parts)
    if isinstance(stmt, tirx.IfThenElse):
        then = _chunk_partial_vectors(stmt.then_case, defined, analyzer)
        other = None if stmt.else_case is None else \
            _chunk_partial_vectors(stmt.else_case, defined, analyzer)
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if not isinstance(stmt, tirx.For):
        return stmt
    if stmt.kind == tirx.ForKind.VECTORIZED:
        return _vector_chunks(stmt, defined, analyzer, VECTOR_CHUNKS)
    body = _chunk_partial_vectors(stmt.body, defined | {_identity(stmt.loop_var)}, analyzer)
    if body.same_as(stmt.body):
        return stmt
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                    stmt.thread_binding, stmt.annotations)


def _vector_chunks(loop: tirx.For, defined: set, analyzer, widths: Sequence[int]
                   ) -> tirx.Stmt:
    """A vectorised ``loop`` as ``for c: if <chunk c full>: <chunk without predicates>
    else: <chunk>``, each chunk ``widths[0]`` vectorised lanes, the partial chunk in
    turn in chunks of ``widths[1]``, and so on; ``loop`` itself when its extent is no
    multiple of the chunk or no predicate depends on its lanes."""
    if not widths:
        return loop
    width = widths[0]
    var = loop.loop_var
    extent = loop.extent
    if not isinstance(extent, tirx.IntImm) or int(extent.value) <= width or \
            int(extent.value) % width or not isinstance(loop.min, tirx.IntImm) or \
            int(loop.min.value) != 0:
        return _vector_chunks(loop, defined, analyzer, widths[1:])
    if not any(_identity(v) == _identity(var) for realize, _ in
               _predicated_blocks(loop.body, []) for v in _vars_in(realize.predicate)):
        return loop
    dtype = _dtype(var)
    chunk = tirx.Var(f"{var.name}_c", dtype)
    lane = tirx.Var(f"{var.name}_l", dtype)
    body = _substitute(loop.body, var, chunk * tirx.IntImm(dtype, width) + lane)
    inner = tirx.For(lane, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, width),
                     tirx.ForKind.VECTORIZED, body, loop.thread_binding, loop.annotations)
    inside = defined | {_identity(chunk)}
    terms, bounded, empty = _full_tile_guard(inner, inside, analyzer)
    if not terms:
        return loop
    body = _full_or_partial(terms, _strip_predicates(inner, bounded),
                            _vector_chunks(inner, inside, analyzer, widths[1:]), empty)
    return tirx.For(chunk, tirx.IntImm(dtype, 0),
                    tirx.IntImm(dtype, int(extent.value) // width), tirx.ForKind.SERIAL, body)


def _full_or_partial(terms: list, fast, slow, empty) -> tirx.Stmt:
    """``if <all terms>: fast else: slow``, ``slow`` skipped under ``empty`` (a tile wholly
    past n, the rest of a partial one, does nothing)."""
    if empty is not None:
        slow = tirx.IfThenElse(tirx.Not(empty), slow, None)
    guard = terms[0]
    for term in terms[1:]:
        guard = tirx.And(guard, term)
    return tirx.IfThenElse(guard, fast, slow)


def _substitute(stmt, var: tirx.Var, value) -> tirx.Stmt:
    """``stmt`` with ``value`` for ``var`` (TVM 0.27 exposes no substitution to Python;
    specialising a function of ``var`` is one)."""
    return tirx.PrimFunc([var], stmt).specialize({var: value}).body


def _identity(node) -> int:
    """A key for a TIR node that is equal exactly for the same node (``same_as``): the
    hash of a TVM object is its handle's."""
    return hash(node)


def _unswitch_stmt(stmt, defined: set, depth: int, analyzer, tested: tuple = (),
                   above: frozenset = frozenset()) -> tirx.Stmt:
    """``stmt`` with full-tile tests at up to ``depth`` nested loop levels of each nest;
    ``tested``: the tests already made around it (not repeated inside); ``above``: loops
    that get no test (``_above_intermediates``)."""
    if depth <= 0:
        return stmt
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_unswitch_stmt(s, defined, depth, analyzer, tested, above) for s in stmt.seq]
        if all(a.same_as(b) for a, b in zip(parts, stmt.seq)):
            return stmt
        return tirx.SeqStmt(parts)
    if not isinstance(stmt, tirx.For) or stmt.kind == tirx.ForKind.VECTORIZED:
        return stmt
    inner_defined = defined | {_identity(stmt.loop_var)}
    terms, bounded, empty = ([], {}, None) if _identity(stmt) in above else \
        _full_tile_guard(stmt.body, inner_defined, analyzer, tested)
    if not terms:
        body = _unswitch_stmt(stmt.body, inner_defined, depth, analyzer, tested, above)
    else:
        tested = tested + tuple(terms)
        fast = _unswitch_stmt(_strip_predicates(stmt.body, bounded), inner_defined,
                              depth - 1, analyzer, tested, above)
        slow = _unswitch_stmt(stmt.body, inner_defined, depth - 1, analyzer, tested, above)
        body = _full_or_partial(terms, fast, slow, empty)
    if body.same_as(stmt.body):
        return stmt
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                    stmt.thread_binding, stmt.annotations)


def _above_intermediates(root: SBlock) -> frozenset:
    """The loops (``_identity``) that enclose, strictly, the innermost loop holding every
    access of one of ``root``'s intermediate buffers.

    TVM allocates an intermediate at the innermost loop that holds all its accesses and
    compacts it to what one iteration there touches: a matmul computed at a column tile of
    the mask that follows it is a tile of 2 x 4 x 256 floats, in L1. A full-tile test at a
    loop above that one splits the accesses into two copies of the loop nest, so the
    intermediate moves up to the test's loop and grows to the whole symbolic region (the
    Llama block's q k^T + causal mask at n=256: 2 x 508 x 256 floats, 3.5x slower than with
    the test inside the tile loop, Zen 4)."""
    intermediates = {_identity(b) for b in root.alloc_buffers}
    paths: dict[int, list] = {}

    def visit(stmt, loops: list) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, loops)
        elif isinstance(stmt, tirx.For):
            visit(stmt.body, loops + [_identity(stmt)])
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case, loops)
            if stmt.else_case is not None:
                visit(stmt.else_case, loops)
        elif isinstance(stmt, SBlockRealize):
            block = stmt.block
            for region in list(block.reads) + list(block.writes):
                key = _identity(region.source)
                if key in intermediates:
                    path = paths.get(key)
                    paths[key] = loops if path is None else _common_prefix(path, loops)
            visit(block.body, loops)
            if block.init is not None:
                visit(block.init, loops)

    visit(root.body, [])
    return frozenset(loop for path in paths.values() for loop in path[:-1])


def _common_prefix(a: list, b: list) -> list:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _full_tile_guard(body, defined: set, analyzer, tested: tuple = ()):
    """``(tests, {block realize: predicate terms left}, empty)``: the tests that, all true,
    make the predicate terms of the blocks in ``body`` they cover hold at every iteration of
    the loops inside ``body``; ``([], {}, None)`` when they cover none. A test among
    ``tested`` (made around ``body`` already) covers nothing here. ``empty``: a condition
    under which no block in ``body`` runs at all (one covered term false at every inner
    iteration of every block: the chunks of a partial tile wholly past ``n``), or None.

    A term is covered when its upper bound over the loops inside is expressible in the
    variables defined outside, and it varies only with inner loops of constant extent: a
    term over a loop of symbolic extent (a chunk index up to ``ceil(n / 16)``) holds for
    all chunks only when the tile divides ``n``, so it is left to that loop's own body."""
    terms, bounded = [], {}
    # per block, the conditions under which it never runs; ``body`` is empty under one they
    # all share (a block without a predicate always runs: then nothing is shared)
    never: list[list] | None = [] if _all_blocks_predicated(body) else None
    for realize, loops in _predicated_blocks(body, []):
        dom = {loop.loop_var: tvm.sym.IntervalSet(loop.min, loop.min + loop.extent - 1)
               for loop in loops}
        symbolic_loops = {_identity(loop.loop_var) for loop in loops
                          if not isinstance(loop.extent, tirx.IntImm)}
        left, dead = [], []
        all_terms = _conjuncts(realize.predicate)
        for term in all_terms:
            diff = _as_negative(term)  # term holds iff diff < 0
            bound = None
            if diff is not None and not any(_identity(v) in symbolic_loops
                                            for v in _vars_in(diff)):
                span = analyzer.int_set(diff, dom)
                bound, low = span.max_value, span.min_value
                if not all(_identity(v) in defined for v in _vars_in(bound)):
                    bound = None  # infinite, or depends on the loops inside
                elif all(_identity(v) in defined for v in _vars_in(low)):
                    dead.append(analyzer.simplify(low >= tirx.IntImm(str(low.ty), 0)))
            if bound is None:
                left.append(term)
                continue
            test = analyzer.simplify(bound < tirx.IntImm(str(bound.ty), 0))
            if any(tvm_ffi.structural_equal(test, t) for t in tested):
                left.append(term)  # false here, or it would have been stripped
                continue
            if not any(tvm_ffi.structural_equal(test, t) for t in terms):
                terms.append(test)
        if len(left) < len(all_terms):
            bounded[_identity(realize)] = left
        if never is not None:
            never.append(dead)
    if not terms:
        return [], {}, None
    shared = [c for c in never[0] if all(any(tvm_ffi.structural_equal(c, d) for d in other)
                                          for other in never[1:])] if never else []
    return terms, bounded, (shared[0] if shared else None)


def _all_blocks_predicated(stmt) -> bool:
    """Whether every block under ``stmt`` (but the root) has a predicate."""
    realizes: list = []
    tvm_ffi.structural_walk(stmt, [(SBlockRealize, realizes.append)])
    return bool(realizes) and all(not _is_true(r.predicate) for r in realizes)


def _predicated_blocks(stmt, loops: list) -> list:
    """``(realize, enclosing loops inside stmt)`` of every block with a predicate."""
    out = []
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            out += _predicated_blocks(s, loops)
    elif isinstance(stmt, tirx.For):
        out += _predicated_blocks(stmt.body, loops + [stmt])
    elif isinstance(stmt, tirx.IfThenElse):
        out += _predicated_blocks(stmt.then_case, loops)
        if stmt.else_case is not None:
            out += _predicated_blocks(stmt.else_case, loops)
    elif isinstance(stmt, SBlockRealize):
        if not _is_true(stmt.predicate):
            out.append((stmt, loops))
        out += _predicated_blocks(stmt.block.body, loops)
        if stmt.block.init is not None:
            out += _predicated_blocks(stmt.block.init, loops)
    return out


def _strip_predicates(stmt, bounded: dict):
    """``stmt`` with the predicates of the blocks in ``bounded`` replaced by what is left
    of them (their unbounded terms)."""
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_strip_predicates(s, bounded) for s in stmt.seq])
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                        _strip_predicates(stmt.body, bounded), stmt.thread_binding,
                        stmt.annotations)
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, _strip_predicates(stmt.then_case, bounded),
                               None if stmt.else_case is None else
                               _strip_predicates(stmt.else_case, bounded))
    if isinstance(stmt, SBlockRealize):
        block = stmt.block
        block = _rebuild_block(block, body=_strip_predicates(block.body, bounded),
                               init=None if block.init is None else
                               _strip_predicates(block.init, bounded))
        predicate = stmt.predicate
        if _identity(stmt) in bounded:
            left = bounded[_identity(stmt)]
            predicate = tirx.const(True, "bool")
            for term in left:
                predicate = term if _is_true(predicate) else tirx.And(predicate, term)
        return SBlockRealize(stmt.iter_values, predicate, block)
    return stmt


def _rebuild_block(block, body, init=None):
    return SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                  init if init is not None else block.init, block.alloc_buffers,
                  block.match_buffers, block.annotations)


def _conjuncts(expr) -> list:
    if isinstance(expr, tirx.And):
        return _conjuncts(expr.a) + _conjuncts(expr.b)
    return [expr]


def _as_negative(term):
    """An expression ``d`` with ``term`` true iff ``d < 0``, or None."""
    if isinstance(term, tirx.LT):
        return term.a - term.b
    if isinstance(term, tirx.LE):
        return term.a - term.b - 1
    if isinstance(term, tirx.GT):
        return term.b - term.a
    if isinstance(term, tirx.GE):
        return term.b - term.a - 1
    return None


def _is_true(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 1


# ------------------------------------------------------------------------------------------
# The dispatching function

def dispatch_function(func: tirx.PrimFunc,
                      branches: Sequence[tuple[Mapping[str, int], tirx.PrimFunc | None]],
                      hinted: Mapping[str, Sequence[int]] | None = None,
                      served: Sequence[Sequence[Sequence[int]]] | None = None
                      ) -> tirx.PrimFunc:
    """One PrimFunc with ``func``'s signature that runs, for each symbolic value, the branch
    of the nearest bucket, and ``func``'s own body above the largest one.

    ``branches`` are ``(sizes, function)`` pairs, smallest first. A variable at size ``s``
    serves values up to ``upper_limit`` (the geometric mean of ``s`` and the next larger
    hinted size -- the branches' sizes, or ``hinted`` when given: nearest on a log scale;
    ``s`` itself for the largest). The first branch whose variables are all within their
    limits runs. A branch whose function is None runs ``func``'s body (its bucket's best
    record is the untuned function). Every branch function must be ``func`` scheduled
    (same parameters).

    ``served`` (a function of one symbolic variable only; ``dispatch_plan``): per branch,
    the ``[low, high]`` ranges of values it serves instead, measured; values in no range
    run ``func``'s body."""
    variables = {v.name: v for v in symbolic_vars(func)}
    if hinted is None:
        hinted = {name: sorted({int(sizes[name]) for sizes, _ in branches if name in sizes})
                  for name in variables}
    if served is not None and len(variables) != 1:
        raise ValueError("served ranges need a function of one symbolic variable, not "
                         f"{sorted(variables)}")
    body = func.body
    for index in reversed(range(len(branches))):
        sizes, branch = branches[index]
        if served is not None:
            if branch is None:
                continue  # its values (if any) run func's own body
            branch = _same_params(branch, func)
            (var,) = variables.values()
            # one copy of the branch per run of adjacent ranges, its intermediates sized for
            # that run: bucket 16's kernel serving n=16 and n=513..1023 with intermediates for
            # 1023 made the Llama block's RMSNorm 0.003 -> 0.19 ms at n=16 in the model
            for low, high in reversed(_merged(served[index])):
                body = tirx.IfThenElse(_in_range(var, low, high),
                                       _mark_bounds(branch.body, {var.name: high}, variables),
                                       body)
            continue
        cond, limits = None, {}
        for name, size in sizes.items():
            var = variables[name]
            limits[name] = upper_limit(int(size), hinted.get(name, [size]))
            term = var <= tirx.IntImm(_dtype(var), limits[name])
            cond = term if cond is None else tirx.And(cond, term)
        branch = _same_params(func if branch is None else branch, func)
        body = tirx.IfThenElse(cond, _mark_bounds(branch.body, limits, variables), body)
    # The branches share loop variables and intermediate buffers with each other and with
    # ``func``, which the compiler rejects. TVMScript prints each definition site as its own
    # allocation, and parsing gives each its own object (TVM's ConvertSSA renames the loop
    # variables but not the blocks' buffers; RenewDefs renews the parameters too).
    text = tvm.IRModule({"main": func.with_body(body)}).script()
    return tvm.script.from_source(_bound_intermediates(text))["main"]


def _merged(ranges: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The inclusive ``[low, high]`` ``ranges`` sorted, adjacent and overlapping ones
    merged."""
    merged: list[list[int]] = []
    for low, high in sorted((int(a), int(b)) for a, b in ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [(low, high) for low, high in merged]


def _in_range(var: tirx.Var, low: int, high: int):
    """The condition ``low <= var <= high`` (for a size, ``var <= high`` when ``low`` is 1)."""
    value = lambda x: tirx.IntImm(_dtype(var), x)  # noqa: E731
    if low == high:
        return var == value(low)
    if low <= 1:
        return var <= value(high)
    return tirx.And(value(low) <= var, var <= value(high))


BOUNDS_KEY = "relax_tune.bounded_intermediates"
"""Root-block annotation of a dispatch branch, ``{var name: "T.int64(limit)"}``, read and
removed by ``_bound_intermediates`` (TVMScript text)."""


def _mark_bounds(stmt, limits: Mapping[str, int], variables: Mapping) -> tirx.Stmt:
    """``stmt`` (a branch's root block) annotated with the largest value of each symbolic
    variable its branch serves."""
    if not isinstance(stmt, SBlockRealize):
        return stmt
    block = stmt.block
    annotations = dict(block.annotations)
    annotations[BOUNDS_KEY] = {name: f"T.{_dtype(variables[name])}({int(limit)})"
                               for name, limit in limits.items()}
    block = SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body,
                   block.init, block.alloc_buffers, block.match_buffers, annotations)
    return SBlockRealize(stmt.iter_values, stmt.predicate, block)


_ATTR_LINE = re.compile(r"^(\s*)T\.sblock_attr\((\{.*\})\)\s*$")
_BOUNDS_ENTRY = re.compile('"' + re.escape(BOUNDS_KEY) + r'": (\{[^{}]*\})(, )?')
_ALLOC_LINE = re.compile(r"^(\s*)\w+ = T\.sblock_alloc_buffer\(")


def _bound_intermediates(text: str) -> str:
    """The dispatch function's TVMScript ``text`` with each branch's intermediate buffers
    sized for the largest value its branch serves.

    An intermediate of shape ``(1, 8, n, n)`` allocated in a branch that runs for
    ``n <= 362`` becomes ``(1, 8, 362, 362)``: every access stays below ``n``. What matters is
    what TVM's buffer compaction makes of it: a tile of a symbolic buffer comes out as
    ``(2, min(n, 64), min(n, 256))`` with symbolic strides, which cost the Llama block's
    q k^T + causal mask 3.5x over the static kernel at the bucket's own size (1.56 ms vs
    0.45 ms at n = 256, Zen 4); with a constant shape the tile is constant too. Only
    dimensions that are exactly a symbolic variable are replaced (anything else is left
    symbolic). Text, because TVM 0.27 has no Python mutator to re-point a buffer's uses."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        match = _ATTR_LINE.match(lines[i])
        entry = _BOUNDS_ENTRY.search(lines[i]) if match else None
        if entry is None:
            out.append(lines[i])
            i += 1
            continue
        limits = ast.literal_eval(entry.group(1))
        rest = (lines[i][:entry.start()] + lines[i][entry.end():]).replace(", }", "}")
        if not rest.endswith("T.sblock_attr({})"):
            out.append(rest)
        i += 1
        indent = match.group(1)
        # the block's allocations follow its attributes at the same indentation
        while i < len(lines) and (alloc := _ALLOC_LINE.match(lines[i])) and \
                alloc.group(1) == indent:
            out.append(indent + _bounded_alloc(lines[i].strip(), limits))
            i += 1
    return "\n".join(out) + "\n"


def _bounded_alloc(line: str, limits: Mapping[str, str]) -> str:
    """An allocation line ``name = T.sblock_alloc_buffer((d0, d1, ...), ...)`` with each
    dimension that is exactly a variable of ``limits`` replaced by its limit; unchanged
    when no dimension is."""
    tree = ast.parse(line)
    shape = tree.body[0].value.args[0]
    if not isinstance(shape, ast.Tuple):
        return line
    changed = False
    for k, dim in enumerate(shape.elts):
        if isinstance(dim, ast.Name) and dim.id in limits:
            shape.elts[k] = ast.parse(limits[dim.id], mode="eval").body
            changed = True
    return ast.unparse(tree) if changed else line



# ------------------------------------------------------------------------------------------
# One bucket's branch as it runs, for measuring it

DISPATCH_KEY = "relax_tune.dispatch"
"""Function attribute of a symbolic workload sent to a build worker: build the dispatch of
one bucket (``{"sizes": {var: size}, "hinted": {var: [sizes]}}``, and ``"serves": [[low,
high], ...]`` when it serves those ranges, ``dispatch_plan``) instead of replaying
the trace on the workload itself (``dispatch_workload``, ``dispatch_module``)."""


def dispatch_workload(symbolic: tvm.IRModule, sizes: Mapping[str, int],
                      hinted: Mapping[str, Sequence[int]],
                      serves: Sequence[Sequence[int]] | None = None) -> tvm.IRModule:
    """The symbolic workload ``symbolic`` marked to be built as the dispatch of its bucket at
    ``sizes`` (limits from all ``hinted`` sizes; or the ``[low, high]`` ranges ``serves``,
    ``dispatch_function``'s ``served``) by a build worker (``dispatch_module``)."""
    spec = {"sizes": {str(k): int(v) for k, v in sizes.items()},
            "hinted": {str(k): [int(x) for x in v] for k, v in hinted.items()}}
    if serves is not None:
        spec["serves"] = [[int(low), int(high)] for low, high in serves]
    return tvm.IRModule({"main": symbolic["main"].with_attr(DISPATCH_KEY, json.dumps(spec))})


def dispatch_module(mod: tvm.IRModule, trace_json: list | None) -> tvm.IRModule | None:
    """What ``ApplyDatabase`` makes of one record of a bucket, for a workload marked by
    ``dispatch_workload``: the dispatch whose bucket branch is ``trace_json`` replayed on the
    symbolic function (None: the untuned function), every other size running the untuned
    body. None when ``mod`` is not marked. Raises when the trace does not replay."""
    func = mod["main"]
    if func.attrs is None or DISPATCH_KEY not in func.attrs:
        return None
    spec = json.loads(str(func.attrs[DISPATCH_KEY]))
    base = tvm.IRModule({"main": func.without_attr(DISPATCH_KEY)})
    if trace_json is None:
        return base
    sizes = {k: int(v) for k, v in spec["sizes"].items()}
    branch = replay_symbolic(base, trace_json, sizes)
    served = [spec["serves"]] if "serves" in spec else None
    return tvm.IRModule({"main": dispatch_function(base["main"], [(sizes, branch)],
                                                   spec["hinted"], served)})


def upper_limit(size: int, sizes: Sequence[int]) -> int:
    """The largest value the bucket at ``size`` serves among the hinted ``sizes``: up to the
    geometric mean with the next larger size (the nearest bucket on a log scale), ``size``
    itself for the largest (above it the untuned function runs)."""
    larger = [s for s in sorted(sizes) if s > size]
    if not larger:
        return int(size)
    return max(int(size), int(math.isqrt(int(size) * larger[0])))


def _same_params(branch: tirx.PrimFunc, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``branch``, checked to be ``func`` scheduled: the very same parameters."""
    if len(branch.params) != len(func.params) or not all(
            a.same_as(b) for a, b in zip(branch.params, func.params)):
        raise RelaxTuneError("a dispatch branch does not share the function's parameters")
    return branch


def _dtype(var: tirx.Var) -> str:
    """The integer type of a symbolic variable (``Var.ty`` in TVM 0.27)."""
    return str(var.ty)
