"""What a user could run instead of relax_tune, as rows of the real-model benchmark: PyTorch
eager, ONNX Runtime, OpenVINO and ``torch.compile``, each on the same threads. A contender
that fails to import, convert or compile is a row with its error, never a crash; each is
imported only here, when it is benchmarked (pip install '.[bench]' installs them all)."""

from __future__ import annotations

import contextlib
import signal
import time

import numpy as np

from benchmarks.contenders import Row

ALTERNATIVES = ("pytorch", "onnxruntime", "openvino", "torch.compile")
"""The contenders a row's "vs best alternative" is measured against (the fastest of them)."""


def error_row(contender: str, err: BaseException, tune_secs: float | None = None) -> Row:
    """A row for a contender that could not be built: its error, no call."""
    return Row(contender, "-", None, tune_secs=tune_secs, error=f"{type(err).__name__}: {err}")


def pytorch_row(model, inputs) -> Row:
    """PyTorch eager under ``torch.inference_mode()``."""
    import torch

    def call():
        with torch.inference_mode():
            return model(*inputs)

    return Row("pytorch", "-", call)


def ort_session(path: str, threads: int, basic: bool = False, profiling: bool = False):
    """An ONNX Runtime CPU session on ``threads`` intra-op threads, one inter-op thread,
    sequential execution (as every contender runs); ``basic``: basic graph optimisations
    only (a QDQ file's operators run as written, not fused into ONNX Runtime's int8 kernels);
    ``profiling``: ONNX Runtime's profiler on (``end_profiling()`` writes its events)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profiling:
        import tempfile

        so.enable_profiling = True
        so.profile_file_prefix = f"{tempfile.gettempdir()}/ort_profile"
    if basic:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def onnxruntime_row(onnx_path: str, inputs_np: list[np.ndarray], threads: int,
                    contender: str = "onnxruntime", basic: bool = False) -> Row:
    """ONNX Runtime's CPU provider on the exported file (``ort_session``)."""
    sess = ort_session(onnx_path, threads, basic)
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs_np)}
    row = Row(contender, "-", lambda: sess.run(None, feed))
    row.keep = sess
    return row


def openvino_row(source, inputs_np: list[np.ndarray], threads: int, example_input=None,
                 precision: str | None = "f32", contender: str = "openvino") -> Row:
    """OpenVINO on the CPU device: ``openvino.convert_model`` of ``source`` (the exported
    ONNX file, or the torch module with ``example_input``), compiled for latency on
    ``threads`` inference threads with ``INFERENCE_PRECISION_HINT=precision`` (default f32:
    on a CPU with AMX or AVX512-BF16 its default is bf16, which would not be a float32
    comparison). ``precision=None`` leaves the hint unset, OpenVINO's own choice: for a
    quantized (QDQ) file its int8 kernels, the rest in its default precision.
    "tune wall s" is conversion plus compilation."""
    import openvino as ov

    start = time.perf_counter()
    model = ov.convert_model(source, example_input=example_input) if example_input is not None \
        else ov.convert_model(source)
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads)}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    row = Row(contender, "-", lambda: request.infer(inputs_np)[0],
              tune_secs=time.perf_counter() - start)
    row.keep = (compiled, request)
    return row


def openvino_precisions(row: Row) -> dict[str, set[str]]:
    """The runtime precisions of an ``openvino_row``'s compiled model, per operation type
    (``{"Convolution": {"u8"}, ...}``): says which operations run in int8."""
    out: dict[str, set[str]] = {}
    for op in row.keep[0].get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "layerType" in info and "runtimePrecision" in info:
            out.setdefault(info["layerType"].astype(str), set()).add(
                info["runtimePrecision"].astype(str).lower())
    return out


class CompileTimeout(Exception):
    """``torch.compile`` ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise ``CompileTimeout`` in the main thread after ``seconds`` (SIGALRM; no limit when
    None, or where there is no SIGALRM). Inductor compiles in Python and in compiler
    subprocesses, so the alarm's exception reaches it between two steps."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise CompileTimeout(f"torch.compile took longer than {seconds:.0f} s "
                             "(--torch-compile-timeout)")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def torch_compile_row(model, inputs, timeout: float | None) -> Row:
    """``torch.compile(model, mode="max-autotune-no-cudagraphs")`` with Inductor's weight
    freezing (``torch._inductor.config.freezing = True``: weights folded as constants,
    oneDNN-packed), under ``torch.inference_mode()``. Compiled by its first two calls
    (freezing compiles on the first under inference mode), whose time is its "tune wall
    s"; past ``timeout`` seconds it is an error row. Inductor's on-disk caches are off
    (``force_disable_caches``), so the time is a first compilation's, as relax_tune's rows
    tune in fresh work_dirs (with the caches a second run skips the autotuning:
    docs/usage/benchmarks.md)."""
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    inductor_config.force_disable_caches = True
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")

    def call():
        with torch.inference_mode():
            return compiled(*inputs)

    start = time.perf_counter()
    try:
        with time_limit(timeout):
            call()
            call()
    except BaseException as err:  # a timeout, a compiler error: the row says which
        torch._dynamo.reset()
        if isinstance(err, KeyboardInterrupt):
            raise
        return error_row("torch.compile", err, time.perf_counter() - start)
    return Row("torch.compile", "-", call, tune_secs=time.perf_counter() - start)


def best_alternative(rows: list[Row]) -> Row | None:
    """The fastest alternative (``ALTERNATIVES``) among ``rows`` that were timed, or None:
    by their median ratios to ONNX Runtime where every one has them (each round's taken
    against the ONNX Runtime times around it, ``interleave``), else by median latency."""
    timed = [r for r in rows if r.contender in ALTERNATIVES and r.samples]
    if timed and all(r.ratio_ort for r in timed):
        return max(timed, key=lambda r: float(np.median(r.ratio_ort)))
    return min(timed, key=lambda r: float(np.median(r.samples)), default=None)


def ratios_to_best(rows: list[Row]) -> Row | None:
    """Each timed row's per-round ratios against the best alternative into ``ratio_best``;
    returns that alternative. Both rows' ratios to ONNX Runtime of a round (each taken
    against the ONNX Runtime times around it, ``interleave``) give the ratio between
    them; a slow row timed in the first round only is set against that round's. Rows
    timed without ONNX Runtime: the rows' times of the same round."""
    best = best_alternative(rows)
    if best is not None:
        for row in rows:
            if row.samples and row.ratio_ort and best.ratio_ort:
                row.ratio_best = [r / b for r, b in zip(row.ratio_ort, best.ratio_ort)]
            elif row.samples:
                row.ratio_best = [b / s for b, s in zip(best.samples, row.samples)]
    return best
