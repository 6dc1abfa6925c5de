"""Whole-model latency: the untuned build, TVM's static_shape_tuning pipeline (MetaSchedule)
and the "relax_tune" pipeline at equal trials, all compiled and timed in this one run.

    python -m benchmarks.bench_models --models mlp conv_net transformer_block --trials 64
    python -m benchmarks.bench_models --models mlp --trials 256

Rows per model and trial count:
- ``untuned``: ``relax.get_pipeline("zero")`` then ``tvm.compile`` (weights are inputs).
- ``metaschedule``: TVM's ``static_shape_tuning_pipeline`` as written (weights are inputs,
  ``cpu_weight_prepack=False``), with one change for fairness on this machine: the builder's
  workers import ``tvm.s_tir.tensor_intrin`` once in an initializer (see
  shared/notes/metaschedule-baseline.md), since that pipeline's pass cannot take a builder.
- ``metaschedule+bound``: the same MetaSchedule records applied to the model with its weights
  bound (no extra trials), to separate what binding gives from what tuning gives.
- ``relax_tune``: ``relax.get_pipeline("relax_tune", params=weights, ...)`` (weights bound,
  weight-only kernels folded, weights prepacked in the layouts the tuned kernels chose:
  ``cpu_weight_prepack`` is on by default with params); ``+lifted``: same records, weights
  kept as runtime inputs
  through ``forward_transform_params``; ``+compiled-vm``: same records, ``exec_mode=
  "compiled"``; ``-no-prepack`` (``--without-prepack``): tuned again (own trials) with
  ``cpu_weight_prepack=False``, weights bound in their original layouts.

Latencies are medians of ``time_evaluator`` over three interleaved rounds taken after all
variants of a model are built, so all rows of a model see the same machine load.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune.testing.models import MODELS, get_model, model_inputs, split_inputs


def _import_tensor_intrin() -> None:
    import tvm.s_tir.tensor_intrin  # noqa: F401  (registers intrinsics; slow, so once per worker)


def metaschedule_pipeline(total_trials: int, target: tvm.target.Target, work_dir: str):
    """TVM's static_shape_tuning_pipeline (cpu_weight_prepack=False) with a warm builder."""
    from tvm.s_tir import meta_schedule as ms

    @tvm.transform.module_pass(opt_level=0, name="bench.static_shape_tuning")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            mod = tvm.transform.Sequential([
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                relax.get_pipeline("zero"),
            ])(mod)
            if total_trials > 0:
                ms.relax_integration.tune_relax(
                    mod, {}, target, work_dir, total_trials,
                    builder=ms.builder.LocalBuilder(initializer=_import_tensor_intrin))
            return relax.transform.MetaScheduleApplyDatabase(work_dir)(mod)

    return _pipeline


class Variant:
    """One compiled model: how to call it, and its tuning wall time."""

    def __init__(self, what: str, trials, ex, args: list, tune_secs: float | None):
        self.what, self.trials, self.tune_secs = what, trials, tune_secs
        self.vm = relax.VirtualMachine(ex, tvm.cpu())
        self.args = args
        self.samples: list[float] = []

    def output(self) -> np.ndarray:
        """The model's output on the benchmark inputs."""
        return self.vm["forward"](*self.args).numpy()

    def time_round(self, number: int, repeat: int) -> None:
        """Add one ``time_evaluator`` median (seconds per call) to ``samples``."""
        timer = self.vm.time_evaluator("forward", tvm.cpu(), number=number, repeat=repeat)
        self.samples.append(float(np.median(timer(*self.args).results)))


def bench_model(name: str, trials_list: list[int], target, root: str, with_ms: bool,
                without_prepack: bool = False, rounds: int = 3) -> list[Variant]:
    """Build every variant of model ``name``, check outputs, time them interleaved."""
    mod, _ = get_model(name)
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    dev = tvm.cpu()
    all_args = [tvm.runtime.tensor(a, dev) for a in arrays]
    in_args = [tvm.runtime.tensor(a, dev) for a in inputs]
    w_args = [tvm.runtime.tensor(a, dev) for a in weights.values()]

    with target:
        zero = relax.get_pipeline("zero")(mod)
    variants = [Variant("untuned", "-", tvm.compile(zero, target), all_args, None)]
    for trials in trials_list:
        if with_ms:
            ms_dir = os.path.join(root, f"{name}-ms-{trials}")
            start = time.perf_counter()
            ms_mod = metaschedule_pipeline(trials, target, ms_dir)(mod)
            wall = time.perf_counter() - start
            variants.append(Variant("metaschedule", trials, tvm.compile(ms_mod, target),
                                    all_args, wall))
            bound = metaschedule_pipeline(0, target, ms_dir)(rt.transform.bind_params(mod, weights))
            variants.append(Variant("metaschedule+bound", trials, tvm.compile(bound, target),
                                    in_args, None))
        rt_dir = os.path.join(root, f"{name}-rt-{trials}")
        start = time.perf_counter()
        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=rt_dir, max_trials_global=trials,
            params=weights))
        wall = time.perf_counter() - start
        variants.append(Variant("relax_tune", trials, ex, in_args, wall))
        lifted = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=rt_dir, max_trials_global=0,
            lift_transform_params=True))
        lvm = relax.VirtualMachine(lifted, dev)
        packed = list(lvm["forward_transform_params"](w_args))
        variants.append(Variant("relax_tune+lifted", trials, lifted, in_args + packed, None))
        compiled = relax.build(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=rt_dir, max_trials_global=0,
            params=weights), exec_mode="compiled")
        variants.append(Variant("relax_tune+compiled-vm", trials, compiled, in_args, None))
        if without_prepack:
            plain_dir = os.path.join(root, f"{name}-rt-plain-{trials}")
            start = time.perf_counter()
            ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
                "relax_tune", target=target, work_dir=plain_dir, max_trials_global=trials,
                params=weights, cpu_weight_prepack=False))
            wall = time.perf_counter() - start
            variants.append(Variant("relax_tune-no-prepack", trials, ex, in_args, wall))

    ref = variants[0].output()
    for v in variants[1:]:
        np.testing.assert_allclose(v.output(), ref, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{name} {v.what} {v.trials}")
    for _ in range(rounds):
        for v in variants:
            v.time_round(number=100, repeat=5)
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp"], choices=list(MODELS))
    parser.add_argument("--trials", nargs="+", type=int, default=[64])
    parser.add_argument("--no-metaschedule", action="store_true",
                        help="skip the MetaSchedule rows (they cost 1-3 s per trial here)")
    parser.add_argument("--without-prepack", action="store_true",
                        help="add relax_tune-no-prepack: tuned again, cpu_weight_prepack=False")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    target = rt.host_target()
    if not args.no_metaschedule:
        _import_tensor_intrin()  # before any clock starts
    print(f"target: {target}; load: {os.getloadavg()}")
    head = (f"{'model':<18}{'what':<24}{'trials':>7}{'us/call':>10}{'vs MS':>8}"
            f"{'vs untuned':>11}{'tune s':>8}")
    lines = [head, "-" * len(head)]
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            variants = bench_model(name, args.trials, target, root,
                                   with_ms=not args.no_metaschedule,
                                   without_prepack=args.without_prepack)
            med = {(v.what, v.trials): float(np.median(v.samples)) for v in variants}
            base = med[("untuned", "-")]
            for v in variants:
                secs = med[(v.what, v.trials)]
                ms_secs = med.get(("metaschedule", v.trials))
                vs_ms = f"{secs / ms_secs:.2f}" if ms_secs else "-"
                tune = f"{v.tune_secs:.1f}" if v.tune_secs is not None else "-"
                lines.append(f"{name:<18}{v.what:<24}{v.trials!s:>7}{secs * 1e6:>10.1f}"
                             f"{vs_ms:>8}{base / secs:>10.2f}x{tune:>8}")
            print("\n".join(lines[-len(variants):]), flush=True)
    print(f"\nload after: {os.getloadavg()}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
