"""Real models side by side: PyTorch eager, ONNX Runtime, OpenVINO, torch.compile, TVM
untuned, MetaSchedule and the "relax_tune" pipeline at several trial budgets, all built,
checked and timed in one run.

    python -m benchmarks.bench_real_models --models resnet18 mobilenet_v2 bert vit \\
        --trials-per-task 1 8 32 [--max-time 600] [--metaschedule] [--per-task]
    python -m benchmarks.bench_real_models --small --models mobilenet_v2 --trials 8   # smoke
    python -m benchmarks.bench_real_models --int8 --models resnet18 --max-time 300  # int8

Models (random weights, batch 1, float32; ``--small`` shrinks the inputs for a quick run):
- ``resnet18``, ``mobilenet_v2`` (and, by name only, ``mobilenet_v3_small`` and
  ``efficientnet_b0``): torchvision,
  1x3x224x224 (small: 64x64).
- ``bert``: a BERT-base-shaped encoder cut down to 4 post-norm ``nn.TransformerEncoderLayer``
  (d 256, 4 heads, ff 1024, GELU) over token + position embeddings; int64 token ids, seq 128
  (small: 32); output: the last hidden states.
- ``vit``: ViT-Tiny-like: 16x16 patches of a 224x224 image (small: 64x64), d 192, 3 heads,
  ff 768, 6 pre-norm layers, class token, 1000-way head.

Rows per model:
- ``pytorch``: eager, ``torch.inference_mode()``.
- ``onnxruntime``: ``torch.onnx.export`` (torch's default exporter), CPU provider.
- ``openvino`` (``--no-openvino`` leaves it out): ``openvino.convert_model`` of the exported
  ONNX file (of the torch module when the export failed), CPU device,
  ``PERFORMANCE_HINT=LATENCY``, ``INFERENCE_NUM_THREADS`` = the threads,
  ``INFERENCE_PRECISION_HINT=f32`` (a float32 comparison on CPUs whose default is bf16);
  "tune wall s" is conversion plus compilation.
- ``torch.compile`` (``--no-torch-compile``): Inductor with ``freezing = True``,
  ``mode="max-autotune-no-cudagraphs"``, under ``torch.inference_mode()``; "tune wall s" is
  its compilation (its first two calls, Inductor's on-disk caches off: a first compilation,
  as relax_tune's rows tune in fresh work_dirs). It needs a C++ compiler; past
  ``--torch-compile-timeout`` seconds, or on any compile error, its row holds the error.
- ``tvm-untuned``: ``torch.export`` -> ``from_exported_program(keep_params_as_input=True)`` ->
  ``detach_params``, weights bound, ``relax.get_pipeline("zero")``, ``tvm.compile``: TVM's
  stock lowering (no batch-norm folding; relax_tune's pipeline has its own graph passes).
- ``metaschedule`` (``--metaschedule``): TVM's ``static_shape_tuning`` recipe on the model with
  its weights bound and ``cpu_weight_prepack`` (the same treatment relax_tune's pipeline
  gives): ``zero`` pipeline, ``AttachAttrLayoutFreeBuffers``, ``tune_relax``,
  ``MetaScheduleApplyDatabase``, ``SplitLayoutRewritePreproc``, ``FoldConstant``. Its builder
  workers import ``tvm.s_tir.tensor_intrin`` in an initializer
  (shared/notes/metaschedule-baseline.md). Each budget tunes in a fresh work_dir; MetaSchedule
  hands out ``--ms-trials-per-round`` trials per round (its default 64: below 64 x tasks some
  tasks get no trial at all; a warning says so). Its "trials" count the records in its
  database. ``--ms-same-graph`` runs relax_tune's graph passes first, so both tuners tune the
  same graph (default: TVM's stock lowering, as ``static_shape_tuning`` does).
- ``relax_tune``: ``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("relax_tune",
  target=target, work_dir=wd, max_trials_global=N, params=params))``. By default the budgets
  run in increasing order on ONE work_dir (resuming only adds trials), and "tune wall s" is
  the cumulative wall time of all compilations up to that row; ``--fresh`` tunes each budget
  in its own work_dir (wall time of that compilation alone).
- ``relax_tune(prior)`` (``--prior-trials-per-task K ...``): the same pipeline with
  ``cost_model="xgb-prior"`` (the shipped pre-trained model) in a work_dir of its own, so one
  run compares few trials with the prior against more without it (issue 16).
- ``relax_tune(time)`` (``--max-time S``): a fresh work_dir, ``max_time=S`` and a budget
  large enough not to bind first.

"trials" is measured/budget (relax_tune stops a task early when it has converged, runs out
of candidates, or is too cheap to matter; baselines are not trials). Budgets are absolute
(``--trials``) or multiples of the model's relax_tune task count (``--trials-per-task``:
tasks extracted from the model lowered exactly as the pipeline lowers it).

Timing (shared/notes/frameworks-substrate.md): every contender runs on the same number of
threads (``TVM_NUM_THREADS`` set before tvm is imported, ``torch.set_num_threads`` for eager
and torch.compile, ONNX Runtime ``intra_op_num_threads``/``inter_op_num_threads=1``, OpenVINO
``INFERENCE_NUM_THREADS``). After all rows of a model are
built, contenders are timed round by round (order rotating, a sleep before each timing, one
warm-up call, then as many calls as fill ``--min-secs``; a round's figure is their mean). A
row's latency is the median over rounds; "vs ONNX Runtime"/"vs PyTorch" are medians of the
per-round ratios (ORT ms / row ms; above 1: faster than ORT). "vs best alternative" is the
same against the fastest (median) of PyTorch eager, ONNX Runtime, OpenVINO and torch.compile
(named under the table). Every contender is timed through Python the same way (one call per
iteration on the same input).

Correctness: every output is compared with PyTorch's (max |diff| and max |diff| / max |ref|);
above ``--tol`` (relative to the largest reference value) the row is flagged MISMATCH and the
script exits with status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.alternatives import (error_row, onnxruntime_row, openvino_row, pytorch_row,
                                     ratios_to_best, torch_compile_row)
from benchmarks.contenders import (Row, calibrate, compile_metaschedule, compile_untuned,
                                   fresh_work_dir, import_tensor_intrin, interleave,
                                   metaschedule_tasks, numpy_output, tvm_row)
from benchmarks.int8 import bench_int8_model
from benchmarks.real_models import (MODEL_NAMES, MORE_MODEL_NAMES, NOTES, cpu_model, make_model,
                                    set_torch_threads)
from benchmarks.task_sum import time_task_sum

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOG = print  # progress lines (stdout, flushed)


def log(msg: str) -> None:
    LOG(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def relax_tune_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "relax_tune"], cwd=ROOT,
                               text=True, capture_output=True).stdout.strip()
        return head + (" (relax_tune/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def module_version(name: str) -> str:
    """The version of the module ``name`` (ONNX Runtime, OpenVINO), or why it is missing (its
    rows then say so too)."""
    import importlib

    try:
        return importlib.import_module(name).__version__
    except ImportError as err:
        return f"not importable ({err})"


def count_lines(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as file:
            return sum(1 for line in file if line.strip())
    except OSError:
        return 0


def relax_tune_summaries(work_dir: str, tasks):
    from relax_tune.database import JSONDatabase
    from relax_tune.report import summarize, task_meta_from_tasks

    return summarize(JSONDatabase(work_dir=work_dir), task_meta_from_tasks(tasks))


def measured_trials(work_dir: str, tasks) -> int:
    try:
        return sum(s.trials for s in relax_tune_summaries(work_dir, tasks))
    except Exception as err:  # report only
        log(f"  (could not count trials in {work_dir}: {err})")
        return -1


# ---------------------------------------------------------------------------- one model
def bench_model(name: str, args, target, root: str, threads: int) -> tuple[list[Row], str]:
    import torch
    import tvm
    from tvm import relax

    import relax_tune as rt
    from relax_tune.model_loader import from_torch

    model, inputs, desc = make_model(name, args.small)
    inputs_np = [t.numpy() for t in inputs]
    log(f"{name} ({desc}): PyTorch eager")
    with torch.inference_mode():
        ref = model(*inputs).numpy()
    rows = [pytorch_row(model, inputs)]

    log(f"{name}: torch.onnx.export + ONNX Runtime")
    onnx_path = os.path.join(root, f"{name}.onnx")
    try:
        torch.onnx.export(model, inputs, onnx_path, verbose=False)
    except Exception as err:
        onnx_path = None
        log(f"!!! {name}: torch.onnx.export failed: {err}")
        rows.append(error_row("onnxruntime", err))
    if onnx_path is not None:
        try:
            rows.append(onnxruntime_row(onnx_path, inputs_np, threads))
        except Exception as err:
            rows.append(error_row("onnxruntime", err))
            log(f"!!! {name}: ONNX Runtime failed: {err}")
    if args.openvino:
        log(f"{name}: OpenVINO (convert_model of the "
            f"{'ONNX file' if onnx_path else 'torch module'})")
        try:
            rows.append(openvino_row(onnx_path, inputs_np, threads) if onnx_path else
                        openvino_row(model, inputs_np, threads, example_input=inputs))
            log(f"  {rows[-1].tune_secs:.1f} s")
        except Exception as err:
            rows.append(error_row("openvino", err))
            log(f"!!! {name}: OpenVINO failed: {err}")
    if args.torch_compile:
        log(f"{name}: torch.compile (max-autotune-no-cudagraphs, freezing)")
        rows.append(torch_compile_row(model, inputs, args.torch_compile_timeout))
        if rows[-1].error:
            log(f"!!! {name}: torch.compile failed: {rows[-1].error}")
        else:
            log(f"  {rows[-1].tune_secs:.0f} s")

    # Relax import, task count
    log(f"{name}: torch.export -> Relax")
    start = time.perf_counter()
    loaded = from_torch(model, name, inputs)  # the loader users get (relax_tune.load_model)
    mod, params = loaded.mod, loaded.params
    tasks = rt.extract_tasks(loaded.lowered(target, winograd=args.winograd),
                             target)  # the pipeline's tasks
    n_tasks = len(tasks)
    info = (f"{name} ({desc}): {len(params)} weight tensors, "
            f"{sum(a.size for a in params.values()) / 1e6:.2f} M parameters, "
            f"{n_tasks} relax_tune tasks (imported + lowered in "
            f"{time.perf_counter() - start:.1f} s)")
    log(info)

    budgets = sorted({*args.trials, *(k * n_tasks for k in args.trials_per_task)})
    budgets = [b for b in budgets if b > 0]

    log(f"{name}: TVM untuned")
    try:
        rows.append(tvm_row("tvm-untuned", "0", compile_untuned(mod, params, target),
                            inputs_np))
    except Exception as err:
        rows.append(Row("tvm-untuned", "0", None, error=f"{type(err).__name__}: {err}"))
        log(f"!!! {name}: untuned build failed: {err}")

    if args.metaschedule:
        ms_tasks = metaschedule_tasks(mod, params, target, args.ms_same_graph)
        info += f"; {ms_tasks} MetaSchedule tasks, {args.ms_trials_per_round} trials per round"
        for budget in budgets:
            if budget < args.ms_trials_per_round * ms_tasks:
                log(f"  warning: MetaSchedule at {budget} trials with {args.ms_trials_per_round}"
                    f" per round reaches at most {math.ceil(budget / args.ms_trials_per_round)}"
                    f" of its {ms_tasks} tasks")
            wd = os.path.join(root, f"{name}-ms-{budget}")
            log(f"{name}: MetaSchedule, {budget} trials")
            start = time.perf_counter()
            try:
                ex = compile_metaschedule(mod, params, target, wd, budget,
                                          args.ms_trials_per_round, args.ms_same_graph)
                wall = time.perf_counter() - start
                done = count_lines(os.path.join(wd, "database_tuning_record.json"))
                rows.append(tvm_row("metaschedule", f"{done}/{budget}", ex, inputs_np, wall))
                log(f"  {wall:.0f} s")
            except Exception as err:
                rows.append(Row("metaschedule", f"?/{budget}", None,
                                tune_secs=time.perf_counter() - start,
                                error=f"{type(err).__name__}: {err}"))
                log(f"!!! {name}: MetaSchedule {budget} failed: {err}")

    runner_option = {}
    if args.cache_flush:
        from relax_tune.measure import LocalRunner
        runner_option = {"runner": LocalRunner(enable_cpu_cache_flush=True, repeat=5)}

    def relax_tune_compile(wd: str, budget: int, cost_model: str = args.cost_model, **kw):
        return tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=wd, max_trials_global=budget,
            params=params, cost_model=cost_model, winograd=args.winograd,
            **runner_option, **kw))

    direct = "" if args.winograd else "-direct"  # work_dir suffix: other tasks

    def relax_tune_rows(cost_model: str, budgets: list[int], contender: str):
        """One row per budget, tuned with ``cost_model`` (incremental on one work_dir unless
        --fresh); returns the last work_dir that compiled."""
        tag = ("" if cost_model == "xgb-prior" else f"-{cost_model}") \
            + ("" if contender == "relax_tune" else "-compare") \
            + ("-flush" if args.cache_flush else "") + direct
        cumulative, last_wd = 0.0, None
        for budget in budgets:
            wd = os.path.join(root, f"{name}-rt{tag}-{budget}" if args.fresh
                              else f"{name}-rt{tag}")
            resume = not args.fresh and budget != budgets[0]  # later budgets resume the first's
            if not resume:
                fresh_work_dir(wd)
            log(f"{name}: {contender} ({cost_model}), {budget} trials"
                + (f" (resuming {wd})" if resume else ""))
            start = time.perf_counter()
            try:
                ex = relax_tune_compile(wd, budget, cost_model)
                wall = time.perf_counter() - start
                cumulative = wall if args.fresh else cumulative + wall
                done = measured_trials(wd, tasks)
                rows.append(tvm_row(contender, f"{done}/{budget}", ex, inputs_np, cumulative))
                last_wd = wd
                log(f"  {wall:.0f} s (cumulative {cumulative:.0f} s)")
            except Exception as err:
                cumulative += time.perf_counter() - start
                rows.append(Row(contender, f"?/{budget}", None, tune_secs=cumulative,
                                error=f"{type(err).__name__}: {err}"))
                log(f"!!! {name}: {contender} {budget} failed: {err}")
        return last_wd

    last_wd = relax_tune_rows(args.cost_model, budgets, "relax_tune")
    last_row = next((r for r in reversed(rows) if r.contender == "relax_tune"), None)
    prior_budgets = [k * n_tasks for k in args.prior_trials_per_task if k > 0]
    if prior_budgets:
        relax_tune_rows("xgb-prior", prior_budgets, "relax_tune(prior)")

    by_time = [(secs, True) for secs in args.seconds] + \
        [(secs, False) for secs in args.no_transfer_seconds]
    for secs, transfer in by_time:
        # the user's knob: a time budget, the whole compile timed; 0 = nothing measured
        tag = "" if transfer else ",no-transfer"
        wd = fresh_work_dir(os.path.join(root, f"{name}-rt-{secs:g}s{direct}"
                                         f"{tag.replace(',', '-')}"))
        what = "no measurement (measure=False)" if secs == 0 else f"max_time {secs:g} s"
        log(f"{name}: relax_tune, {what}{tag}, fresh work_dir")
        start = time.perf_counter()
        try:
            kw = {"measure": False} if secs == 0 else {"max_time": secs}
            kw["transfer"] = transfer
            ex = relax_tune_compile(wd, None, **kw)
            wall = time.perf_counter() - start
            done = measured_trials(wd, tasks)
            rows.append(tvm_row(f"relax_tune({secs:g}s{tag})", f"{done}", ex, inputs_np, wall))
            if transfer:
                last_wd, last_row = wd, rows[-1]
            log(f"  {wall:.0f} s whole compile, {done} trials")
        except Exception as err:
            rows.append(Row(f"relax_tune({secs:g}s{tag})", "?", None,
                            tune_secs=time.perf_counter() - start,
                            error=f"{type(err).__name__}: {err}"))
            log(f"!!! {name}: relax_tune at {secs:g} s failed: {err}")

    if args.max_time:
        wd = os.path.join(root, f"{name}-rt-time{direct}")
        log(f"{name}: relax_tune, max_time {args.max_time:.0f} s")
        start = time.perf_counter()
        try:
            ex = relax_tune_compile(wd, args.max_time_trials, max_time=args.max_time)
            wall = time.perf_counter() - start
            done = measured_trials(wd, tasks)
            rows.append(tvm_row("relax_tune(time)", f"{done}/{args.max_time:.0f}s", ex,
                                inputs_np, wall))
            last_wd, last_row = wd, rows[-1]
            log(f"  {wall:.0f} s, {done} trials")
        except Exception as err:
            rows.append(Row("relax_tune(time)", f"?/{args.max_time:.0f}s", None,
                            tune_secs=time.perf_counter() - start,
                            error=f"{type(err).__name__}: {err}"))
            log(f"!!! {name}: relax_tune max_time failed: {err}")

    # correctness against PyTorch
    scale = float(np.max(np.abs(ref))) or 1.0
    for row in rows:
        if row.call is None:
            continue
        try:
            out = numpy_output(row.call())
            row.output = out
            diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
            row.max_abs = float(diff.max())
            row.max_rel = row.max_abs / scale
            row.mismatch = out.shape != ref.shape or not row.max_rel <= args.tol
        except Exception as err:
            row.error = f"output: {type(err).__name__}: {err}"
            row.mismatch = True
        if row.mismatch:
            log(f"!!! MISMATCH {name} {row.contender} {row.trials}: max |diff| {row.max_abs}, "
                f"relative to max |ref| {row.max_rel} (tolerance {args.tol})")

    load = os.getloadavg()[0]
    info += f"; load before timing {load:.1f}"
    log(f"{name}: timing {sum(r.call is not None and r.error is None for r in rows)} "
        f"contenders, {args.rounds} interleaved rounds (load {load:.1f})")
    for row in rows:
        if row.call is not None and row.error is None:
            calibrate(row, args.min_secs)
    interleave(rows, args.rounds, args.pause)
    best = ratios_to_best(rows)
    if best is not None:
        info += f"; best alternative: {best.contender}"

    if args.per_task and last_wd is not None:
        info += "\n\n" + per_task_table(name, last_wd, tasks, last_row, inputs_np, target)
    return rows, info


def per_task_table(name: str, work_dir: str, tasks, row: Row | None, inputs_np,
                   target) -> str:
    """Per task of the last relax_tune row (``row``, compiled from ``work_dir``): weight x
    applied latency from the database (measured alone), beside the task's kernels timed in
    place in the whole model (``relax_tune.profile``); the whole model against the sum of
    its tasks, from the database and timed again in the same rounds (``task_sum``)."""
    from relax_tune.profile import base_name, profile_model

    try:
        summaries = relax_tune_summaries(work_dir, tasks)
    except Exception as err:
        return f"(per-task table unavailable: {err})"
    in_model: dict[str, float] = {}
    if row is not None and getattr(row, "executable", None) is not None:
        try:
            for k in profile_model(row.executable, inputs_np, "main", runs=10):
                in_model[base_name(k.name)] = in_model.get(base_name(k.name), 0.0) + k.secs
        except Exception as err:  # the table without the in-model column
            log(f"!!! {name}: in-model profile failed: {err}")
    known = [s for s in summaries if s.applied_secs]
    total = sum(s.effective_weight * s.applied_secs for s in known)
    lines = [f"Per task, {name}, {row.contender if row else 'relax_tune'} "
             f"({os.path.basename(work_dir)}): weight x applied latency from the work_dir "
             f"database (timed alone), and the task's kernels timed in place in the model",
             "",
             "| task | shape | weight | trials | untuned us | applied us | weight x applied ms"
             " | in model ms | in model / alone | share | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    def cost(s) -> float:  # the heaviest first: measured alone, else in place
        return s.effective_weight * s.applied_secs if s.applied_secs \
            else in_model.get(s.name, 0.0)

    for s in sorted(summaries, key=lambda s: -cost(s)):
        w_ms = s.effective_weight * s.applied_secs * 1e3 if s.applied_secs else None
        base = f"{s.baseline_secs * 1e6:.1f}" if s.baseline_secs else "-"
        speed = f"{s.speedup:.2f}x" if s.speedup else "-"
        placed = in_model.get(s.name)
        placed_ms = f"{placed * 1e3:.3f}" if placed is not None else "-"
        ratio = f"{placed * 1e3 / w_ms:.2f}x" if placed is not None and w_ms else "-"
        alone = (f"{s.applied_secs * 1e6:.1f} | {w_ms:.3f}" if w_ms is not None
                 else "- | -")
        share = f"{100 * w_ms / 1e3 / total:.1f}%" if w_ms is not None and total else "-"
        lines.append(f"| {s.name} | {s.shape} | {s.weight if s.weight is not None else '?'} | "
                     f"{s.trials} | {base} | {alone} | {placed_ms} | {ratio} | {share} | "
                     f"{speed} |")
    missing = len(summaries) - len(known)
    whole = np.median(row.samples) if row is not None and row.samples else None
    lines.append("")
    lines.append(f"sum of tasks (timed alone): {total * 1e3:.3f} ms"
                 + (f" ({missing} workloads without a measured time left out)"
                    if missing else "")
                 + (f"; kernels in place: {sum(in_model.values()) * 1e3:.3f} ms, "
                    f"{sum(v for k, v in in_model.items() if k.startswith('vm.builtin')) * 1e3:.3f}"
                    " ms of it the VM's builtins" if in_model else "")
                 + (f"; whole model: {whole * 1e3:.3f} ms = {whole / total:.2f}x the sum of "
                    "its tasks" if whole and total else ""))
    if row is not None and row.call is not None:
        try:
            same = time_task_sum(row, work_dir, tasks, target)
            lines.append(f"the same, timed in the same rounds ({len(same.sums)} rounds, "
                         f"the whole model, then its {same.tasks} tasks alone): whole "
                         f"{statistics.median(same.whole) * 1e3:.3f} ms, sum of tasks "
                         f"{statistics.median(same.sums) * 1e3:.3f} ms: whole / sum "
                         f"{same.ratio:.2f}x (median of the rounds' quotients)")
        except Exception as err:  # report only
            log(f"!!! {name}: tasks timed again failed: {err}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- output
def fmt_rows(model: str, rows: list[Row]) -> list[str]:
    out = []
    for row in rows:
        if row.samples:
            ms = f"{np.median(row.samples) * 1e3:.3f}"
            vs_ort = f"{np.median(row.ratio_ort):.2f}" if row.ratio_ort else "-"
            vs_torch = f"{np.median(row.ratio_torch):.2f}" if row.ratio_torch else "-"
            vs_best = f"{np.median(row.ratio_best):.2f}" if row.ratio_best else "-"
        else:
            ms, vs_ort, vs_torch, vs_best = "FAILED", "-", "-", "-"
        wall = f"{row.tune_secs:.0f}" if row.tune_secs is not None else "-"
        if row.contender == "pytorch":
            diff = "(reference)"
        elif row.max_abs is None:
            diff = "-"
        else:
            diff = f"{row.max_abs:.2e} (rel {row.max_rel:.1e})"
        if row.mismatch:
            diff = f"**MISMATCH** {diff}"
        if row.error:
            diff += f" ERROR: {row.error.splitlines()[0][:120]}"
        out.append(f"| {model} | {row.contender} | {row.trials} | {ms} | {vs_best} | {vs_ort} "
                   f"| {vs_torch} | {wall} | {diff} |")
    return out


TABLE_HEAD = ["| model | contender | trials | latency ms (median) | vs best alternative "
              "| vs ONNX Runtime | vs PyTorch | tune wall s | max \\|diff\\| vs PyTorch |",
              "|---|---|---|---|---|---|---|---|---|"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODEL_NAMES,
                        choices=MODEL_NAMES + MORE_MODEL_NAMES)
    parser.add_argument("--trials", nargs="*", type=int, default=[],
                        help="absolute relax_tune (and MetaSchedule) budgets")
    parser.add_argument("--trials-per-task", nargs="*", type=int, default=None,
                        help="budgets as multiples of the model's task count "
                             "(default 1 8 32 unless --trials is given)")
    parser.add_argument("--max-time", type=float, default=None,
                        help="add a relax_tune row tuned for this many seconds (fresh work_dir)")
    parser.add_argument("--seconds", nargs="*", type=float, default=[],
                        help="relax_tune rows by time budget (max_time, no trial limit), each "
                             "in a fresh work_dir; 0 is the no-measurement compile "
                             "(measure=False), e.g. --seconds 0 30 60 120 300")
    parser.add_argument("--no-transfer-seconds", nargs="*", type=float, default=[],
                        help="as --seconds, with transfer=False (no schedule of an alike "
                             "workload, no shipped library): what transfer adds")
    parser.add_argument("--max-time-trials", type=int, default=100_000,
                        help="trial budget of the --max-time row (large: the time binds)")
    parser.add_argument("--fresh", action="store_true",
                        help="tune each relax_tune budget in its own work_dir (default: one "
                             "work_dir, resumed; cumulative wall time)")
    parser.add_argument("--metaschedule", action="store_true",
                        help="add MetaSchedule rows at the same budgets (1-3 s per trial here)")
    parser.add_argument("--ms-trials-per-round", type=int, default=64,
                        help="MetaSchedule's num_trials_per_iter (its default: 64)")
    parser.add_argument("--ms-same-graph", action="store_true",
                        help="run relax_tune's graph passes (batch norm folded into convolutions,"
                             " ...) before MetaSchedule's lowering, so both tune the same graph "
                             "(default: TVM's stock static_shape_tuning lowering)")
    parser.add_argument("--per-task", action="store_true",
                        help="per-task time table for the largest relax_tune budget")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="leave OpenVINO out (pip install openvino, or '.[bench]')")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="leave torch.compile out (max-autotune compiles for minutes and "
                             "needs a C++ compiler)")
    parser.add_argument("--torch-compile-timeout", type=float, default=1800, metavar="SECONDS",
                        help="torch.compile that takes longer is an error row (default 1800)")
    parser.add_argument("--small", action="store_true", help="reduced input sizes (smoke run)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for every contender (default: usable cores)")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for PyTorch's OpenMP threads (only torch "
                             "uses OpenMP here): on a machine other processes keep busy, "
                             "spinning OpenMP barriers make PyTorch 10-20x slower")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pause", type=float, default=0.4,
                        help="seconds of sleep before each timing")
    parser.add_argument("--min-secs", type=float, default=0.2,
                        help="each round times as many calls as fill this many seconds")
    parser.add_argument("--tol", type=float, default=1e-3,
                        help="max |diff| / max |PyTorch output| above which a row is flagged")
    parser.add_argument("--work-root", default=None,
                        help="keep the work_dirs (and ONNX files) here instead of a temp dir")
    parser.add_argument("--cost-model", default="xgb-prior",
                        help="relax_tune's cost model: xgb-prior (the shipped pre-trained model, "
                             "the default), xgb (session-only XGBoost), random, none")
    parser.add_argument("--prior-trials-per-task", nargs="*", type=int, default=[],
                        help="add relax_tune(prior) rows tuned with cost_model='xgb-prior' at "
                             "these multiples of the task count, in their own work_dir (with "
                             "--cost-model xgb: the prior against no prior in one run)")
    parser.add_argument("--cache-flush", action="store_true",
                        help="relax_tune measures every candidate with cold caches for all "
                             "but its first argument (LocalRunner(enable_cpu_cache_flush=True)"
                             "): weights come from memory, as inside the whole model")
    parser.add_argument("--no-winograd", dest="winograd", action="store_false",
                        help="relax_tune without Winograd 3x3 convolutions (the pipeline's "
                             "winograd=False)")
    parser.add_argument("--int8", action="store_true",
                        help="quantize each model with ONNX Runtime's quantize_static (QDQ) and "
                             "compare PyTorch, ONNX Runtime float32 and int8 and relax_tune int8 "
                             "(benchmarks/int8.py)")
    parser.add_argument("--int8-float", action="store_true",
                        help="--int8: also tune relax_tune float32 on the float ONNX file at "
                             "the same budgets, and report int8 against it")
    parser.add_argument("--calibration", type=int, default=8,
                        help="--int8: random calibration inputs for the quantizer")
    parser.add_argument("--reduce-range", choices=["auto", "on", "off"], default="auto",
                        help="--int8: quantize weights to 7 bits (ONNX Runtime's reduce_range); "
                             "auto: where the target's int8 instruction is AVX2's vpmaddubsw "
                             "(no VNNI), as ONNX Runtime recommends there")
    parser.add_argument("--int8-steps", type=float, default=8.0,
                        help="--int8: output quantisation steps from ONNX Runtime's int8 "
                             "output above which a row is flagged")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.trials_per_task is None:
        args.trials_per_task = [] if args.trials or args.seconds or args.no_transfer_seconds \
            else [1, 8, 32]

    threads = args.threads or len(os.sched_getaffinity(0))
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch (its libgomp) is imported
    import logging

    import torch

    set_torch_threads(torch, threads)
    import tvm

    import relax_tune as rt
    from relax_tune.utils import ensure_tvm_threads

    # before TVM's first parallel kernel and its workers (its pool reads them when it starts)
    ensure_tvm_threads(threads)

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    target = rt.host_target()
    if args.metaschedule:
        import_tensor_intrin()  # before any clock starts

    prior_rows = (f"; with xgb-prior per task {args.prior_trials_per_task}"
                  if args.prior_trials_per_task else "")
    header = [
        f"CPU: {cpu_model()} ({len(os.sched_getaffinity(0))} usable cores); "
        f"target: {target}",
        f"relax_tune commit: {relax_tune_commit()}",
        f"threads: {threads} for every contender (TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}"
        f" TVM_BIND_THREADS={os.environ['TVM_BIND_THREADS']},"
        f" torch.set_num_threads({torch.get_num_threads()}) for eager and torch.compile, ONNX "
        f"Runtime intra_op={threads} inter_op=1, OpenVINO INFERENCE_NUM_THREADS={threads}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})",
        f"versions: tvm {tvm.__version__}, torch {torch.__version__}, onnxruntime "
        f"{module_version('onnxruntime')}, openvino "
        f"{module_version('openvino') if args.openvino else 'off'}"
        f"{'' if args.torch_compile else ', torch.compile off'}; inputs "
        f"{'small (--small)' if args.small else 'full size'}; batch 1, float32, random weights",
        f"relax_tune budgets: {'fresh work_dir each' if args.fresh else 'incremental, one work_dir'}"
        f"{f'; by time {args.seconds} s, a fresh work_dir each' if args.seconds else ''}"
        f" (trials {args.trials or '-'}, per task {args.trials_per_task or '-'}, cost model "
        f"{args.cost_model}{prior_rows}"
        f"{f', max_time {args.max_time:.0f} s' if args.max_time else ''})"
        f"{'; candidates timed with cold caches (--cache-flush)' if args.cache_flush else ''}",
        f"timing: {args.rounds} interleaved rounds, {args.pause} s pause, >= {args.min_secs} s "
        f"of calls per round; median of per-round means; load at start {os.getloadavg()}",
    ]
    load = os.getloadavg()[0]
    if load > 0.5 * len(os.sched_getaffinity(0)):
        header.append(f"WARNING: the machine is busy (load {load:.1f} on "
                      f"{len(os.sched_getaffinity(0))} cores): multi-threaded timings degrade "
                      "under contention, PyTorch's OpenMP worst (MobileNetV2 64x64 with 2 "
                      "threads while two other processes ran: 287 ms, 19 ms with "
                      "--omp-passive, 17 ms on 1 thread)")
    for line in header:
        print(line, flush=True)

    root = args.work_root or tempfile.mkdtemp(prefix="bench_real_models_")
    os.makedirs(root, exist_ok=True)
    table = list(TABLE_HEAD)
    infos: list[str] = []
    failed = False
    try:
        for name in args.models:
            rows, info = (bench_int8_model(name, args, target, root, threads, log)
                          if args.int8 else bench_model(name, args, target, root, threads))
            infos.append(info)
            part = fmt_rows(name, rows)
            table += part
            failed |= any(r.mismatch or r.error for r in rows)
            print("\n".join(TABLE_HEAD + part), flush=True)
    finally:
        if args.work_root is None:
            shutil.rmtree(root, ignore_errors=True)

    print()
    for line in header:
        print(line)
    print(f"load at end {os.getloadavg()}")
    for note in NOTES:
        print(f"note: {note}")
    print()
    print("\n".join(table))
    print()
    print("trials: measured/budget (relax_tune stops converged, exhausted or too-cheap tasks "
          "early); tune wall s: whole tvm.compile (tuning + build)"
          + ("" if args.fresh else ", cumulative over the relax_tune budgets of one work_dir")
          + "; vs X: X ms / row ms, median of per-round ratios (>1: faster than X)")
    for info in infos:
        print()
        print(info)
    if failed:
        print("\n!!! SOME ROWS FAILED OR DO NOT MATCH PYTORCH (see MISMATCH / ERROR above) !!!")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
