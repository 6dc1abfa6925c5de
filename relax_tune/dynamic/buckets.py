"""A symbolic function's buckets: its symbolic variables, and the function at one size.

A TIR function whose parameter shapes hold a symbolic variable (a sequence length ``n``)
cannot be scheduled for one size. It is tuned at each hinted size instead (a bucket,
``buckets_for``): the function specialised to that size (``specialize``) is one ordinary
static task, weighted like the function's call sites times the hint's weight. Records are
ordinary records of the specialised workloads, readable by MetaSchedule.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import tvm_ffi
from tvm import tirx

from ..utils import RelaxTuneError
from .hints import ShapeHints, default_sizes


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



def _dtype(var: tirx.Var) -> str:
    """The integer type of a symbolic variable (``Var.ty`` in TVM 0.27)."""
    return str(var.ty)
