"""Int8 kernels on the target's instruction against the block rules and float32, for one
``mcpu`` (cross-compiled; it must run on this host):

    python -m benchmarks.bench_int8_kernels --mcpu znver3 --trials 16 --rounds 7
    python -m benchmarks.bench_int8_kernels --mcpu emeraldrapids --trials 16 --rounds 7

Workloads (``relax_tune.testing.int8_kernels``, weights bound: packed once, not timed):
``matmul`` u8 128x768 x s8 768x768 and ``conv2d`` u8 1x128x28x28 padded with its zero point
x s8 128x128x3x3, each with the requantisation epilogue. Rows, each tuned with ``--trials``
trials in a fresh work_dir, then all re-timed interleaved (``benchmarks/timing.py``:
median over rounds, ratio to float32 as the median of per-round ratios):

- ``instruction``: the default design space (``Int8DotProduct`` on the instruction
  ``int8_dot_intrinsic`` reads from the target's features);
- ``narrow (7-bit)``: on a target whose instruction has a narrow variant (AVX2's
  ``vpmaddubsw``), the same layer with 7-bit weights (ONNX Runtime's ``reduce_range``), which
  ``MarkNarrowWeightPairs`` marks and the space tensorizes with that variant;
- ``no AMX``: on a target with AMX tiles, the default space without its AMX sketches
  (``Int8DotProduct`` on the dot-product instruction only);
- ``block rules``: the same int8 kernel and target, the space without ``Int8DotProduct``
  (the CPU space re-registered for this run only): what the kernel gets without the rule;
- ``float32``: the same layer in float32 (zero-padded, ReLU), the default space.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import tvm

import relax_tune as rt
from relax_tune.utils import ensure_tvm_threads

from benchmarks.timing import interleaved, packed_kernel, kernel_timer

SHAPES = {"matmul": {"rows": 128, "reduce": 768, "channels": 768},
          "conv2d": {"reduce": 128, "channels": 128, "size": 28}}
"""The layers measured (``integer_kernel`` / ``float_kernel`` arguments)."""


@contextlib.contextmanager
def cpu_space_with(function_rules):
    """The ``llvm`` design space with ``function_rules(params, target)`` as its whole-function
    rules while the block is open."""
    from relax_tune.space.cpu import space as cpu
    from relax_tune.space.generator import SpaceGenerator, register_space

    def factory(target, params):
        return SpaceGenerator(target, cpu.cpu_rules(params), cpu.cpu_postprocs(params),
                              params, function_rules(params, target))

    register_space("llvm", factory)
    try:
        yield
    finally:
        register_space("llvm", cpu.cpu_space)


def block_rules_only():
    """The ``llvm`` design space without ``Int8DotProduct`` while the block is open."""
    from relax_tune.space.cpu import space as cpu

    return cpu_space_with(lambda params, target: [cpu.FusedAttention(params)])


def without_amx():
    """The ``llvm`` design space with ``Int8DotProduct`` on the dot-product instruction only
    (no AMX sketches) while the block is open."""
    from relax_tune.space.cpu import space as cpu
    from relax_tune.space.cpu.int8_intrin import int8_dot_intrinsic

    return cpu_space_with(lambda params, target: [
        cpu.FusedAttention(params), cpu.Int8DotProduct(params, int8_dot_intrinsic(target))])


def tuned_timer(mod: tvm.IRModule, target, trials: int):
    """``mod`` tuned with ``trials`` trials: (a timer of its best kernel, tune seconds)."""
    from relax_tune.testing.int8_kernels import kernel_args

    with tempfile.TemporaryDirectory() as work_dir:
        start = time.perf_counter()
        rt.tune_tir(mod, target, work_dir=work_dir, max_trials_global=trials,
                    num_trials_per_iter=min(trials, 8))
        wall = time.perf_counter() - start
        sch = rt.JSONDatabase(work_dir=work_dir).query_schedule(mod, target)
    lib, args = packed_kernel(sch.mod, target, kernel_args(mod))
    return kernel_timer(lib, args), wall


def main() -> None:
    from relax_tune.testing.int8_kernels import float_kernel, integer_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcpu", default="znver3")
    parser.add_argument("--workload", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    threads = ensure_tvm_threads()
    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu, "num-cores": threads})
    from relax_tune.space.cpu.amx_intrin import has_amx
    from relax_tune.space.cpu.int8_intrin import int8_dot_intrinsic, narrow_variant
    print(f"target {target}, instruction {int8_dot_intrinsic(target)}, AMX {has_amx(target)}, "
          f"threads {threads}")
    for name in args.workload:
        shape = SHAPES[name]
        conv = name == "conv2d"
        int8 = integer_kernel(name, target, zero_point=3 if conv else None,
                              weights_bound=True, **shape)
        fp32 = float_kernel(name, target, pad=conv, weights_bound=True, **shape)
        timers, walls = {}, {}
        timers["instruction"], walls["instruction"] = tuned_timer(int8, target, args.trials)
        if narrow_variant(int8_dot_intrinsic(target) or "") is not None:
            narrow = integer_kernel(name, target, zero_point=3 if conv else None,
                                    weights_bound=True, weight_bits=7, **shape)
            timers["narrow (7-bit)"], walls["narrow (7-bit)"] = tuned_timer(
                narrow, target, args.trials)
        if has_amx(target):  # the default space has AMX sketches: the same without them
            with without_amx():
                timers["no AMX"], walls["no AMX"] = tuned_timer(int8, target, args.trials)
        with block_rules_only():
            timers["block rules"], walls["block rules"] = tuned_timer(int8, target,
                                                                      args.trials)
        timers["float32"], walls["float32"] = tuned_timer(fp32, target, args.trials)
        timed = interleaved(timers, "float32", rounds=args.rounds)
        print(f"\n{name} {shape}, {args.trials} trials each, {args.rounds} rounds")
        print(f"{'kernel':<16}{'us':>10}{'vs float32':>12}{'tune s':>8}")
        for key, (secs, ratio) in timed.items():
            print(f"{key:<16}{secs * 1e6:>10.1f}{ratio:>11.2f}x{walls[key]:>8.0f}")


if __name__ == "__main__":
    main()
