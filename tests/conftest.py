"""Shared fixtures: this machine's target and the demo model, lowered."""

import pytest
import tvm
from tvm import relax

from relax_tune.demo import demo_model
from relax_tune.utils import host_target


@pytest.fixture(scope="session")
def target() -> tvm.target.Target:
    """The host CPU as an llvm target (never an ISA this machine cannot run)."""
    return host_target()


@pytest.fixture(scope="session")
def demo(target):
    """``(lowered_mod, params)`` of the demo MLP after ``relax.get_pipeline("zero")``."""
    mod, params = demo_model()
    with target:
        lowered = relax.get_pipeline("zero")(mod)
    return lowered, params
