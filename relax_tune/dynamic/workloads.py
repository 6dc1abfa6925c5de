"""The tasks of a symbolic function: its bucket workloads, as extraction and apply see them.

``extract_tasks`` turns a function with symbolic dimensions into one task per bucket
(``bucket_tasks``); ``ApplyDatabase`` looks its records up at the same workloads
(``dynamic_workloads``). Both take the variables' upper bounds from the Relax functions
(``upper_bounds``) and the function without ``layout_free_buffers`` (``dynamic_base``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from ..utils import RelaxTuneError, dynamic_shape_vars, normalize_mod
from .buckets import Bucket, buckets_for, specialize, symbolic_vars

logger = logging.getLogger(__name__)


def upper_bounds(mod: tvm.IRModule) -> dict[str, int]:
    """``{var name: bound}`` from the ``tir_var_upper_bound`` attributes of the Relax
    functions of ``mod`` (the smallest bound when several functions give one)."""
    out: dict[str, int] = {}
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function) or func.attrs is None:
            continue
        bounds = func.attrs.get("tir_var_upper_bound", None)
        for name, value in (bounds.items() if bounds is not None else []):
            value = int(value.value if hasattr(value, "value") else value)
            out[str(name)] = min(out.get(str(name), value), value)
    return out


def dynamic_workloads(func: tirx.PrimFunc, shape_hints=None,
                      bounds: dict[str, int] | None = None
                      ) -> list[tuple[Bucket, tvm.IRModule]]:
    """The specialised workloads of a function with symbolic dimensions: one per bucket
    (``buckets_for``), smallest first. Weights are not marked layout-free in them:
    the buckets of one function share its weights, so none may repack them for itself.
    ``RelaxTuneError`` when the function cannot be specialised."""
    func = dynamic_base(func)
    return [(b, normalize_mod(specialize(func, dict(b.sizes))))
            for b in buckets_for(func, shape_hints, bounds)]


def dynamic_base(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A symbolic function as its buckets are tuned and replayed: without
    ``layout_free_buffers``."""
    if func.attrs is not None and "layout_free_buffers" in func.attrs:
        return func.without_attr("layout_free_buffers")
    return func


def check_hint_names(hints, funcs: Iterable[tirx.PrimFunc]) -> None:
    """A shape hint must name a symbolic variable of the module (its functions ``funcs``):
    raise ``RelaxTuneError`` listing the ones it has (a misspelling would otherwise tune the
    default sizes)."""
    if not hints:
        return
    names = sorted({str(v.name) for func in funcs for v in symbolic_vars(func)})
    unknown = sorted(set(hints) - set(names))
    if not unknown:
        return
    if not names:
        logger.warning("shape hints %s unused: the module has no symbolic dimension",
                       ", ".join(unknown))
        return
    raise RelaxTuneError(
        f"shape hint {', '.join(map(repr, unknown))} names no symbolic variable of the module; "
        f"it has {', '.join(names)} (a model from torch.export names its dynamic dimensions "
        "after PyTorch's symbols, e.g. s27: hint those)")


@dataclass
class BucketTask:
    """One task of a symbolic function: the function specialised at one bucket."""

    task_name: str
    """``name[n=16]``."""
    workload: tvm.IRModule
    weight: float
    """The function's call sites times the bucket's weight."""
    shape: dict[str, int]
    """The bucket's sizes, ``{"n": 16}``."""
    symbolic: tvm.IRModule
    """The symbolic function as ``ApplyDatabase`` replays the task's schedules on it."""


def bucket_tasks(name: str, func: tirx.PrimFunc, weight: int, target, hints,
                 bounds: dict[str, int]) -> list[BucketTask]:
    """One task per bucket of the function ``name`` with symbolic dimensions, called at
    ``weight`` sites; none (a logged skip) off CPU targets or when it cannot be
    specialised."""
    if target.kind.name != "llvm":  # ApplyDatabase builds the dispatch on CPU only
        logger.warning("skipping %s: dynamic shape (symbolic %s) is tuned on CPU (llvm) "
                       "targets only; %s runs its default schedule", name,
                       ", ".join(dynamic_shape_vars(func)), target.kind.name)
        return []
    try:
        specialised = dynamic_workloads(func, hints, bounds)
    except RelaxTuneError as err:
        logger.warning("skipping %s: dynamic shape (symbolic %s): %s", name,
                       ", ".join(dynamic_shape_vars(func)), err)
        return []
    unhinted = [v.name for v in symbolic_vars(func) if v.name not in (hints or {})]
    if unhinted:
        logger.info("%s: symbolic %s tuned at the default sizes %s (give shape_hints / "
                    "--dynamic to choose them)", name, ", ".join(unhinted),
                    ", ".join(sorted({b.label for b, _ in specialised},
                                     key=lambda x: [int(p.split("=")[1]) for p in x.split(",")])))
    symbolic = normalize_mod(dynamic_base(func))
    out = []
    for bucket, workload in specialised:
        w = weight * bucket.weight
        out.append(BucketTask(f"{name}[{bucket.label}]", workload,
                              int(w) if float(w).is_integer() else w, dict(bucket.sizes),
                              symbolic))
    return out
