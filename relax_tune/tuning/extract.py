"""Tuning tasks from a Relax or TIR module: one task per distinct TIR workload."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.s_tir import analysis as s_analysis

from ..dynamic.hints import normalize_hints
from ..dynamic.workloads import bucket_tasks, check_hint_names, upper_bounds
from ..lowering.prepare import bind_and_fold, bind_params  # noqa: F401 (bind_params re-exported)
from ..utils import (RelaxTuneError, args_info, dynamic_shape_vars, normalize_mod, parse_target,
                    structural_hash)

logger = logging.getLogger(__name__)

BYTE_FLOPS = 3.0
"""What one byte of a task's arguments counts for in ``Task.cost``, in FLOPs. A convolution
that reads and writes a large activation for few FLOPs (a depthwise one) takes far longer
in the model than its FLOPs say. Fitted on MobileNetV2 (AMD EPYC Zen 1, 2 threads):
against ONNX Runtime's own per-node times (a well-tuned kernel in place), the shares of the
model that FLOPs alone give its 30 convolution tasks are off by 0.175 in all (summed
absolute error; Spearman 0.95); FLOPs + 2 or 4 per byte, 0.067 / 0.099 (0.99); 8 per byte,
0.197 (docs/design/time-budget.md, item 10)."""

_CALL_TIR_OPS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad")


@dataclass
class Task:
    """One tuning task: a normalised single-function workload and where it is used.

    The one object a task is known by from extraction to the report: tuning keeps it in its
    per-task state, hands it to the measurement protocol, and each ``TaskReport`` carries it
    (``report.task``).

    Attributes
    ----------
    task_name: name of the first function with this workload (e.g. ``fused_matmul_add_relu``).
    mod: the workload, an IRModule holding one PrimFunc named ``main`` (see ``normalize_mod``).
    target: the target it is tuned for.
    weight: number of ``call_tir`` sites that call it (1 for a bare TIR function).
    shash: structural hash of ``mod`` (the key the database stores).
    func_names: names of the module functions that share this workload.
    shape: for a function with symbolic dimensions, the sizes this task specialises it to
        (``{"n": 16}``; ``relax_tune.dynamic``); None for a static function.
    symbolic: then also the symbolic function as ``ApplyDatabase`` replays the task's
        schedules on it (a candidate that does not replay there is of no use).
    """

    task_name: str
    mod: tvm.IRModule
    target: tvm.target.Target
    weight: int
    shash: int = 0
    func_names: list[str] = field(default_factory=list)
    shape: dict[str, int] | None = None
    symbolic: tvm.IRModule | None = field(default=None, repr=False)

    @functools.cached_property
    def args_info(self) -> list:
        """The workload's arguments, ``[["TENSOR", dtype, shape], ...]`` (what measurement
        makes inputs from and a record stores)."""
        return args_info(self.mod)

    @functools.cached_property
    def flops(self) -> float:
        """Estimated FLOPs of one call of the workload (0 when TVM cannot estimate them): for
        display, the task order, and the no-measurement compile's smallest tiled task
        (``tuning.predict.MIN_TILED_FLOPS``)."""
        try:
            return float(s_analysis.estimate_tir_flops(self.mod))
        except Exception:  # estimate_tir_flops rejects some opaque functions
            return 0.0

    @functools.cached_property
    def cost(self) -> float:
        """What a call of the task costs before anything is measured, in FLOPs: its FLOPs
        plus ``BYTE_FLOPS`` for each byte of its arguments (each read or written once a
        call). The order a session takes tasks in until their first measurements (and the
        no-measurement compile's order) follows it."""
        size = 0
        for arg in self.args_info:
            if arg[0] == "TENSOR" and all(isinstance(d, int) for d in arg[2]):
                size += tvm.DataType(arg[1]).bits // 8 * math.prod(arg[2])
        return self.flops + BYTE_FLOPS * size


ExtractedTask = Task
"""The former name of ``Task`` (kept for scripts that import it)."""


def call_tir_counts(mod: tvm.IRModule) -> dict[str, int]:
    """Number of ``call_tir`` sites per callee name over all Relax functions of ``mod``."""
    ops = [tvm.ir.Op.get(name) for name in _CALL_TIR_OPS]
    counts: dict[str, int] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and any(expr.op.same_as(op) for op in ops):
            callee = expr.args[0]
            if isinstance(callee, tvm.ir.GlobalVar):
                counts[callee.name_hint] = counts.get(callee.name_hint, 0) + 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def _has_relax_functions(mod: tvm.IRModule) -> bool:
    return any(isinstance(f, relax.Function) for _, f in mod.functions.items())


def matches_op_names(name: str, op_names: Sequence[str] | None) -> bool:
    """True when ``op_names`` is empty/None or ``name`` contains any of its strings."""
    return not op_names or any(op in name for op in op_names)


def check_op_names(op_names: Sequence[str] | None, names: Iterable[str]) -> None:
    """Raise a clear error for an ``op_names`` entry that matches none of ``names``."""
    if not op_names:
        return
    if isinstance(op_names, str):
        raise RelaxTuneError(f"op_names must be a list of strings, not the string {op_names!r}; "
                             f"write op_names=[{op_names!r}]")
    names = list(names)
    unknown = [op for op in op_names if not any(op in n for n in names)]
    if unknown:
        raise RelaxTuneError(
            f"op_names {unknown} match no tunable function; the module has: "
            f"{', '.join(sorted(set(names))) or '(none)'}")


def extract_tasks(mod: tvm.IRModule, target=None, op_names: Sequence[str] | None = None,
                  params: dict | None = None, shape_hints=None) -> list[Task]:
    """List the tunable tasks of ``mod``.

    For a module with Relax functions, a task is a PrimFunc called through ``call_tir``
    (weight = number of call sites; functions nobody calls are ignored). For a TIR-only
    module every PrimFunc is a task of weight 1. Functions with the same normalised
    workload (structural hash + structural equality) are one task. Functions already marked
    ``tirx.is_scheduled`` are skipped with a log line naming them.

    A function with symbolic dimensions (a sequence length ``n``) becomes one task per
    hinted size, ``name[n=16]``: the function specialised to that size, weighted by its call
    sites times the hint's weight (``relax_tune.dynamic``). A function that cannot be
    specialised (a dimension computed from ``n``) is skipped with a log line.

    Parameters
    ----------
    mod: a Relax module after legalization (e.g. ``relax.get_pipeline("zero")``), or TIR.
    target: Target, target string/dict, or None for the ``with target:`` scope.
    op_names: keep only tasks whose name contains any of these strings; an entry that
        matches no function raises ``RelaxTuneError``.
    params: optional ``{name: array}`` bound into the Relax functions, and what depends
        only on them folded, before extraction (``prepare.bind_and_fold``).
    shape_hints: ``{"n": [1, 16, 64]}`` or ``{"n": {16: 2.0, 64: 1.0}}`` (size: weight):
        the sizes each symbolic variable is tuned at; a variable without a hint takes
        ``relax_tune.dynamic.default_sizes`` (1 and powers of 4 up to its
        ``tir_var_upper_bound``, or up to 1024).
    """
    if not isinstance(mod, tvm.IRModule):
        raise RelaxTuneError(f"extract_tasks expects a tvm.IRModule, not {type(mod).__name__}")
    target = parse_target(target)
    hints = normalize_hints(shape_hints)
    mod = bind_and_fold(mod, params, target)
    bounds = upper_bounds(mod)
    relax_mod = _has_relax_functions(mod)
    counts = call_tir_counts(mod) if relax_mod else {}

    candidates: list[tuple[str, tirx.PrimFunc, int]] = []
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tirx.PrimFunc):
            continue
        name = gv.name_hint
        weight = counts.get(name, 0) if relax_mod else 1
        if weight == 0:
            continue
        candidates.append((name, func, weight))
    if relax_mod and not candidates:
        logger.warning("no call_tir sites found: was the module legalized? "
                       "Run relax.get_pipeline('zero') (or LegalizeOps + FuseOps + FuseTIR) first")
    check_op_names(op_names, [name for name, _, _ in candidates])
    check_hint_names(hints, [func for _, func, _ in candidates])

    tasks: list[Task] = []
    by_hash: dict[int, list[Task]] = {}
    for name, func, weight in candidates:
        if not matches_op_names(name, op_names):
            continue
        if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
            logger.info("skipping %s: already scheduled (tirx.is_scheduled)", name)
            continue
        if dynamic_shape_vars(func):  # one task per bucket (relax_tune.dynamic.workloads)
            for b in bucket_tasks(name, func, weight, target, hints, bounds):
                _add_task(tasks, by_hash, name, b.workload, b.weight, target,
                          task_name=b.task_name, shape=b.shape, symbolic=b.symbolic)
            continue
        _add_task(tasks, by_hash, name, normalize_mod(func), weight, target)
    return tasks


def _add_task(tasks: list[Task], by_hash: dict[int, list[Task]], name: str,
              workload: tvm.IRModule, weight, target, task_name: str | None = None,
              shape: dict[str, int] | None = None,
              symbolic: tvm.IRModule | None = None) -> None:
    """A new task for ``workload``, or more weight for the task that already has it."""
    shash = structural_hash(workload)
    same = next((t for t in by_hash.get(shash, [])
                 if tvm_ffi.structural_equal(t.mod, workload)), None)
    if same is not None:
        same.weight += weight
        same.func_names.append(name)
        return
    task = Task(task_name=task_name or name, mod=workload, target=target, weight=weight,
                shash=shash, func_names=[name], shape=shape, symbolic=symbolic)
    by_hash.setdefault(shash, []).append(task)
    tasks.append(task)
