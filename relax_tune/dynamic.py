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
  function (``replay_symbolic``): tile sizes become fixed split factors with a
  ceil-divided outer loop, so the tiles are predicated and the branch is correct at every
  size, tuned for ``b``. Sizes above the largest bucket run the untuned function. A
  bucket whose best record is its baseline (the untuned function) runs the untuned body:
  never slower than untuned per bucket.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule, Trace

from .utils import RelaxTuneError

logger = logging.getLogger("relax_tune.dynamic")

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

def symbolic_trace_json(trace_json: list) -> list:
    """A static record's trace made replayable on the symbolic function: every
    ``SamplePerfectTile`` is removed and the splits that used it get its decided factors
    as literals, the outermost as ``None`` (ceil-divided: predicated tiles on a symbolic
    loop, exactly the decided tiles on a static one)."""
    insts, decisions = trace_json
    decided = {int(i): d for i, d in decisions}
    subst: dict[str, object] = {}
    kept: list[list] = []
    new_index: dict[int, int] = {}
    for index, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind == "SamplePerfectTile":
            factors = list(decided[index])
            subst.update(zip(outputs, factors))
            subst[outputs[0]] = "None"
            continue
        new_index[index] = len(kept)
        kept.append([kind, [subst.get(x, x) if isinstance(x, str) else x for x in inputs],
                     attrs, outputs])
    return [kept, [[new_index[int(i)], d] for i, d in decisions if int(i) in new_index]]


def replay_symbolic(mod: tvm.IRModule, trace_json: list) -> tirx.PrimFunc:
    """The function of ``mod`` (a normalised symbolic workload) scheduled by a static
    record's trace (``symbolic_trace_json``). Vectorisation of loops whose extent stays
    symbolic is dropped (TVM cannot vectorise them; the loop stays a plain loop). Raises
    when the trace does not replay on symbolic extents (the caller tries the bucket's next
    record)."""
    sch = Schedule(mod, error_render_level="none")
    # Raises, e.g., for an rfactor of a reduction over n split by a factor that does not
    # divide n: TVM refuses to decompose its init (not quasi-affine), and rightly so, since
    # without the decomposition the rfactor slots past n would never be initialised.
    Trace.apply_json_to_schedule(symbolic_trace_json(trace_json), sch)
    trace = sch.trace
    drop: list[int] = []
    position = [0]

    def inspect(inst, inputs, _attrs, decision):
        # called before each instruction is applied, in trace order, on ``probe``
        if inst.kind.name == "Vectorize" and \
                not isinstance(probe.get(inputs[0]).extent, tirx.IntImm):
            drop.append(position[0])
        position[0] += 1
        return decision

    # One pass on a fresh schedule finds the Vectorize instructions on symbolic loops.
    probe = Schedule(mod, error_render_level="none")
    trace.apply_to_schedule(probe, remove_postproc=False, decision_provider=inspect)
    if not drop:
        return sch.mod["main"]
    keep = [inst for i, inst in enumerate(trace.insts) if i not in set(drop)]
    decisions = {inst: trace.get_decision(inst) for inst in keep
                 if trace.get_decision(inst) is not None}
    final = Schedule(mod, error_render_level="none")
    Trace(keep, decisions).apply_to_schedule(final, remove_postproc=False)
    return final.mod["main"]


# ------------------------------------------------------------------------------------------
# The dispatching function

def dispatch_function(func: tirx.PrimFunc,
                      branches: Sequence[tuple[Mapping[str, int], tirx.PrimFunc | None]]
                      ) -> tirx.PrimFunc:
    """One PrimFunc with ``func``'s signature that runs, for each symbolic value, the branch
    of the nearest bucket, and ``func``'s own body above the largest one.

    ``branches`` are ``(sizes, function)`` pairs, smallest first. A variable at size ``s``
    serves values up to ``upper_limit`` (the geometric mean of ``s`` and the next larger
    hinted size: nearest on a log scale; ``s`` itself for the largest). The first branch
    whose variables are all within their limits runs. A branch whose function is None runs
    ``func``'s body (its bucket's best record is the untuned function). Every branch
    function must be ``func`` scheduled (same parameters)."""
    variables = {v.name: v for v in symbolic_vars(func)}
    hinted = {name: sorted({int(sizes[name]) for sizes, _ in branches if name in sizes})
              for name in variables}
    body = func.body
    for sizes, branch in reversed(list(branches)):
        branch = _same_params(func if branch is None else branch, func)
        cond = None
        for name, size in sizes.items():
            var = variables[name]
            limit = upper_limit(int(size), hinted[name])
            term = var <= tirx.IntImm(_dtype(var), limit)
            cond = term if cond is None else tirx.And(cond, term)
        body = tirx.IfThenElse(cond, branch.body, body)
    # The branches share loop variables and intermediate buffers with each other and with
    # ``func``, which the compiler rejects. TVMScript prints each definition site as its own
    # allocation, and parsing gives each its own object (TVM's ConvertSSA renames the loop
    # variables but not the blocks' buffers; RenewDefs renews the parameters too).
    text = tvm.IRModule({"main": func.with_body(body)}).script()
    return tvm.script.from_source(text)["main"]


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
