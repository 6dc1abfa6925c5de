"""Search efficiency: evolutionary+xgb vs replay vs MetaSchedule, same trial budget, one run.

    python -m benchmarks.bench_search --workload matmul conv2d --trials 128
    python -m benchmarks.bench_search --workload matmul --trials 64 --no-ms

For each workload and tuner it prints the best latency after 32/64/128 trials (each best
kernel re-timed here after all tuners ran, interleaved round by round with numpy and the
other kernels, ``benchmarks/timing.py``; median over rounds), the tuning wall time, seconds per
trial, and for relax_tune the share of wall time spent outside build+run (search, cost
model, database). MetaSchedule runs as the notes say is fair: tensor intrinsics imported
once before the clock and in its builder workers' initializer, a target with num-cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time

import numpy as np
import tvm

import relax_tune as rt
from relax_tune.measure import LocalBuilder, LocalRunner
from relax_tune.tuning.state import BASELINE_KEY
from relax_tune.database import candidate_key
from relax_tune.utils import FAILED_RUN_SECS, ensure_tvm_threads, normalize_mod

from benchmarks.bench_kernels import WORKLOADS  # the same workload definitions
from benchmarks.timing import interleaved, numpy_timer, trace_timer


class TimedBuilder(LocalBuilder):
    """LocalBuilder that adds up the wall time from each submit to its results (what the
    tuner does meanwhile, the search's prepare, counts as build time: it is hidden)."""

    spent = 0.0

    def submit(self, *args, **kwargs):
        start = time.perf_counter()
        pending = super().submit(*args, **kwargs)
        wait = pending.result

        def result():
            try:
                return wait()
            finally:
                self.spent += time.perf_counter() - start

        pending.result = result
        return pending


class TimedRunner(LocalRunner):
    """LocalRunner that adds up the wall time of its run calls."""

    spent = 0.0

    def run(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super().run(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - start

    def run_and_fetch(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super().run_and_fetch(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - start

    def time_and_fetch(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super().time_and_fetch(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - start


def records_in_order(work_dir: str) -> list[tuple[list, float]]:
    """(trace_json, mean run secs) of every tuning record in commit order, baselines left out
    (relax_tune and MetaSchedule write the same layout)."""
    out = []
    with open(os.path.join(work_dir, "database_tuning_record.json"), encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)[1]
            trace, run_secs = rec[0], rec[1]
            if candidate_key(trace) == BASELINE_KEY:
                continue
            secs = float(np.mean(run_secs)) if run_secs else FAILED_RUN_SECS
            out.append((trace, secs))
    return out


def best_after(records: list[tuple[list, float]], k: int) -> list | None:
    """The trace of the fastest valid record among the first ``k``."""
    valid = [(s, t) for t, s in records[:k] if s < FAILED_RUN_SECS * 0.5]
    return min(valid, key=lambda x: x[0])[1] if valid else None


def retimer(mod: tvm.IRModule, trace: list, target, inputs: list[np.ndarray], out_shape):
    """A timer (``timing.trace_timer``: packed weights packed once) of the kernel ``trace``
    makes, compiled here."""
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev) for x in inputs] + [tvm.runtime.empty(out_shape, "float32", dev)]
    return trace_timer(mod, trace, target, args)


def run_relax_tune(mod, target, work_dir: str, trials: int, strategy: str, cost_model):
    """Tune with relax_tune; returns (wall secs, build+run secs)."""
    builder, runner = TimedBuilder(), TimedRunner()
    task = rt.extract_tasks(mod, target)[0]
    start = time.perf_counter()
    try:
        rt.tune_tasks([task], work_dir, max_trials_global=trials, strategy=strategy,
                      cost_model=cost_model, builder=builder, runner=runner,
                      convergence_window=trials + 1, progress_bar=False)
        wall = time.perf_counter() - start
    finally:
        builder.shutdown()
        runner.shutdown()
    return wall, builder.spent + runner.spent


def _ms_initializer() -> None:
    import tvm.s_tir.tensor_intrin  # noqa: F401  (13 s here: pay it once per worker)


def run_metaschedule(mod, target, work_dir: str, trials: int) -> float:
    """Tune with MetaSchedule (evolutionary + xgb, its defaults); returns wall secs."""
    from tvm.s_tir import meta_schedule as ms

    builder = ms.builder.LocalBuilder(initializer=_ms_initializer)
    start = time.perf_counter()
    ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=32,
                builder=builder)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=["matmul", "conv2d"],
                        choices=sorted(WORKLOADS))
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--tuners", nargs="+", default=["evolutionary+xgb", "replay", "metaschedule"],
                        choices=["evolutionary+xgb", "evolutionary", "replay", "metaschedule"])
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    ensure_tvm_threads()
    target = rt.host_target()
    if "metaschedule" in args.tuners:
        _ms_initializer()  # before any clock starts
    print(f"target: {target}\nload: {os.getloadavg()}")
    checkpoints = [c for c in args.checkpoints if c <= args.trials]
    rows = []
    for name in args.workload:
        func, flops, ref, shapes = WORKLOADS[name]()
        mod = normalize_mod(func)
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, s).astype("float32") for s in shapes]
        out_shape = ref(*inputs).shape
        timers = {"numpy": numpy_timer(lambda: ref(*inputs))}
        done = []
        for tuner in args.tuners:
            with tempfile.TemporaryDirectory() as work_dir:
                if tuner == "metaschedule":
                    wall, measure = run_metaschedule(mod, target, work_dir, args.trials), None
                else:
                    strategy = "replay" if tuner == "replay" else "evolutionary"
                    model = "xgb" if tuner.endswith("xgb") else None
                    wall, measure = run_relax_tune(mod, target, work_dir, args.trials, strategy,
                                                   model)
                records = records_in_order(work_dir)
                for k in checkpoints:
                    trace = best_after(records, k)
                    try:
                        if trace is not None:
                            timers[f"{tuner}@{k}"] = retimer(mod, trace, target, inputs,
                                                             out_shape)
                    except Exception as err:  # a trace we cannot replay: say so, go on
                        print(f"  {tuner}: cannot re-time its best after {k}: {err}")
            done.append((tuner, len(records), wall, measure))
            print(f"  done: {name} {tuner} in {wall:.0f} s", flush=True)
        timed = interleaved(timers, "numpy")
        for tuner, n, wall, measure in done:
            bests = [timed[f"{tuner}@{k}"][0] if f"{tuner}@{k}" in timed else None
                     for k in checkpoints]
            last = next((f"{tuner}@{k}" for k in reversed(checkpoints)
                         if f"{tuner}@{k}" in timed), None)
            rows.append((name, tuner, n, bests, wall, measure, flops,
                         timed[last][1] if last else None))
        rows.append((name, "numpy/OpenBLAS", 0, [timed["numpy"][0]] * len(checkpoints),
                     0.0, None, flops, 1.0))
    print(f"\nload after: {os.getloadavg()}")
    head = "".join(f"{'ms@' + str(k):>10}" for k in checkpoints)
    print(f"{'workload':<8}{'tuner':<18}{'trials':>7}{head}{'GFLOP/s':>9}{'vs numpy':>9}"
          f"{'wall s':>8}{'s/trial':>8}{'outside b+r':>12}")
    for name, tuner, n, bests, wall, measure, flops, vs_numpy in rows:
        cells = "".join(f"{b * 1e3:>10.3f}" if b else f"{'-':>10}" for b in bests)
        last = next((b for b in reversed(bests) if b), None)
        gflops = f"{flops / last / 1e9:>9.1f}" if last else f"{'-':>9}"
        gflops += f"{vs_numpy:>8.2f}x" if vs_numpy else f"{'-':>9}"
        outside = f"{(wall - measure) / wall:>11.0%}" if measure is not None else f"{'-':>12}"
        print(f"{name:<8}{tuner:<18}{n:>7}{cells}{gflops}{wall:>8.0f}{wall / max(n, 1):>8.2f}"
              f"{outside:>12}")


if __name__ == "__main__":
    main()
