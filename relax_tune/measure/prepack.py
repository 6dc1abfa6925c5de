"""Candidates with packed weights, at measurement time.

A candidate whose schedule rewrites a weight's layout is built as two functions (see
``relax_tune.space.cpu.layout_rewrite.split_layout_rewrite``): ``main`` reads the packed weight,
the packing function makes it. In a compiled model the packing runs once at compile time, so
the runner must not time it: it packs the inputs once, then times ``main``. The plan travels
as a small JSON file next to the artifact, so every runner (local or RPC) finds it.
"""

from __future__ import annotations

import json
import os
from typing import Any

SUFFIX = ".prepack.json"


def plan_path(artifact: str) -> str:
    """Where the packing plan of ``artifact`` lives."""
    return artifact + SUFFIX


def write_plan(artifact: str, plan: dict) -> None:
    """Store ``plan`` (``PrepackPlan.to_json()``) next to ``artifact``."""
    with open(plan_path(artifact), "w", encoding="utf-8") as f:
        json.dump(plan, f)


def read_plan(artifact: str) -> dict | None:
    """The packing plan stored next to ``artifact``, None for a candidate without one."""
    try:
        with open(plan_path(artifact), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def remove_plan(artifact: str) -> None:
    """Delete ``artifact``'s plan if it has one."""
    try:
        os.remove(plan_path(artifact))
    except OSError:
        pass


def packed_args(module: Any, args: list, plan: dict | None, dev: Any) -> list:
    """``args`` for ``main`` with the weights the plan names replaced by their packed form
    (made by one call of the plan's packing function on ``dev``). ``args`` is not changed,
    so the caller keeps the original-layout tensors (outputs are shared)."""
    if not plan:
        return args
    import tvm

    packed = [tvm.runtime.empty(shape, dtype, dev)
              for shape, dtype in zip(plan["shapes"], plan["dtypes"])]
    module[plan["func"]](*[args[i] for i in plan["args"]], *packed)
    out = list(args)
    for i, tensor in zip(plan["args"], packed):
        out[i] = tensor
    return out


def packed_kernel(scheduled: Any, target: Any, args: list) -> tuple[Any, list]:
    """``(lib, args for lib["main"])`` of a scheduled workload, built as the tuner's builder
    builds it: a schedule that packs a weight (layout rewrite) is split, the weight packed
    once here, and only the kernel is left to time (as in a model, where the packing runs at
    compile time). ``args`` (``main``'s, outputs last) are not changed."""
    import tvm

    from ..space.cpu.layout_rewrite import measurable_module

    measured, plan = measurable_module(scheduled["main"])
    lib = tvm.compile(measured, target).mod
    return lib, packed_args(lib, args, plan, tvm.cpu())
