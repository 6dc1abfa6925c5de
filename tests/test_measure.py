"""Tests of relax_tune.measure: LocalBuilder and LocalRunner with real TVM, real worker
processes and real faults (a kernel that segfaults, a kernel that never ends, a compile that
runs past its time limit). No timing is asserted beyond "positive"."""

from __future__ import annotations

import ctypes
import json
import os

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.script import tirx as T

from relax_tune import utils
from relax_tune.measure import (
    ERROR_CRASHED,
    ERROR_TIMEOUT,
    BuildResult,
    LocalBuilder,
    LocalRunner,
    MeasureError,
    RunResult,
)
from relax_tune.measure import _worker

from relax_tune.testing.workloads import matmul_mod, tiled_matmul_trace

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
REPEAT = 3


def bad_trace(mod: tvm.IRModule) -> list:
    """A trace whose first instruction names a block the workload does not have."""
    trace = tiled_matmul_trace(mod)
    assert trace[0][0][0] == "GetSBlock" and trace[0][0][2][0] == "C"
    trace[0][0][2][0] = "no_such_block"
    return trace


def heavy_trace(n: int) -> list:
    """Unrolls two loops of an n^3 matmul fully: for n=128 the compile takes ~17 s."""
    sch = Schedule(matmul_mod(n))
    _, j, k = sch.get_loops(sch.get_sblock("C"))
    sch.unroll(j)
    sch.unroll(k)
    return utils.trace_to_json(sch.trace)


@T.prim_func(s_tir=True)
def hanging_kernel(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, j in T.grid(1000000, 1000000):  # 1e12 dependent float updates: never ends
        with T.sblock("acc"):
            vi, vj = T.axis.remap("RR", [i, j])
            A[0] = A[0] * T.float32(1.0000001) + A[1]


@T.prim_func(s_tir=True)
def segfaulting_kernel(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    B = T.decl_buffer((1,), "float32", data=A.data)  # aliases A, no bounds checks
    for i in range(1000):
        with T.sblock("w"):
            vi = T.axis.spatial(1000, i)
            B[T.int64(vi) * T.int64(68719476736)] = T.float32(1.0)  # 256 GiB strides


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(max_workers=2, timeout_sec=5.0) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(timeout_sec=3.0, number=2, repeat=REPEAT) as r:
        yield r


@pytest.fixture(scope="module")
def mod():
    return matmul_mod(64)


@pytest.fixture(scope="module")
def built(builder, mod):
    """Untuned + scheduled + failing + scheduled candidates in one batch."""
    return builder.build(mod, TARGET, [None, tiled_matmul_trace(mod), bad_trace(mod),
                                       tiled_matmul_trace(mod)])


def _pids(builder: LocalBuilder) -> set[int]:
    return {builder.pool.submit(os.getpid).result() for _ in range(6)}


def test_build_untuned_and_scheduled(built):
    assert len(built) == 4
    for i in (0, 1, 3):
        res = built[i]
        assert isinstance(res, BuildResult) and res.ok, res
        assert res.error is None and os.path.isfile(res.artifact_path)
        assert res.artifact_path.endswith(".so") and res.build_secs > 0
    assert len({built[i].artifact_path for i in (0, 1, 3)}) == 3  # unique names


def test_bad_trace_fails_alone(built):
    res = built[2]
    assert not res.ok and res.artifact_path is None
    assert "trace does not replay" in res.error and "block" in res.error, res.error


def test_trace_forms_and_primfunc_workload(builder, mod):
    sch = Schedule(mod)
    sch.parallel(sch.get_loops(sch.get_sblock("C"))[0])
    forms = [sch.trace, json.dumps(tiled_matmul_trace(mod)), sch.trace.as_json(remove_postproc=False)]
    results = builder.build(mod["main"], TARGET, forms)  # a bare PrimFunc is normalised
    assert all(r.ok for r in results), results
    odd = builder.build(mod, TARGET, [[[["Parallel", [object()], [], []]], []], None])
    assert not odd[0].ok and odd[0].error.startswith("bad trace") and odd[1].ok


def test_built_kernels_compute_matmul(built):
    rng = np.random.default_rng(0)
    a = rng.random((64, 64), dtype=np.float32)
    b = rng.random((64, 64), dtype=np.float32)
    dev = tvm.cpu()
    for i in (0, 1):
        lib = tvm.runtime.load_module(built[i].artifact_path)
        c = tvm.runtime.empty((64, 64), "float32", dev)
        lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_run_times_every_candidate(runner, built, mod):
    results = runner.run([r.artifact_path for r in built], utils.args_info(mod), TARGET)
    assert len(results) == 4
    for i in (0, 1, 3):
        assert isinstance(results[i], RunResult) and results[i].ok, results[i]
        assert len(results[i].run_secs) == REPEAT
        assert all(isinstance(x, float) and x > 0 for x in results[i].run_secs)
        assert 0 < results[i].mean_secs < utils.FAILED_RUN_SECS
    assert not results[2].ok and results[2].run_secs is None and results[2].error
    assert results[2].secs_for_record() == [utils.FAILED_RUN_SECS]


def test_max_secs_cuts_slow_candidates_short(runner, built, mod):
    res = runner.run([built[0].artifact_path], utils.args_info(mod), TARGET, max_secs=1e-9)[0]
    assert res.ok and len(res.run_secs) == 1 and res.run_secs[0] > 0


def test_run_and_fetch_matches_numpy_and_untuned(runner, built, mod):
    info = utils.args_info(mod)
    untuned = runner.run_and_fetch(built[0].artifact_path, info, TARGET, seed=7)
    tuned = runner.run_and_fetch(built[1].artifact_path, info, TARGET, seed=7)
    a, b, c = tuned
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert len(untuned) == 3
    for x, y in zip(untuned, tuned):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)
    with pytest.raises(MeasureError):
        runner.run_and_fetch("/no/such/artifact.so", info, TARGET)


def test_workers_persist_and_cache_workloads(builder, mod):
    before = _pids(builder)
    assert 1 <= len(before) <= 2
    other = matmul_mod(32)
    assert all(r.ok for r in builder.build(other, TARGET, [None, tiled_matmul_trace(other)]))
    assert all(r.ok for r in builder.build(mod, TARGET, [None]))
    assert _pids(builder) <= before  # same processes: no fresh `import tvm`
    infos = [builder.pool.submit(_worker.cache_info).result() for _ in range(4)]
    assert any(len(i["workloads"]) >= 1 for i in infos)


def test_builder_survives_worker_crash(builder, mod):
    with pytest.raises(ChildProcessError):
        builder.pool.submit(ctypes.string_at, 0).result()  # a real segfault in a worker
    results = builder.build(mod, TARGET, [None, tiled_matmul_trace(mod)])
    assert all(r.ok for r in results), results


def test_builder_timeout_then_next_batch(builder, mod):
    results = builder.build(matmul_mod(128), TARGET, [heavy_trace(128), None])
    assert results[0].error == ERROR_TIMEOUT and results[0].artifact_path is None
    assert results[0].build_secs == builder.timeout_sec
    assert results[1].ok, results[1]
    again = builder.build(mod, TARGET, [tiled_matmul_trace(mod)])
    assert again[0].ok, again


def test_runner_missing_artifact_then_next(runner, built, mod):
    results = runner.run(["/no/such/artifact.so", None, built[1].artifact_path],
                         utils.args_info(mod), TARGET)
    assert not results[0].ok and "load" in results[0].error
    assert not results[1].ok
    assert results[2].ok and len(results[2].run_secs) == REPEAT


def test_runner_survives_segfaulting_kernel(builder, runner, built, mod):
    fault = utils.normalize_mod(segfaulting_kernel)
    art = builder.build(fault, TARGET, [None])[0]
    assert art.ok, art
    res = runner.run([art.artifact_path], utils.args_info(fault), TARGET)[0]
    assert res.error == ERROR_CRASHED and res.run_secs is None
    nxt = runner.run([built[1].artifact_path], utils.args_info(mod), TARGET)[0]
    assert nxt.ok and len(nxt.run_secs) == REPEAT


def test_runner_times_out_hanging_kernel(builder, runner, built, mod):
    hang = utils.normalize_mod(hanging_kernel)
    art = builder.build(hang, TARGET, [None])[0]
    assert art.ok, art
    info_hang, info_mm = utils.args_info(hang), utils.args_info(mod)
    res = runner.run([art.artifact_path], info_hang, TARGET)[0]
    assert res.error == ERROR_TIMEOUT and res.run_secs is None
    nxt = runner.run([built[1].artifact_path], info_mm, TARGET)[0]
    assert nxt.ok and len(nxt.run_secs) == REPEAT


def test_shutdown_removes_owned_artifacts(mod):
    b = LocalBuilder(max_workers=1)
    res = b.build(mod, TARGET, [None])[0]
    assert res.ok and os.path.isfile(res.artifact_path)
    b.shutdown()
    b.shutdown()  # idempotent
    assert not os.path.exists(b.artifact_dir)


def test_given_artifact_dir_is_kept(tmp_path, mod):
    out = tmp_path / "artifacts"
    with LocalBuilder(max_workers=1, artifact_dir=str(out)) as b:
        res = b.build(mod, TARGET, [None])[0]
        kept = res.artifact_path
        b.discard([kept])
        assert not os.path.exists(kept)
        res = b.build(mod, TARGET, [None])[0]
    assert os.path.isfile(res.artifact_path) and res.artifact_path.startswith(str(out))


def test_measure_never_imports_metaschedule():
    root = os.path.dirname(_worker.__file__)
    for name in os.listdir(root):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8") as fh:
                assert "meta_schedule" not in fh.read(), name


def _counting_library(tmp_path) -> str:
    """A library whose ``main`` adds 1 to ``C[0]`` (its second argument) per call."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((4,), "float32"), C: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        C[0] = C[0] + T.float32(1.0)

    path = str(tmp_path / "count.so")
    tvm.compile(tvm.IRModule({"main": main}), "llvm").export_library(path)
    return path


def _counted_run(tmp_path, seed: int, **options) -> tuple[list, int]:
    """``run_candidate`` on the incrementing kernel: its times and how often it was
    called (warm-up, the time evaluator's own untimed first call, the timed ones)."""
    from relax_tune.measure import _worker

    info = json.dumps([["TENSOR", "float32", [4]], ["TENSOR", "float32", [4]]])
    artifact = _counting_library(tmp_path)
    before = float(_worker._cached_inputs(info, tvm.cpu(), seed)[1].numpy()[0])
    secs, err = _worker.run_candidate(artifact, info, 1, 0, max_secs=None, budget_secs=60.0,
                                      seed=seed, **options)
    assert err is None
    after = float(_worker._cached_inputs(info, tvm.cpu(), seed)[1].numpy()[0])
    return secs, round(after - before)


# calls: run_candidate's warm-up (one: no warm-up time), then per repeat (an interleaved
# round, one time evaluator call each) the evaluator's own untimed first call and the timed ones
@pytest.mark.parametrize("flush,calls", [(False, 1 + 3 * (1 + 5)), (True, 1 + 3 * (1 + 1))])
def test_cache_flush_times_one_cold_call_per_repeat(tmp_path, flush, calls, monkeypatch):
    """With ``cache_flush`` every timed call follows a flush: each of the ``repeat``
    measurements is one call (the runtime flushes once per repeat, so ``number`` calls
    would leave all but the first warm). Counted by a kernel that increments its argument."""
    from relax_tune.measure import _worker

    monkeypatch.setattr(_worker, "_WARM_UP_SECS", 0.0)
    secs, counted = _counted_run(tmp_path, 11, number=5, repeat=3, min_repeat_ms=0,
                                 cache_flush=flush)
    assert len(secs) == 3 and counted == calls


def test_candidates_are_timed_in_interleaved_rounds(tmp_path, monkeypatch):
    """The batch's measurements alternate between its candidates, round by round, so a
    spell of load on the machine falls on all of them alike. Two kernels on one shared
    argument, one adding 1 and one doubling: the final value tells the order of calls."""
    from tvm.script import tirx as T

    from relax_tune.measure import _worker

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((4,), "float32"), C: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        C[0] = C[0] * T.float32(2.0)

    doubling = str(tmp_path / "double.so")
    tvm.compile(tvm.IRModule({"main": main}), "llvm").export_library(doubling)
    adding = _counting_library(tmp_path)
    monkeypatch.setattr(_worker, "_WARM_UP_SECS", 0.0)
    info = json.dumps([["TENSOR", "float32", [4]], ["TENSOR", "float32", [4]]])
    x = float(_worker._cached_inputs(info, tvm.cpu(), 13)[1].numpy()[0])
    for artifact in (adding, doubling):  # one warm-up call each
        secs, err, ready = _worker.prepare_candidate(
            artifact, info, 1, 0, number=1, repeat=3, min_repeat_ms=0, cache_flush=False,
            max_secs=None, budget_secs=60.0, seed=13)
        assert secs is None and err is None and ready is not None
    times = _worker.time_prepared([adding, doubling], 3)
    assert [len(t) for t in times] == [3, 3]
    after = float(_worker._cached_inputs(info, tvm.cpu(), 13)[1].numpy()[0])
    # each round: the adder twice (the evaluator's untimed call, the timed one), then the
    # doubler twice; one after another it would be 32 * x + 160
    assert after == pytest.approx(128 * x + 296, abs=1e-2)


def test_short_kernels_are_warmed_up_before_timing(tmp_path):
    """A short kernel is called for ``_WARM_UP_SECS`` before it is timed (the cores idled
    while the batch built): each call takes a microsecond or less, thousands fill it."""
    _, counted = _counted_run(tmp_path, 12, number=1, repeat=1, min_repeat_ms=0,
                              cache_flush=False)
    assert counted > 100


def test_random_inputs_keep_a_constant_index_in_bounds():
    """A 0-d integer argument (``take(qkv, 0)`` of a packed projection) is 0, so the function
    reads inside its 3-long axis; other integers stay in [0, 4)."""
    from tvm import te, topi

    qkv = te.placeholder((3, 8, 4), "float32", name="qkv")
    index = te.placeholder((), "int64", name="index")
    func = te.create_prim_func([qkv, index, topi.take(qkv, index, axis=0)])
    info = utils.args_info(tvm.IRModule({"main": func}))
    args = _worker.random_inputs(info, tvm.cpu(), seed=3)
    assert info[1][1] == "int64" and int(args[1].numpy()) == 0
    values = np.concatenate([_worker.random_inputs([["TENSOR", "int32", [64]]], tvm.cpu(),
                                                   seed=s)[0].numpy() for s in range(4)])
    assert set(values.tolist()) == {0, 1, 2, 3}


def test_workers_start_without_pytorch(builder, runner):
    """The build and run workers never load PyTorch (TVM's FFI imports it when installed:
    seconds and hundreds of MB per worker), and an import of it there says why it fails;
    this process keeps its own environment."""
    pytest.importorskip("torch")  # without PyTorch installed there is nothing to keep out
    before = os.environ.get("PYTHONPATH")
    import importlib

    for pool in (builder.pool, runner.pool):
        with pytest.raises(ImportError, match="workers run without PyTorch"):
            pool.submit(importlib.import_module, "torch").result(timeout=120)
    assert os.environ.get("PYTHONPATH") == before
    import torch  # noqa: F401 - here it still imports


def test_tvm_threads_every_core_and_unpinned_unless_the_user_says(monkeypatch):
    """The workers' (and a user's) TVM pool: every usable core, or the threads asked for,
    and threads left free to move off a core another process needs; what the user set
    stays."""
    from relax_tune.utils import ensure_tvm_threads

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("TVM_BIND_THREADS", raising=False)
    assert ensure_tvm_threads() == len(os.sched_getaffinity(0))
    assert os.environ["TVM_BIND_THREADS"] == "0"
    assert ensure_tvm_threads(3) == 3 and os.environ["TVM_NUM_THREADS"] == "3"
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    monkeypatch.setenv("TVM_BIND_THREADS", "1")
    assert ensure_tvm_threads() == 1 and os.environ["TVM_BIND_THREADS"] == "1"
