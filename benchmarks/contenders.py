"""The contenders of the real-model benchmark as rows to time: a compiled TVM module (untuned,
MetaSchedule, relax_tune), and how rows are timed against each other (calibrated calls,
interleaved rounds, per-round ratios against ONNX Runtime and PyTorch). The alternatives to
TVM (PyTorch, ONNX Runtime, OpenVINO, torch.compile): ``benchmarks.alternatives``."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def fresh_work_dir(path: str) -> str:
    """``path`` emptied for a row that must start from no records: a work_dir left by an
    earlier run of the benchmark under the same ``--work-root`` would be resumed instead."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    return path


def relax_tune_graph_passes(target) -> list:
    """relax_tune's graph passes for ``target`` (batch norm folded into convolutions,
    channels-last convolutions on CPU, ...)."""
    from relax_tune.lowering.prepare import graph_passes

    return graph_passes(target)


@dataclass
class Row:
    """One contender of one model: how to call it, its output and its timings."""

    contender: str
    trials: str
    call: Callable[[], Any] | None
    output: np.ndarray | None = None
    tune_secs: float | None = None
    error: str | None = None
    samples: list[float] = field(default_factory=list)
    ratio_ort: list[float] = field(default_factory=list)
    ratio_torch: list[float] = field(default_factory=list)
    ratio_best: list[float] = field(default_factory=list)
    max_abs: float | None = None
    max_rel: float | None = None
    mismatch: bool = False
    number: int = 1
    warm: bool = True
    keep: Any = None  # what must outlive the call (a VM, a session, a compiled model)
    executable: Any = None  # a TVM row's compiled module (profiled in place by --per-task)


def numpy_output(out) -> np.ndarray:
    """A contender's output (a tensor, an array or the first of a tuple) as a numpy array."""
    if isinstance(out, np.ndarray):
        return out
    if hasattr(out, "numpy"):
        return out.numpy()
    if isinstance(out, (list, tuple)) or hasattr(out, "__getitem__"):
        return numpy_output(out[0])
    return np.asarray(out)


def tvm_row(contender: str, trials: str, ex, inputs_np, tune_secs=None) -> Row:
    """A row that calls the compiled TVM module ``ex``'s ``main`` on ``inputs_np``."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    func = vm["main"]
    args = [tvm.runtime.tensor(a, dev) for a in inputs_np]
    return Row(contender, trials, lambda: func(*args), tune_secs=tune_secs, keep=vm,
               executable=ex)


def compile_untuned(mod, params, target):
    """The model as TVM builds it without tuning (weights bound, the "zero" pipeline)."""
    import tvm
    from tvm import relax

    from relax_tune.lowering.prepare import bind_params

    with target:
        zero = relax.get_pipeline("zero")(bind_params(mod, params))
    return tvm.compile(zero, target)


def compile_from_work_dir(model_path: str, work_dir: str) -> tuple[Any, np.ndarray]:
    """``(executable, input)``: the ONNX model compiled with a work_dir's records through the
    "relax_tune" pipeline (nothing tuned), and a seeded input for its first input (token ids
    for an int64 one, else uniform floats)."""
    import onnx
    import tvm

    import relax_tune as rt
    from relax_tune.model_loader import load_model

    graph_input = onnx.load(model_path, load_external_data=False).graph.input[0]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, shape).astype("int64") \
        if graph_input.type.tensor_type.elem_type == onnx.TensorProto.INT64 \
        else rng.random(shape).astype("float32")
    target = rt.host_target()
    loaded = load_model(model_path)
    return tvm.compile(loaded.mod, target, relax_pipeline=loaded.compile_pipeline(
        target, work_dir, max_trials_global=0)), x


def work_dir_parser(description: str, model: str, rounds: int, calls: int):
    """The command line of a script that times a model compiled from a work_dir:
    ``model work_dir [--rounds] [--calls] [--threads]`` (parse it, then call
    ``work_dir_vm`` before anything imports tvm)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(model)
    parser.add_argument("work_dir")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--calls", type=int, default=calls)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def work_dir_vm(model_path: str, work_dir: str, threads: int) -> tuple[Any, Any, Any, np.ndarray]:
    """``(executable, vm, input tensor, input array)`` of ``compile_from_work_dir``, run by
    ``threads`` TVM threads (set before tvm's thread pool starts)."""
    import tvm
    from tvm import relax

    from relax_tune.utils import ensure_tvm_threads

    ensure_tvm_threads(threads)
    ex, x = compile_from_work_dir(model_path, work_dir)
    return ex, relax.VirtualMachine(ex, tvm.cpu()), tvm.runtime.tensor(x), x


def import_tensor_intrin() -> None:
    """MetaSchedule's builder initializer: TVM's tensor intrinsics registered in the worker."""
    import tvm.s_tir.tensor_intrin  # noqa: F401 (registers intrinsics; slow: once per worker)


def compile_metaschedule(mod, params, target, work_dir: str, trials: int, per_round: int,
                         same_graph: bool = False):
    """TVM's static_shape_tuning recipe, weights bound, cpu_weight_prepack, warm builder;
    ``same_graph``: relax_tune's graph passes first (the graph relax_tune tunes)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from relax_tune.lowering.prepare import bind_params

    with target:
        lowered = tvm.transform.Sequential([
            *(relax_tune_graph_passes(target) if same_graph else []),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.get_pipeline("zero"),
            relax.transform.AttachAttrLayoutFreeBuffers(),
        ])(bind_params(mod, params))
        if trials > 0:
            ms.relax_integration.tune_relax(
                lowered, {}, target, work_dir, trials, num_trials_per_iter=per_round,
                builder=ms.builder.LocalBuilder(initializer=import_tensor_intrin))
        applied = tvm.transform.Sequential([
            relax.transform.MetaScheduleApplyDatabase(work_dir),
            relax.transform.SplitLayoutRewritePreproc(),
            relax.transform.FoldConstant(),
        ])(lowered)
    return tvm.compile(applied, target)


def metaschedule_tasks(mod, params, target, same_graph: bool = False) -> int:
    """How many tasks MetaSchedule extracts from the model (as ``compile_metaschedule``)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from relax_tune.lowering.prepare import bind_params

    with target:
        lowered = tvm.transform.Sequential([
            *(relax_tune_graph_passes(target) if same_graph else []),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.get_pipeline("zero"),
        ])(bind_params(mod, params))
    return len(ms.relax_integration.extract_tasks(lowered, target))


# ---------------------------------------------------------------------------- timing
def calibrate(row: Row, min_secs: float) -> None:
    """Warm up, then choose how many calls fill ``min_secs`` per round."""
    row.call()
    start = time.perf_counter()
    row.call()
    once = time.perf_counter() - start
    row.number = max(1, math.ceil(min_secs / max(once, 1e-6)))
    row.warm = once < 0.25  # a slow untuned model gets no extra warm-up call per round


def time_once(row: Row) -> float:
    """One round: a warm-up call, then the mean of ``row.number`` calls (seconds per call)."""
    if row.warm:
        row.call()
    start = time.perf_counter()
    for _ in range(row.number):
        row.call()
    return (time.perf_counter() - start) / row.number


REFERENCE = "onnxruntime"
"""The contender every other row's per-round ratio is taken against (``interleave``)."""


def interleave(rows: list[Row], rounds: int, pause: float) -> None:
    """Time every row once per round (order rotating each round, ``pause`` s of sleep before
    each timing, as benchmarks/timing.py's ``interleaved``), with per-round ratios against
    ONNX Runtime and PyTorch in ``ratio_ort``/``ratio_torch``, one per timing of the row.

    ONNX Runtime (``REFERENCE``) brackets the others: it is timed before a round's first
    row and after every row, and a row's ratio is the mean of the two ONNX Runtime times
    around it over its own. This machine's speed moves within seconds (one ResNet-18 read
    19.2, 33.9 and 23.0 ms three seconds apart, Zen 3): against one ONNX Runtime time per
    round, up to nine rows away, a row's ratio took whatever the machine did in between.
    A slow row (a call of a quarter second or more: an untuned model, ``calibrate``) is
    timed in the first round only: the untuned ResNet-18's 2.2 s call stretched every round
    and set the rows whose ratio matters seconds apart."""
    live = [r for r in rows if r.call is not None and r.error is None]
    ref = next((r for r in live if r.contender == REFERENCE), None)
    others = [r for r in live if r is not ref]

    def timed(row: Row) -> float:
        time.sleep(pause)
        secs = time_once(row)
        row.samples.append(secs)
        return secs

    for rnd in range(rounds):
        shift = rnd % max(1, len(others))
        this: dict[int, float] = {}
        before = timed(ref) if ref is not None else None
        for row in others[shift:] + others[:shift]:
            if rnd and not row.warm:
                continue
            this[id(row)] = secs = timed(row)
            if ref is not None:
                after = timed(ref)
                row.ratio_ort.append((before + after) / 2 / secs)
                before = after
        if ref is not None:
            ref.ratio_ort.append(1.0)  # one a round, as every warm row's
        tor = next((this[id(r)] for r in others if r.contender == "pytorch" and id(r) in this),
                   None)
        for row in others:
            if tor is not None and id(row) in this:
                row.ratio_torch.append(tor / this[id(row)])
        if tor is not None and ref is not None:
            ref.ratio_torch.append(tor / before)
