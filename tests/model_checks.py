"""Checks shared by the tests: outputs against TVM's untuned build, a tuned kernel
against its untuned function."""

from __future__ import annotations

import time

import numpy as np
import tvm
from tvm import relax

from relax_tune.testing.models import model_inputs, split_inputs


def untuned_output(mod: tvm.IRModule, target, arrays) -> np.ndarray:
    """The model compiled by TVM's default pipeline, every weight an input, on ``arrays``."""
    vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    return vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def run_zero_pipeline(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    """``mod``'s ``main`` on ``args``, built by TVM's "zero" pipeline for this CPU
    (nothing tuned): what a graph rewrite's result is compared with."""
    target = tvm.target.Target("llvm")
    with target:
        lowered = relax.get_pipeline("zero")(mod)
    vm = relax.VirtualMachine(tvm.compile(lowered, target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def assert_lifted_weights_swappable(mod: tvm.IRModule, target, pipeline) -> list:
    """Compile ``mod`` with ``pipeline`` (lifted weights), then run two weight sets through
    the same executable via ``forward_transform_params``; both must match the untuned model.
    Returns the last transformed weights (as ``forward`` takes them)."""
    vm = relax.VirtualMachine(tvm.compile(mod, target, relax_pipeline=pipeline), tvm.cpu())
    for seed in (1, 2):  # the second weight set goes through the same executable
        arrays = model_inputs(mod, seed=seed)
        inputs, weights = split_inputs(mod, arrays)
        packed = vm["forward_transform_params"]([tvm.runtime.tensor(w)
                                                 for w in weights.values()])
        got = vm["forward"](*[tvm.runtime.tensor(x) for x in inputs], *packed).numpy()
        np.testing.assert_allclose(got, untuned_output(mod, target, arrays),
                                   rtol=1e-4, atol=1e-4)
    return list(packed)


def assert_kernel_faster(runner, untuned_path: str, tuned_path: str, args_info, target,
                         label: str, attempts: int = 3) -> None:
    """The tuned kernel at ``tuned_path`` runs faster than the untuned function at
    ``untuned_path``, both timed by ``runner``: the fastest repeat of each, timed again (up
    to ``attempts`` runs in all) while the tuned one is not ahead. Waiting only adds time,
    so a repeat that shares the cores with another program (a parallel kernel's barrier then
    waits out a whole time slice: 3 ms repeats of a 32 us kernel) reads slow, never fast."""
    tuned_secs, untuned_secs = [], []
    for _ in range(attempts):
        untuned, tuned = runner.run([untuned_path, tuned_path], args_info, target)
        assert untuned.ok and tuned.ok, (label, untuned.error, tuned.error)
        untuned_secs += untuned.run_secs
        tuned_secs += tuned.run_secs
        if min(tuned_secs) < min(untuned_secs):
            return
    raise AssertionError((label, tuned_secs, untuned_secs))


def assert_function_faster(fast, slow, args, rounds: int = 3, calls: int = 7) -> None:
    """``fast(*args)`` runs faster than ``slow(*args)``: the fastest of ``calls`` calls,
    in ``rounds`` interleaved rounds (see ``assert_kernel_faster`` for why the fastest)."""
    secs = ([], [])
    for _ in range(rounds):
        for func, out in zip((fast, slow), secs):
            for _ in range(calls):
                start = time.perf_counter()
                func(*args)
                out.append(time.perf_counter() - start)
    assert min(secs[0]) < min(secs[1]), (sorted(secs[0]), sorted(secs[1]))
