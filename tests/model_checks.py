"""Checks shared by the whole-model tests: outputs against TVM's untuned build."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from relax_tune.testing.models import model_inputs, split_inputs


def untuned_output(mod: tvm.IRModule, target, arrays) -> np.ndarray:
    """The model compiled by TVM's default pipeline, every weight an input, on ``arrays``."""
    vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    return vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


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
