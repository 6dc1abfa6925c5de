"""Shared fixtures: this machine's target, the demo model lowered, a smaller first pool,
measurement workers kept for the whole run."""

import pytest
import tvm
from tvm import relax

import relax_tune.tuning.tune as tune_module
from relax_tune.demo import demo_model
from relax_tune.measure import LocalBuilder, LocalRunner
from relax_tune.search import EvolutionarySearch
from relax_tune.utils import host_target


def _kept(worker_class):
    """A subclass of ``worker_class`` (LocalBuilder or LocalRunner) with one shared object,
    its workers started once: every tuning session of the test run that makes its own gets
    it; a session's ``shutdown`` leaves the workers running and forgets what the session
    remembered (a runner's outputs of ``time_and_fetch``); ``close`` stops them.
    ``isinstance(x, Kept)`` is ``isinstance(x, worker_class)``: tune.py asks it, under the
    name it made its builder by, of every builder (a given one too) to know whose workers
    the searches may replay in."""

    class _AnyOf(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, worker_class)

    class Kept(worker_class, metaclass=_AnyOf):
        shared = None

        def __new__(cls, *_args, **_options):  # the options of a session's own are dropped
            if cls.shared is None:
                cls.shared = super().__new__(cls)
                worker_class.__init__(cls.shared)
            return cls.shared

        def __init__(self, *_args, **_options):
            pass

        def shutdown(self):
            self._starting = [f for f in self._starting if not f.done()]
            getattr(self, "_memo", {}).clear()

        def close(self):
            worker_class.shutdown(self)

    Kept.__name__ = Kept.__qualname__ = f"Kept{worker_class.__name__}"
    return Kept


_KeptBuilder = _kept(LocalBuilder)
_KeptRunner = _kept(LocalRunner)


@pytest.fixture(scope="session", autouse=True)
def kept_workers():
    """Tuning sessions that make their own builder and runner (``tune_tasks`` without
    ``builder=``/``runner=``) share one LocalBuilder and one LocalRunner for the whole test
    run: each pair starts three worker processes that import TVM (about 3 CPU seconds
    each), and the suite runs a hundred sessions. A test that needs fresh workers (one
    that changes what a worker sees when it starts, or kills workers) passes its own
    builder and runner, as do tuning sessions in subprocesses, or asks for own_workers.
    Session-scoped, so that the module-scoped fixtures that tune get them too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tune_module, "LocalBuilder", _KeptBuilder)
        mp.setattr(tune_module, "LocalRunner", _KeptRunner)
        yield
    for kept in (_KeptBuilder, _KeptRunner):
        if kept.shared is not None:
            kept.shared.close()


@pytest.fixture
def own_workers(monkeypatch):
    """This test's tuning sessions start and stop their own LocalBuilder and LocalRunner,
    as a user's do (tune_tasks' default, which kept_workers replaces elsewhere)."""
    monkeypatch.setattr(tune_module, "LocalBuilder", LocalBuilder)
    monkeypatch.setattr(tune_module, "LocalRunner", LocalRunner)


@pytest.fixture(scope="session")
def shared_builder(kept_workers) -> LocalBuilder:
    """The run's kept LocalBuilder (default options), for a test that builds candidates
    itself and needs no options of its own."""
    return _KeptBuilder()


@pytest.fixture
def shared_runner(kept_workers) -> LocalRunner:
    """The run's kept LocalRunner (default options), for a test that runs candidates
    itself; what it remembers is forgotten after the test."""
    runner = _KeptRunner()
    yield runner
    runner.shutdown()


@pytest.fixture(scope="session")
def rpc_cluster():
    """A real RPC tracker and two servers on 127.0.0.1 under the key "rt-test", started
    once for the tests that measure through RPC (each start imports TVM in three
    processes); a test that kills or stops a server starts its own cluster."""
    from relax_tune.testing.rpc_cluster import LocalRPCCluster

    with LocalRPCCluster(n_servers=2, key="rt-test") as cluster:
        yield cluster


@pytest.fixture(scope="session", autouse=True)
def small_pools():
    """The search's pools at a quarter (each call's: 18 replays) and a sixteenth (the first
    pool ranked by the pre-trained model: 32 replays) of their default sizes: the suite
    tunes hundreds of tasks, a few trials each (one or two batches of 1 to 4), to check
    what tuning does, not how well it searches, and the replays are most of a tuning
    test's time (the full first pool, about 700 replays per task, added 5 minutes to the
    suite). Session-scoped, so that the module-scoped fixtures that tune get them too.
    test_evolutionary checks the pools' sizes themselves."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EvolutionarySearch, "FRESH_PER_CALL", 6)
        mp.setattr(EvolutionarySearch, "GENERATIONS", 1)
        mp.setattr(EvolutionarySearch, "MUTANTS_PER_GENERATION", 12)
        mp.setattr(EvolutionarySearch, "RANKED_POOL", 16)
        mp.setattr(EvolutionarySearch, "RANKED_GENERATIONS", 2)
        mp.setattr(EvolutionarySearch, "RANKED_MUTANTS", 8)
        yield


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
