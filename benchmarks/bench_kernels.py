"""Tune single kernels and the demo model with relax_tune and print them next to numpy/OpenBLAS,
the untuned build and (optionally) MetaSchedule, all measured in this one invocation.

    python -m benchmarks.bench_kernels --workload matmul conv2d demo --trials 64 256 \
        --metaschedule 64 [--prepack]

Rows: ``numpy/OpenBLAS`` (the reference), ``untuned`` (the function as lowered), ``relax_tune``
at each trial count (tuning wall time, trials/s), ``metaschedule`` at each ``--metaschedule``
trial count (TVM's tune_tir with the builder initializer of
shared/notes/metaschedule-baseline.md; ``tvm.s_tir.tensor_intrin`` imported before any clock).
Every kernel is re-timed here after all tuning of its workload, interleaved with numpy and
the other kernels, 11 rounds (``benchmarks/timing.py``: this machine's speed drifts
by 20-40% over minutes): "ms" is the median over rounds and "vs numpy" the median of the
per-round ratios. The untuned kernel, too slow for rounds, is timed by 3 calls.
For ``demo`` the whole VM call is timed (untuned vs the records applied).

``--prepack`` adds ``+pack`` rows: the same kernels tuned with the weight (matmul's B,
conv2d's kernel) marked layout-free, as a compiled model's constant weights are
(``cpu_weight_prepack``): the schedule may store it packed, and the packing, done once at
compile time in a model, is not timed (MetaSchedule's RewriteLayout gets the same marking).

Timing on a small shared machine is noisy: every figure is a median of repeated runs, and the
ratio to numpy measured in the same rounds is the number to compare across runs.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import numpy as np
import tvm
from tvm import te, topi

import relax_tune as rt
from relax_tune.utils import ensure_tvm_threads, normalize_mod

from benchmarks.timing import interleaved, kernel_timer, numpy_timer, packed_kernel

WEIGHT_ARG = {"matmul": 1, "conv2d": 1}
"""The argument of each kernel workload that is a model weight (``--prepack``)."""


def matmul(n: int = 1024):
    """C = A @ B, n x n x n float32; returns (PrimFunc, flops, numpy reference fn, input shapes)."""
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C]), 2.0 * n**3, lambda a, b: a @ b, [(n, n), (n, n)]


def conv2d():
    """NCHW conv2d 1x64x56x56, 64 filters 3x3, pad 1, float32 (numpy: im2col + GEMM)."""
    data = te.placeholder((1, 64, 56, 56), "float32", name="data")
    weight = te.placeholder((64, 64, 3, 3), "float32", name="weight")
    out = topi.nn.conv2d_nchw(data, weight, 1, 1, 1)
    flops = 2.0 * 64 * 56 * 56 * 64 * 9

    def ref(x, w):
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.lib.stride_tricks.sliding_window_view(xp[0], (3, 3), axis=(1, 2))
        cols = cols.transpose(0, 3, 4, 1, 2).reshape(64 * 9, 56 * 56)
        return (w.reshape(64, 64 * 9) @ cols).reshape(1, 64, 56, 56)

    return te.create_prim_func([data, weight, out]), flops, ref, [(1, 64, 56, 56), (64, 64, 3, 3)]


WORKLOADS = {"matmul": matmul, "conv2d": conv2d}
MODELS = ("demo",)


def _import_tensor_intrin() -> None:
    import tvm.s_tir.tensor_intrin  # noqa: F401  (slow: once per MetaSchedule builder worker)


def prepare_kernel(mod: tvm.IRModule, target, inputs, ref) -> tuple:
    """Compile ``mod`` (a workload, scheduled or not), check it against ``ref`` and return
    ``(lib, args, seconds of the checked call)``. When its schedule packs a weight, the
    packing runs here, once, and ``args`` hold the packed weight: only the kernel is timed,
    as in a model with constant weights."""
    dev = tvm.cpu()
    args_ = [tvm.runtime.tensor(x, dev) for x in inputs]
    expected = ref(*inputs)
    args_.append(tvm.runtime.empty(expected.shape, "float32", dev))
    lib, args_ = packed_kernel(mod, target, args_)
    start = time.perf_counter()
    lib["main"](*args_)
    once = time.perf_counter() - start
    np.testing.assert_allclose(args_[-1].numpy(), expected, rtol=1e-3, atol=1e-3)
    return lib, args_, once


def time_kernel(mod: tvm.IRModule, target, inputs, ref) -> float:
    """Median seconds of ``mod``'s kernel on its own (``prepare_kernel``; a slow one, such as
    the untuned function, is timed by 3 calls)."""
    lib, args_, once = prepare_kernel(mod, target, inputs, ref)
    number, repeat = (10, 5) if once < 0.1 else (1, 3)
    timer = lib.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
    return float(np.median(timer(*args_).results))


def metaschedule_kernel(func, target, trials: int, inputs, ref) -> tuple:
    """MetaSchedule's best kernel for ``func`` after ``trials`` trials: (its timer, tune
    wall seconds)."""
    from tvm.s_tir import meta_schedule as ms

    mod = normalize_mod(func)
    with tempfile.TemporaryDirectory() as work_dir:
        start = time.perf_counter()
        db = ms.tune_tir(mod, target, work_dir, max_trials_global=trials,
                         builder=ms.builder.LocalBuilder(initializer=_import_tensor_intrin))
        wall = time.perf_counter() - start
        sch = ms.tir_integration.compile_tir(db, mod, target)
        lib, args_, _ = prepare_kernel(sch.mod, target, inputs, ref)
        return kernel_timer(lib, args_), wall


def bench_demo(target, trials_list: list[int], rows: list) -> None:
    """The demo MLP: untuned whole-model latency and relax_tune at each trial count (the VM
    call; numpy's row is the same MLP in numpy)."""
    from tvm import relax

    from relax_tune.demo import demo_inputs, demo_model, time_model

    mod, params = demo_model()
    with target:
        lowered = relax.get_pipeline("zero")(mod)
    inputs = demo_inputs(params)
    x, w1, b1, w2 = inputs
    flops = 2.0 * (784 * 256 + 256 * 10)
    np_secs = numpy_timer(lambda: np.maximum(x @ w1.T + b1, 0) @ w2.T, calls=50)()
    rows.append(("demo", "numpy/OpenBLAS", "-", np_secs, flops, None, 1.0))
    before = time_model(lowered, target, inputs)
    rows.append(("demo", "untuned", "-", before.median_secs, flops, None,
                 np_secs / before.median_secs))
    for trials in trials_list:
        with tempfile.TemporaryDirectory() as work_dir:
            tasks = rt.extract_tasks(lowered, target)
            start = time.perf_counter()
            reports = rt.tune_tasks(tasks, work_dir, max_trials_global=trials)
            wall = time.perf_counter() - start
            with target:
                tuned = rt.ApplyDatabase(work_dir=work_dir)(lowered)
            after = time_model(tuned, target, inputs)
            np.testing.assert_allclose(after.output, before.output, rtol=1e-4, atol=1e-4)
            done = sum(r.new_trials for r in reports)
            rows.append(("demo", "relax_tune", trials, after.median_secs, flops,
                         (wall, done / wall, sum(r.failures for r in reports)),
                         np_secs / after.median_secs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=["matmul"],
                        choices=sorted(WORKLOADS) + list(MODELS))
    parser.add_argument("--trials", nargs="+", type=int, default=[64])
    parser.add_argument("--metaschedule", nargs="*", type=int, default=[],
                        help="MetaSchedule trial counts to run as a baseline (kernels only)")
    parser.add_argument("--convergence-window", type=int, default=None,
                        help="tune_tasks' convergence stop (0: spend every trial)")
    parser.add_argument("--prepack", action="store_true",
                        help="also tune with the weight layout-free (constant weights)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    for name in ("relax_tune", "tvm"):
        logging.getLogger(name).setLevel(logging.INFO if args.verbose else logging.WARNING)
    threads = ensure_tvm_threads()
    target = rt.host_target()
    if args.metaschedule:
        _import_tensor_intrin()  # before any clock starts
    print(f"target: {target}, TVM threads: {threads}")
    tune_kwargs = ({} if args.convergence_window is None
                   else {"convergence_window": args.convergence_window})
    rows = []
    for name in args.workload:
        if name in MODELS:
            bench_demo(target, args.trials, rows)
            continue
        func, flops, ref, shapes = WORKLOADS[name]()
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, s).astype("float32") for s in shapes]
        timers = {"numpy": numpy_timer(lambda: ref(*inputs))}
        tuned = []  # (what, trials, timer key, extra)
        untuned = time_kernel(normalize_mod(func), target, inputs, ref)
        variants = [("", func)]
        if args.prepack:
            variants.append(("+pack", func.with_attr("layout_free_buffers",
                                                     [WEIGHT_ARG[name]])))
        for suffix, variant in variants:
            for trials in args.trials:
                with tempfile.TemporaryDirectory() as work_dir:
                    task = rt.extract_tasks(tvm.IRModule({name: variant}), target)[0]
                    start = time.perf_counter()
                    report = rt.tune_tasks([task], work_dir, max_trials_global=trials,
                                           **tune_kwargs)[0]
                    wall = time.perf_counter() - start
                    # Re-time the applied best kernel here, in the same run as numpy.
                    db = rt.JSONDatabase(work_dir=work_dir)
                    sch = db.query_schedule(normalize_mod(variant), target)
                    lib, args_, _ = prepare_kernel(sch.mod, target, inputs, ref)
                    key = f"relax_tune{suffix}@{trials}"
                    timers[key] = kernel_timer(lib, args_)
                    tuned.append(("relax_tune" + suffix, trials, key,
                                  (wall, report.new_trials / wall, report.failures)))
            for trials in args.metaschedule:
                timer, wall = metaschedule_kernel(variant, target, trials, inputs, ref)
                key = f"metaschedule{suffix}@{trials}"
                timers[key] = timer
                tuned.append(("metaschedule" + suffix, trials, key, (wall, trials / wall, 0)))
        timed = interleaved(timers, "numpy", rounds=11)
        np_secs = timed["numpy"][0]
        rows.append((name, "numpy/OpenBLAS", "-", np_secs, flops, None, 1.0))
        rows.append((name, "untuned", "-", untuned, flops, None, np_secs / untuned))
        for what, trials, key, extra in tuned:
            rows.append((name, what, trials, timed[key][0], flops, extra, timed[key][1]))
    print()
    print(f"{'workload':<9}{'what':<16}{'trials':>7}{'ms':>11}{'GFLOP/s':>9}{'vs numpy':>9}"
          f"{'tune s':>8}{'trials/s':>9}{'failed':>7}")
    for name, what, trials, secs, flops, extra, vs_numpy in rows:
        if secs is None:
            continue
        tail = f"{extra[0]:>8.1f}{extra[1]:>9.2f}{extra[2]:>7}" if extra else ""
        print(f"{name:<9}{what:<16}{trials!s:>7}{secs * 1e3:>11.3f}{flops / secs / 1e9:>9.1f}"
              f"{vs_numpy:>8.2f}x{tail}")


if __name__ == "__main__":
    main()
