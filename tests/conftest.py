"""Shared fixtures: this machine's target, the demo model lowered, a smaller first pool."""

import pytest
import tvm
from tvm import relax

from relax_tune.demo import demo_model
from relax_tune.search import EvolutionarySearch
from relax_tune.utils import host_target


@pytest.fixture(autouse=True)
def small_pools(monkeypatch):
    """The search's pools at a half (each call's) and an eighth (the first pool ranked by
    the pre-trained model) of their default sizes: the suite tunes hundreds of tasks, a few
    trials each, to check what tuning does, not how well it searches; the full first pool
    (about 700 replays per task) added 5 minutes to it. test_evolutionary checks the pools'
    sizes themselves."""
    monkeypatch.setattr(EvolutionarySearch, "FRESH_PER_CALL", 12)
    monkeypatch.setattr(EvolutionarySearch, "GENERATIONS", 1)
    monkeypatch.setattr(EvolutionarySearch, "MUTANTS_PER_GENERATION", 24)
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
