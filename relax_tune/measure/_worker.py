"""Code that runs inside the measurement worker processes (``tvm.support.popen_pool``).

The parent sends these functions by reference (cloudpickle) together with plain arguments:
strings, numbers, lists. IR objects never cross the process boundary (pickling IR segfaults
with this TVM); the workload travels as TVMScript text and is parsed once per worker, the
target as its JSON string. Every function here catches its own errors and returns them as
text, so the pool only sees an exception for a crash (ChildProcessError) or a timeout.

The module-level caches below live in the worker processes only (one copy per worker).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm

from ..database import is_baseline
from ..space.gpu.compile import ensure_cuda_compiler
from ..space.cpu.layout_rewrite import measurable_module
from ..utils import apply_trace_json, ensure_tvm_threads, schedule_from_json
from . import cross, prepack
from .base import calls_per_repeat, short_error
from .baseline import baseline_module


def init_worker() -> None:
    """The pool initializer of the build and run workers: kernels are built and timed on
    every usable core (TVM_NUM_THREADS), and CUDA sources compile with nvcc when NVRTC is
    missing. Runs in the worker processes only; the user's own process is left alone."""
    ensure_tvm_threads()
    ensure_cuda_compiler()


BUILD_WITH_ATTR = "relax_tune.build_with"
"""Function attribute of a workload that builds itself: ``"relax_tune.module:function"``,
a function ``(mod, trace_json or None) -> IRModule | str`` the build worker calls instead
of replaying the trace on ``mod`` (or taking ``mod`` as the baseline): the module to
compile, or why the candidate cannot be built (its build error, as it is). So a workload
whose candidates are built in a way measurement knows nothing of (a symbolic function's
bucket timed as it will run) carries that way with it; only functions of ``relax_tune``
are called."""

_MAX_WORKLOADS = 32
_CLEARLY_SLOW = 3.0  # a warm-up over this many times max_secs is not called again
_WARM_UP_SECS = 0.02
"""Short kernels are called for this long before they are timed: the cores were idle
while the batch built, and the first candidate of a batch timed right away paid their
wake-up (a ResNet-18 Winograd transform recorded at 514, 392, 249 us in its three repeats,
the batch's later candidates steady)."""
_CLEARLY_SLOW_SECS = 1.0
_MAX_INPUT_SETS = 4

_workloads: "OrderedDict[str, tvm.IRModule]" = OrderedDict()
_targets: dict[str, tvm.target.Target] = {}
_inputs: "OrderedDict[str, list]" = OrderedDict()
_MAX_PREPARED = 256
_prepared: "OrderedDict[str, tuple]" = OrderedDict()
"""Candidates ``prepare_candidate`` readied for ``time_prepared``: artifact path ->
(time evaluator, arguments)."""


# --------------------------------------------------------------------------- builder side


def script_digest(text: str) -> str:
    """The key the parent sends with a text the workers cache what they make of (a
    workload's script, a sketch's JSON): equal texts, one parse per worker."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cached_workload(digest: str, script: str) -> tvm.IRModule:
    """The workload of a TVMScript text (keyed by ``script_digest``), parsed once per worker
    process and kept among the most recent ones."""
    mod = _workloads.get(digest)
    if mod is None:
        mod = tvm.script.from_source(script)
        if not isinstance(mod, tvm.IRModule):  # a bare PrimFunc script
            mod = tvm.IRModule({"main": mod})
        _workloads[digest] = mod
        while len(_workloads) > _MAX_WORKLOADS:
            _workloads.popitem(last=False)
    else:
        _workloads.move_to_end(digest)
    return mod


def cached_target(target_json: str) -> tvm.target.Target:
    """The target of a JSON text, made once per worker process."""
    target = _targets.get(target_json)
    if target is None:
        target = tvm.target.Target(json.loads(target_json))
        _targets[target_json] = target
    return target


def _replay_error(mod: tvm.IRModule, trace: list, err: Exception) -> str:
    """A readable message for a trace that does not replay: ``schedule_from_json`` renders
    no error text (``error_render_level="none"``, fast), so replay once more with "fast"."""
    from tvm.s_tir import Schedule

    try:
        sch = Schedule(mod, error_render_level="fast")
        apply_trace_json(trace, sch)
    except Exception as again:  # noqa: BLE001 - any error is the message we want
        return "trace does not replay: " + short_error(again)
    return "trace does not replay: " + short_error(err)


def _builder_of(mod: tvm.IRModule) -> Callable[[tvm.IRModule, list | None], Any] | None:
    """The function a workload builds itself with (``BUILD_WITH_ATTR``), or None."""
    attrs = mod["main"].attrs
    if attrs is None or BUILD_WITH_ATTR not in attrs:
        return None
    module, _, name = str(attrs[BUILD_WITH_ATTR]).partition(":")
    if not module.startswith("relax_tune.") or not name:
        raise ValueError(f"{BUILD_WITH_ATTR} {str(attrs[BUILD_WITH_ATTR])!r} names no "
                         "function of relax_tune")
    return getattr(importlib.import_module(module), name)


def build_candidate(digest: str, script: str, target_json: str, trace_json: str | None,
                    out_path: str, link: str = "") -> tuple[str | None, float]:
    """Replay ``trace_json`` (plain-JSON trace; None or the empty trace: the task's
    baseline, the workload as it is or a GPU target's default schedule,
    ``baseline.baseline_module``) on the workload, compile it for the target and export it
    to ``out_path`` (a ``.so`` exposing ``main``). A workload that names its builder
    (``BUILD_WITH_ATTR``) is built by it instead. ``link``
    (``cross.link_mode``): "" links with the host compiler, "tar" writes an archive of
    object files (``out_path`` ends in ``.tar``), anything else is the compiler that
    links. Returns ``(error or None, seconds spent)``."""
    start = time.perf_counter()
    stage = "parse workload"
    try:
        mod = cached_workload(digest, script)
        target = cached_target(target_json)
        trace = None if trace_json is None else json.loads(trace_json)
        if trace is not None and is_baseline(trace):
            trace = None
        stage = "find the workload's builder"
        builder = _builder_of(mod)
        if builder is not None:  # the workload builds itself (BUILD_WITH_ATTR)
            stage = "build with " + str(mod["main"].attrs[BUILD_WITH_ATTR])
            built = builder(mod, trace)
            if isinstance(built, str):  # why it cannot be built
                return built, time.perf_counter() - start
            mod = built
        elif trace is not None:
            stage = "replay trace"
            try:
                sch = schedule_from_json(mod, trace)
            except Exception as err:  # noqa: BLE001 - ScheduleError, TVMError, ...
                return _replay_error(mod, trace, err), time.perf_counter() - start
            mod = sch.mod
        else:  # the task's baseline: the function as it is, or a GPU's default schedule
            stage = "default schedule"
            mod = baseline_module(mod, target)
        stage = "split layout rewrite"
        # the runner calls "main"; with packed weights it packs once, then times "main"
        measured, plan = measurable_module(mod["main"])
        stage = "compile"
        executable = tvm.compile(measured, target)
        stage = "export"
        cross.export(executable, out_path, link, candidate=True)
        if plan is not None:
            prepack.write_plan(out_path, plan)
        return None, time.perf_counter() - start
    except Exception as err:  # noqa: BLE001 - every failure becomes a result
        try:
            if os.path.exists(out_path):
                os.remove(out_path)
        except OSError:
            pass
        return f"{stage} failed: {short_error(err)}", time.perf_counter() - start


# --------------------------------------------------------------------------- runner side


def _np_dtype(dtype: str) -> np.dtype | None:
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    try:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    except (ImportError, AttributeError, TypeError):
        return None


def random_inputs(args_info: list, dev: Any, seed: int) -> list:
    """Arguments for ``main`` from ``args_info`` (``[["TENSOR", dtype, shape], ...]``):
    seeded random tensors on ``dev`` -- floats uniform in [0, 1), integers in [0, 4) but 0 in
    a 0-d tensor, booleans in {0, 1}; a SCALAR argument is 1. A dtype numpy cannot hold is
    allocated uninitialised. (A 0-d integer tensor is a constant index: ``take(qkv, 0)`` of
    PyTorch's packed q/k/v projection reads past its 3-long axis at index 3, and the
    correctness screen then compared whatever lay there.)"""
    rng = np.random.default_rng(seed)
    args: list = []
    for info in args_info:
        kind, dtype = info[0], str(info[1])
        if kind == "SCALAR":
            args.append(1.0 if "float" in dtype else 1)
            continue
        shape = [int(d) for d in info[2]]
        npd = _np_dtype(dtype)
        if npd is None:
            args.append(tvm.runtime.empty(shape, dtype, dev))
            continue
        if npd.kind == "b":
            data = rng.integers(0, 2, size=shape).astype(npd)
        elif npd.kind in "iu":
            data = rng.integers(0, 4 if shape else 1, size=shape).astype(npd)
        else:
            data = rng.random(size=shape, dtype=np.float32).astype(npd)
        args.append(tvm.runtime.tensor(data, dev))
    return args


def _cached_inputs(args_info_json: str, dev: Any, seed: int) -> list:
    key = f"{dev.dlpack_device_type()}:{dev.index}:{seed}:{args_info_json}"
    args = _inputs.get(key)
    if args is None:
        args = random_inputs(json.loads(args_info_json), dev, seed)
        _inputs[key] = args
        while len(_inputs) > _MAX_INPUT_SETS:
            _inputs.popitem(last=False)
    else:
        _inputs.move_to_end(key)
    return args


def _device(device_type: int, device_id: int) -> Any:
    return tvm.device(device_type, device_id)


def run_candidate(artifact: str, args_info_json: str, device_type: int, device_id: int,
                  number: int, repeat: int, min_repeat_ms: int, cache_flush: bool,
                  max_secs: float | None, budget_secs: float, seed: int,
                  short_secs: float | None = None
                  ) -> tuple[list[float] | None, str | None]:
    """Load ``artifact`` and time its ``main`` on the device with the runtime's time
    evaluator: ``prepare_candidate``, then its ``repeat`` measurements one after another
    (``time_prepared``). Returns ``(run_secs, None)`` or ``(None, error)``."""
    run_secs, error, _ = prepare_candidate(artifact, args_info_json, device_type, device_id,
                                           number, repeat, min_repeat_ms, cache_flush,
                                           max_secs, budget_secs, seed, short_secs)
    if run_secs is not None or error is not None:
        return run_secs, error
    (out,) = time_prepared([artifact], repeat)
    return (out, None) if isinstance(out, list) else (None, out)


def prepare_candidate(artifact: str, args_info_json: str, device_type: int, device_id: int,
                      number: int, repeat: int, min_repeat_ms: int, cache_flush: bool,
                      max_secs: float | None, budget_secs: float, seed: int,
                      short_secs: float | None = None
                      ) -> tuple[list[float] | None, str | None, tuple[float, float] | None]:
    """Load ``artifact`` and make its warm-up calls (one, or as many as fill
    ``_WARM_UP_SECS``). When the last of them alone takes longer than ``max_secs``, or the
    full measurement would not fit in ``budget_secs``, that one time is the result
    (``([secs], None)``); when it takes longer than ``short_secs`` (a candidate unlikely
    to be the best), each measurement is one call (``number`` 1). Otherwise its time
    evaluator is kept here for ``time_prepared`` and ``(None, None, (call, measurement))``
    returned: the seconds of its last warm-up call and what one measurement should take;
    ``(None, error, None)`` when it fails."""
    start = time.perf_counter()
    stage = "load"
    try:
        dev = _device(device_type, device_id)
        module = tvm.runtime.load_module(artifact)
        stage = "warm-up call"
        args = _cached_inputs(args_info_json, dev, seed)
        args = prepack.packed_args(module, args, prepack.read_plan(artifact), dev)
        func = module["main"]
        warm_start = time.perf_counter()
        while True:  # at least one call, more while they are short (see _WARM_UP_SECS)
            t0 = time.perf_counter()
            func(*args)
            dev.sync()
            first = time.perf_counter() - t0
            if (max_secs is not None and first > max_secs) or \
                    time.perf_counter() - warm_start >= _WARM_UP_SECS:
                break
        if max_secs is not None and first > max_secs:
            if first > min(_CLEARLY_SLOW * max_secs, _CLEARLY_SLOW_SECS):
                return [first], None, None
            # Near the limit: the first call of a freshly loaded library pays cold caches
            # and page faults; judge (and record) a warm call, or good kernels get cut.
            t0 = time.perf_counter()
            func(*args)
            dev.sync()
            first = time.perf_counter() - t0
            if first > max_secs:
                return [first], None, None
        if short_secs is not None and first > short_secs:
            number = 1
        else:
            number = calls_per_repeat(number, min_repeat_ms, first)
        if cache_flush:
            # The runtime flushes once per repeat; one call per repeat keeps every timed
            # call cold (weights from memory, as in a whole model), not one in ``number``.
            number, min_repeat_ms = 1, 0
        remaining = budget_secs - (time.perf_counter() - start)
        projected = repeat * max(number * first, min_repeat_ms / 1e3) * 1.1 + 0.05
        if projected > 0.9 * remaining:  # would time out: keep what we have
            return [first], None, None
        evaluator = module.time_evaluator(
            "main", dev, number=number, repeat=1, min_repeat_ms=min_repeat_ms,
            f_preproc="cache_flush_cpu_non_first_arg" if cache_flush else "")
        _prepared[artifact] = (evaluator, args)
        while len(_prepared) > _MAX_PREPARED:
            _prepared.popitem(last=False)
        return None, None, (first, projected / repeat)
    except Exception as err:  # noqa: BLE001 - every failure becomes a result
        return None, f"{stage} failed: {short_error(err)}", None


def time_prepared(artifacts: list[str], repeat: int) -> list[list[float] | str]:
    """The ``repeat`` measurements of each prepared candidate of ``artifacts``
    (``prepare_candidate``), taken in interleaved rounds: each round times every candidate
    once, in turn. A spell of load on the machine then falls on all of them alike, where
    timed one after another it fell on whichever was being timed (a depthwise convolution's
    best candidate, 0.2 ms alone, recorded at 1.5 ms in a 60 s session, and a 0.66 ms one
    chosen). One list of seconds per candidate, or its error (one not prepared: its
    error says so)."""
    out: list[list[float] | str] = []
    jobs = []
    for artifact in artifacts:  # an artifact listed twice is timed twice
        job = _prepared.get(artifact)
        jobs.append(job)
        out.append([] if job is not None else "timing failed: not prepared in this worker")
    for _ in range(repeat):
        for i, job in enumerate(jobs):
            if job is None or isinstance(out[i], str):
                continue
            evaluator, args = job
            try:
                out[i].append(float(evaluator(*args).results[0]))
            except Exception as err:  # noqa: BLE001 - every failure becomes a result
                out[i] = f"timing failed: {short_error(err)}"
    for artifact in artifacts:
        _prepared.pop(artifact, None)
    return out


def fetch_outputs(artifact: str, args_info_json: str, device_type: int, device_id: int,
                  seed: int) -> tuple[list[np.ndarray] | None, str | None]:
    """Call ``main`` of ``artifact`` once on fresh seeded inputs (same data as the timing
    inputs for the same seed) and return every argument afterwards, as numpy arrays."""
    stage = "load"
    try:
        dev = _device(device_type, device_id)
        module = tvm.runtime.load_module(artifact)
        stage = "call"
        args = random_inputs(json.loads(args_info_json), dev, seed)
        module["main"](*prepack.packed_args(module, args, prepack.read_plan(artifact), dev))
        dev.sync()
        return [a.numpy() if hasattr(a, "numpy") else np.asarray(a) for a in args], None
    except Exception as err:  # noqa: BLE001
        return None, f"{stage} failed: {short_error(err)}"



def cache_info() -> dict:
    """What this worker has cached: parsed workloads, targets and input sets (diagnostics)."""
    return {"pid": os.getpid(), "workloads": list(_workloads), "targets": len(_targets),
            "input_sets": len(_inputs)}
