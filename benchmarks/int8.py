"""``bench_real_models --int8``: a model quantized as users quantize it, side by side.

The float model is exported to ONNX (``torch.onnx.export``) and quantized by ONNX Runtime's
static quantizer (QDQ, u8 activations, s8 weights per channel; calibrated on
``--calibration`` seeded random inputs; ``--reduce-range``: 7-bit weights, by default
where the target's int8 instruction is AVX2's, as ONNX Runtime's quantizer recommends for
x86 CPUs without VNNI: there every contender's ``vpmaddubsw`` is exact on them). Rows, all
timed interleaved on the same threads:

- ``pytorch``: eager float32 (the float reference of the "vs PyTorch" column);
- ``onnxruntime-fp32``: ONNX Runtime on the float ONNX file;
- ``onnxruntime``: ONNX Runtime on the QDQ file (its int8 kernels; the "vs ONNX Runtime"
  column compares with this row);
- ``openvino`` (``--no-openvino`` leaves it out): OpenVINO on the same QDQ file
  (``openvino_row`` with no precision hint, so its quantized operations run int8; the info
  line names them), ``PERFORMANCE_HINT=LATENCY``, ``INFERENCE_NUM_THREADS`` = the threads;
- ``relax_tune-int8(...)``: the QDQ file through ``load_model`` and the "relax_tune"
  pipeline (``lowering.int8``: integer kernels; ``Int8DotProduct`` where the target has an
  int8 dot-product instruction) at each budget of ``--trials``/``--trials-per-task``/
  ``--seconds`` (0: the no-measurement compile)/``--max-time``, each in a fresh work_dir;
- ``relax_tune-fp32(...)`` (``--int8-float``): the float ONNX file through the same pipeline
  at the same budgets, so that the info line can say how much faster relax_tune's int8
  model is than its float32 one, timed in the same rounds (issue 45's "2x where VNNI
  exists").

Correctness: each int8 row (relax_tune's and OpenVINO's) against ONNX Runtime's int8 output
and against the file's QDQ meaning (ONNX Runtime with basic optimisations), in steps of the
output's quantisation scale (flagged when above ``--int8-steps`` from both), and its max
|diff| against the float model next to ONNX Runtime's own.
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.alternatives import (error_row, onnxruntime_row, openvino_precisions,
                                     openvino_row, pytorch_row)
from benchmarks.contenders import Row, calibrate, fresh_work_dir, interleave, numpy_output, tvm_row
from benchmarks.real_models import make_model
from relax_tune.testing.quantized import output_scale


def wants_reduce_range(choice: str, target) -> bool:
    """``--reduce-range``: "on", "off", or "auto" (on where the target's int8 instruction has
    a narrow variant: AVX2 without VNNI, whose ``vpmaddubsw`` is exact on 7-bit weights)."""
    if choice != "auto":
        return choice == "on"
    from relax_tune.space.cpu.int8_intrin import int8_dot_intrinsic, narrow_variant

    intrinsic = int8_dot_intrinsic(target)
    return intrinsic is not None and narrow_variant(intrinsic) is not None


def bench_int8_model(name: str, args, target, root: str, threads: int, log
                     ) -> tuple[list[Row], str]:
    """The rows of one model in int8 mode (see the module docstring) and its info line."""
    import torch
    import tvm
    from tvm import relax

    import relax_tune as rt
    from relax_tune.model_loader import load_model
    from relax_tune.testing.quantized import calibration_inputs, quantize_qdq

    model, inputs, desc = make_model(name, args.small)
    inputs_np = [t.numpy() for t in inputs]
    with torch.inference_mode():
        ref = model(*inputs).numpy()
    rows = [pytorch_row(model, inputs)]
    float_path = os.path.join(root, f"{name}.onnx")
    qdq_path = os.path.join(root, f"{name}_qdq.onnx")
    reduce_range = wants_reduce_range(args.reduce_range, target)
    log(f"{name} ({desc}): ONNX export, quantize_static ({args.calibration} inputs, "
        f"reduce_range={reduce_range})")
    start = time.perf_counter()
    torch.onnx.export(model, inputs, float_path, input_names=["x"], verbose=False)
    quantize_qdq(float_path, qdq_path,
                 calibration_inputs(inputs_np[0].shape, args.calibration, "x",
                                    like=inputs_np[0]), reduce_range=reduce_range)
    info = (f"{name} ({desc}) int8: quantized in {time.perf_counter() - start:.0f} s"
            f"{', 7-bit weights (reduce_range)' if reduce_range else ''}")
    for contender, path in (("onnxruntime-fp32", float_path), ("onnxruntime", qdq_path)):
        rows.append(onnxruntime_row(path, inputs_np, threads, contender))
    ort_int8_row = rows[-1]
    if args.openvino:
        log(f"{name}: OpenVINO int8 (the QDQ file)")
        try:
            rows.append(openvino_row(qdq_path, inputs_np, threads, precision=None))
            int8_ops = sorted(op for op, precisions in openvino_precisions(rows[-1]).items()
                              if precisions & {"u8", "i8"} and op != "Const")
            info += f"; OpenVINO int8 operations: {', '.join(int8_ops) or 'none'}"
        except Exception as err:
            rows.append(error_row("openvino", err))
            log(f"!!! {name}: OpenVINO failed: {err}")

    loaded = load_model(qdq_path)
    tasks = rt.extract_tasks(loaded.lowered(target), target)
    n_tasks = len(tasks)
    info += f"; {n_tasks} relax_tune tasks"
    budgets = sorted({*args.trials, *(k * n_tasks for k in args.trials_per_task)})
    runs = [(f"{b}", {"max_trials_global": b}) for b in budgets if b > 0]
    runs += [(f"{secs:g}s", {"measure": False} if secs == 0 else {"max_time": secs})
             for secs in args.seconds]  # 0: the no-measurement compile
    runs += [(f"{args.max_time:g}s", {"max_time": args.max_time,
                                      "max_trials_global": args.max_time_trials})] \
        if args.max_time else []
    kinds = [("int8", loaded)] + ([("fp32", load_model(float_path))] if args.int8_float else [])
    for kind, source in kinds:
        for label, options in runs:
            contender = f"relax_tune-{kind}({label})"
            log(f"{name}: relax_tune {kind}, {label}")
            start = time.perf_counter()
            try:
                ex = tvm.compile(source.mod, target, relax_pipeline=source.compile_pipeline(
                    target, fresh_work_dir(os.path.join(root, f"{name}-{kind}-{label}")),
                    cost_model=args.cost_model, **options))
                wall = time.perf_counter() - start
                rows.append(tvm_row(contender, label, ex, inputs_np, wall))
                log(f"  {wall:.0f} s")
            except Exception as err:
                rows.append(Row(contender, label, None, tune_secs=time.perf_counter() - start,
                                error=f"{type(err).__name__}: {err}"))
                log(f"!!! {name}: relax_tune {kind} {label} failed: {err}")

    ort_int8 = numpy_output(ort_int8_row.call())
    # the file as ONNX defines it: its operators as written, not fused into ONNX Runtime's
    # int8 kernels (which, on CPUs without VNNI, add u8 x s8 pairs in a saturating s16)
    meaning = numpy_output(onnxruntime_row(qdq_path, inputs_np, threads, basic=True).call())
    step = output_scale(qdq_path)
    if step:
        info += (f"\n  onnxruntime (int8): {float(np.abs(ort_int8 - meaning).max()) / step:.1f} "
                 "steps from the QDQ meaning (ONNX Runtime, basic optimisations)")
    for row in rows:
        if row.call is None:
            continue
        out = numpy_output(row.call())
        row.output = out
        row.max_abs = float(np.abs(out.astype(np.float64) - ref).max())
        row.max_rel = row.max_abs / (float(np.abs(ref).max()) or 1.0)
        if (row.contender.startswith("relax_tune-int8") or row.contender == "openvino") \
                and step:
            steps = float(np.abs(out - ort_int8).max()) / step
            exact = float(np.abs(out - meaning).max()) / step
            row.mismatch = min(steps, exact) > args.int8_steps
            info += (f"\n  {row.contender}: {steps:.1f} steps (of {step:.3g}) from ONNX "
                     f"Runtime int8 at most, {np.mean(np.abs(out - ort_int8) > step / 2):.1%}"
                     f" of outputs differ; {exact:.1f} from the QDQ meaning; max |diff| to "
                     f"float32 {row.max_abs:.3g} (ONNX Runtime int8: {ort_int8_row.max_abs:.3g})")
    for row in rows:
        if row.call is not None and row.error is None:
            calibrate(row, args.min_secs)
    interleave(rows, args.rounds, args.pause)
    return rows, info + int8_over_float(rows)


def int8_over_float(rows: list[Row]) -> str:
    """Info lines: each relax_tune int8 row against the relax_tune float32 row of the same
    budget, the median of the per-round ratios (>1: int8 faster)."""
    by_name = {row.contender: row for row in rows if row.samples}
    lines = ""
    for contender, row in by_name.items():
        floaty = by_name.get(contender.replace("relax_tune-int8", "relax_tune-fp32"))
        if contender.startswith("relax_tune-int8") and floaty is not None:
            ratio = float(np.median([f / i for f, i in zip(floaty.samples, row.samples)]))
            lines += (f"\n  {contender}: {ratio:.2f}x relax_tune float32 at the same budget "
                      f"(median of per-round ratios)")
    return lines
