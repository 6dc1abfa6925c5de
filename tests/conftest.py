"""Shared fixtures: this machine's target, the demo model lowered, a smaller first pool."""

import pytest
import tvm
from tvm import relax

from relax_tune.demo import demo_model
from relax_tune.search import EvolutionarySearch
from relax_tune.utils import host_target


@pytest.fixture(autouse=True)
def small_ranked_pool(monkeypatch):
    """The search's first pool ranked by the pre-trained model, at an eighth of its default
    size (about the usual pool's): the suite tunes hundreds of tasks, a few trials each, and
    the full pool (about 700 replays per task) added 5 minutes to it. test_evolutionary
    checks the larger pool itself."""
    monkeypatch.setattr(EvolutionarySearch, "RANKED_POOL", 32)
    monkeypatch.setattr(EvolutionarySearch, "RANKED_GENERATIONS", 2)
    monkeypatch.setattr(EvolutionarySearch, "RANKED_MUTANTS", 16)


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
