"""The CUDA path on a real GPU, in steps a device session runs in a few minutes
(docs/results/cuda-h200.md). Each step prints its figures as one JSON line.

- ``pipeline``: the demo's MLP through the "relax_tune" pipeline on cuda (a few trials), run on
  the GPU and compared with the untuned CPU build; then compiled again from its records alone.
- ``matmul``: one 1024^3 float32 matmul tuned for ``--seconds``; dlight's kernel (the baseline)
  against the best, per the session's own timings.
- ``model``: a torchvision model (ResNet-18 by default) on the GPU: PyTorch eager (TF32 off and
  on), TVM with dlight's default schedules, relax_tune with nothing measured and relax_tune
  after ``--seconds`` of tuning; medians of interleaved rounds, outputs against PyTorch's CPU
  output.

Without a GPU, ``--dry`` runs what needs none (import, lowering, CUDA code generation and the
no-measurement compile for ``--arch``) so the script is checked before device time is spent.

    python -m benchmarks.cuda_check pipeline matmul model --seconds 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np


def log(step: str, **figures) -> None:
    """One JSON line of a step's figures."""
    print(json.dumps({"step": step, **figures}), flush=True)


def gpu_target(arch: str | None):
    """The GPU's own target (its compute capability), or ``arch``'s where given."""
    import tvm

    from relax_tune.space.gpu import cuda_target

    if arch is None:
        major, minor = tvm.cuda(0).compute_version.split(".")
        arch = f"sm_{major}{minor}"
    return cuda_target(arch)


def vm_timer(ex, inputs_np: list[np.ndarray], rounds_calls: int = 20, func: str = "main"):
    """``(run, time)``: one call of ``func`` on the GPU (returns numpy), and the mean seconds
    of ``rounds_calls`` calls, synchronised."""
    import tvm
    from tvm import relax

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs_np]

    def run() -> np.ndarray:
        out = vm[func](*args)
        out = out[0] if not hasattr(out, "numpy") else out
        return out.numpy()

    def timed() -> float:
        dev.sync()
        start = time.perf_counter()
        for _ in range(rounds_calls):
            vm[func](*args)
        dev.sync()
        return (time.perf_counter() - start) / rounds_calls

    run()
    return run, timed


def step_pipeline(target, dry: bool) -> None:
    import tvm
    from tvm import relax

    from relax_tune.demo import demo_inputs, demo_model

    mod, params = demo_model()
    inputs = demo_inputs(params)
    weights = {name: arr for (name, _), arr in zip(params, inputs[1:])}
    cpu = tvm.compile(relax.get_pipeline("zero")(mod), "llvm")
    ref = relax.VirtualMachine(cpu, tvm.cpu())["forward"](
        *[tvm.runtime.tensor(a) for a in inputs]).numpy()
    with tempfile.TemporaryDirectory() as wd:
        start = time.perf_counter()
        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=wd, params=weights,
            **({"measure": False} if dry else {"max_trials_global": 8})))
        tuned_s = time.perf_counter() - start
        start = time.perf_counter()
        again = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=wd, params=weights, max_trials_global=0))
        again_s = time.perf_counter() - start
        if dry:
            log("pipeline", dry=True, compile_s=round(tuned_s, 1), again_s=round(again_s, 1))
            return
        run, timed = vm_timer(ex, inputs[:1], func="forward")
        out = run()
        run2, timed2 = vm_timer(again, inputs[:1], func="forward")
        log("pipeline", compile_with_tuning_s=round(tuned_s, 1),
            from_records_s=round(again_s, 1),
            max_abs_err=float(np.abs(out - ref).max()),
            same_from_records=bool(np.allclose(run2(), ref, rtol=1e-4, atol=1e-5)),
            us=round(timed() * 1e6, 1), us_from_records=round(timed2() * 1e6, 1))


def step_matmul(target, seconds: int, dry: bool) -> None:
    import tvm
    from tvm import te

    import relax_tune as rt

    a = te.placeholder((1024, 1024), name="A")
    b = te.placeholder((1024, 1024), name="B")
    k = te.reduce_axis((0, 1024), name="k")
    c = te.compute((1024, 1024), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    tasks = rt.extract_tasks(mod, target)
    if dry:
        log("matmul", dry=True, tasks=len(tasks))
        return
    with tempfile.TemporaryDirectory() as wd:
        start = time.perf_counter()
        (rep,) = rt.tune_tasks(tasks, wd, max_time=seconds, progress_bar=False)
        wall = time.perf_counter() - start
    flops = 2 * 1024 ** 3
    log("matmul", seconds=seconds, wall_s=round(wall, 1), trials=rep.trials,
        status=rep.status, dlight_us=round(rep.baseline_secs * 1e6, 1),
        best_us=round(rep.best_secs * 1e6, 1),
        best_tflops=round(flops / rep.best_secs / 1e12, 1),
        speedup=round(rep.baseline_secs / rep.best_secs, 2))


def torch_timer(model, x, tf32: bool, calls: int = 20):
    """The mean seconds of ``calls`` calls of ``model`` on the GPU (CUDA events)."""
    import torch

    def timed() -> float:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        with torch.inference_mode():
            model(x)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                model(x)
            end.record()
            torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    timed()
    return timed


def step_model(target, name: str, seconds: int, rounds: int, dry: bool) -> None:
    import torch
    import tvm
    from tvm import relax

    from benchmarks.real_models import make_model
    from relax_tune.model_loader import from_torch

    model, inputs, desc = make_model(name, small=False)
    with torch.inference_mode():
        ref = model(*inputs).numpy()
    loaded = from_torch(model, name, inputs)
    mod, params = loaded.mod, loaded.params
    inputs_np = [t.numpy() for t in inputs]
    builds: dict[str, tuple[object, float]] = {}

    def compile_with(label: str, **kw) -> None:
        start = time.perf_counter()
        try:
            ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
                "relax_tune", target=target, params=params, **kw))
        except Exception as err:  # a failed contender is a figure too: say it, go on
            log("model", contender=label, error=f"{type(err).__name__}: {str(err)[-800:]}")
            return
        builds[label] = (ex, time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as root:
        compile_with("dlight", work_dir=f"{root}/empty", max_trials_global=0)
        compile_with("predict", work_dir=f"{root}/predict", measure=False)
        if not dry:
            compile_with(f"tuned-{seconds}s", work_dir=f"{root}/tuned", max_time=seconds)
    if dry:
        log("model", dry=True, model=name, compiled={k: round(v[1], 1) for k, v in
                                                       builds.items()})
        return
    timers, errors = {}, {}
    for label, (ex, _) in builds.items():
        run, timers[label] = vm_timer(ex, inputs_np)
        out = run()
        errors[label] = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-12))
    gpu_model, x = model.cuda(), inputs[0].cuda()
    timers["torch-eager"] = torch_timer(gpu_model, x, tf32=False)
    timers["torch-eager-tf32"] = torch_timer(gpu_model, x, tf32=True)
    times: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(rounds):
        for label, timed in timers.items():
            times[label].append(timed())
    med = {k: statistics.median(v) for k, v in times.items()}
    log("model", model=name, desc=desc, rounds=rounds,
        median_us={k: round(v * 1e6, 1) for k, v in med.items()},
        vs_torch_eager={k: round(med["torch-eager"] / v, 2) for k, v in med.items()},
        compile_s={k: round(v[1], 1) for k, v in builds.items()},
        rel_err=errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="+", choices=["pipeline", "matmul", "model"])
    parser.add_argument("--seconds", type=int, default=60, help="tuning limit (matmul, model)")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--arch", default=None, help="e.g. sm_90; default: the GPU's")
    parser.add_argument("--dry", action="store_true", help="no GPU: what runs without one")
    args = parser.parse_args(argv)
    target = gpu_target(args.arch)
    for step in args.steps:
        start = time.perf_counter()
        try:
            if step == "pipeline":
                step_pipeline(target, args.dry)
            elif step == "matmul":
                step_matmul(target, args.seconds, args.dry)
            else:
                step_model(target, args.model, args.seconds, args.rounds, args.dry)
        except Exception as err:  # the next step still runs: device time is short
            import traceback

            traceback.print_exc()
            log(step, error=f"{type(err).__name__}: {err}")
        print(f"[{step}: {time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
