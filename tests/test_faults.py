"""Fault injection, end to end through ``tune_tasks`` with real builds and real runs on this CPU:
a candidate that fails to compile, one that segfaults, one that hangs, one that computes the
wrong thing; a tuner SIGKILLed while it writes; two tuners sharing one work_dir at once.

Faults are injected by ``FaultBuilder``: a real ``LocalBuilder`` that, for chosen candidates,
builds a real faulty kernel (same signature as the task) instead of the searched schedule.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tvm.script import tirx as T

from relax_tune import utils
from relax_tune.database import JSONDatabase, TuningRecord
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import LocalBuilder, LocalRunner
from relax_tune.measure.verify import WRONG_RESULT, CorrectnessChecker, compare_outputs
from relax_tune.database import candidate_key
from relax_tune.tuning.state import BASELINE_KEY
from relax_tune.tuning.tune import tune_tasks

from relax_tune.testing.workloads import matmul_mod

N = 32


@T.prim_func(s_tir=True)
def wrong_kernel(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"),
                 C: T.Buffer((N, N), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, j in T.grid(N, N):  # fast and wrong: no reduction at all
        with T.sblock("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj]


@T.prim_func(s_tir=True)
def segfault_kernel(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"),
                    C: T.Buffer((N, N), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    D = T.decl_buffer((1,), "float32", data=C.data)  # aliases C, no bounds checks
    for i in range(1000):
        with T.sblock("w"):
            vi = T.axis.spatial(1000, i)
            D[T.int64(vi) * T.int64(68719476736)] = T.float32(1.0)  # 256 GiB strides


@T.prim_func(s_tir=True)
def hang_kernel(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"),
                C: T.Buffer((N, N), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, j in T.grid(1000000, 1000000):  # 1e12 dependent updates: never ends
        with T.sblock("acc"):
            vi, vj = T.axis.remap("RR", [i, j])
            C[0, 0] = C[0, 0] * T.float32(1.0000001) + A[0, 1]


FAULTS = {"wrong": wrong_kernel, "segfault": segfault_kernel, "hang": hang_kernel}


class FaultBuilder(LocalBuilder):
    """Builds tuned candidate number k (counting from 0 over all batches) as ``faults[k]``:
    ``"compile"`` (a trace naming a block that does not exist) or a kernel of ``FAULTS``.
    Its builds run in the workers of ``workers`` (the test run's kept LocalBuilder: none of
    these faults harms a build worker), so that no worker process starts for it."""

    def __init__(self, faults: dict[int, str], workers: LocalBuilder, **kwargs) -> None:
        super().__init__(**kwargs)
        self.workers = workers
        self.faults = dict(faults)
        self.count = 0
        self.injected: dict[str, str] = {}  # fault -> candidate key

    @property
    def pool(self):
        return self.workers.pool

    def build(self, workload, target, traces):
        results = []
        for trace in traces:
            if trace is None:  # the untuned function: never faulty
                results += super().build(workload, target, [None])
                continue
            fault = self.faults.get(self.count)
            self.count += 1
            if fault is None:
                results += super().build(workload, target, [trace])
                continue
            self.injected[fault] = candidate_key(trace)
            if fault == "compile":
                broken = json.loads(json.dumps(trace))
                broken[0][0][2][0] = "no_such_block"
                results += super().build(workload, target, [broken])
            else:
                results += super().build(utils.normalize_mod(FAULTS[fault]), target, [None])
        return results


def _records_by_key(db: JSONDatabase) -> dict[str, list]:
    out: dict[str, list] = {}
    for rec in db.get_all_tuning_records():
        out.setdefault(candidate_key(rec.trace_json), []).append(rec)
    return out


def test_compare_outputs():
    a = np.arange(6, dtype="float32").reshape(2, 3)
    assert compare_outputs([a], [a.copy()]) is None
    assert compare_outputs([a + 1e-6], [a]) is None
    assert "max abs difference" in compare_outputs([a + 1], [a])
    assert "shape" in compare_outputs([a.T], [a])
    assert "differ" in compare_outputs([np.array([1, 2])], [np.array([1, 3])])


def test_compare_outputs_lets_quantized_outputs_flip_by_one_step_in_a_few_elements():
    want = np.random.default_rng(0).integers(0, 250, 4000).astype("uint8")
    flipped = want.copy()
    flipped[:20] += 1  # 0.5% of the elements, one step: a float epilogue's rounding flips
    assert compare_outputs([flipped], [want]) is None
    two_steps = want.copy()
    two_steps[0] += 2
    assert compare_outputs([two_steps], [want]) == "argument 0: 1 elements differ, by up to 2"
    many = want.copy()
    many[:80] += 1  # 2%: more than rounding flips
    assert compare_outputs([many], [want]) == "argument 0: 80 elements differ, by up to 1"
    mask = np.zeros(4000, dtype=bool)
    assert "differ" in compare_outputs([~mask], [mask])  # booleans stay exact


def test_faulty_candidates_are_recorded_and_tuning_continues(tmp_path, target, caplog,
                                                             shared_builder):
    mod = matmul_mod(N)
    tasks = extract_tasks(mod, target)
    faults = {0: "compile", 1: "segfault", 2: "hang", 3: "wrong"}
    work = str(tmp_path / "work")
    with FaultBuilder(faults, shared_builder) as builder, \
            LocalRunner(timeout_sec=2.0) as runner:
        start = time.perf_counter()
        reports = tune_tasks(tasks, work, max_trials_global=8, num_trials_per_iter=4,
                             builder=builder, runner=runner, measure_baseline=True)
        wall = time.perf_counter() - start
    assert set(builder.injected) == {"compile", "segfault", "hang", "wrong"}
    report = reports[0]
    assert report.trials == 8 and report.failures >= 4
    assert report.best_secs is not None  # the healthy candidates were timed
    db = JSONDatabase(work_dir=work)
    by_key = _records_by_key(db)
    assert len(db) == 9  # 8 trials + the baseline: every candidate accounted for
    trials = [r for r in db.get_all_tuning_records() if candidate_key(r.trace_json) != BASELINE_KEY]
    assert report.failures == sum(not r.is_valid for r in trials)
    assert report.best_secs == pytest.approx(min(r.mean_run_secs for r in trials if r.is_valid))
    for fault, key in builder.injected.items():
        (rec,) = by_key[key]
        assert not rec.is_valid, fault  # recorded, as failed
    assert BASELINE_KEY in by_key
    # the wrong kernel is by far the fastest; the check caught it, so it is never applied
    best = db.query_tuning_record(mod, target)
    assert best.is_valid and candidate_key(best.trace_json) != builder.injected["wrong"]
    assert best.mean_run_secs == pytest.approx(report.applied_secs)
    assert any(WRONG_RESULT in r.getMessage() for r in caplog.records)
    assert wall < 120


def test_check_correctness_off_lets_wrong_best_through(tmp_path, target, shared_builder):
    """The check is what stops the wrong kernel (so the test above cannot pass by accident)."""
    mod = matmul_mod(N)
    tasks = extract_tasks(mod, target)
    work = str(tmp_path / "work")
    with FaultBuilder({0: "wrong"}, shared_builder) as builder:
        tune_tasks(tasks, work, max_trials_global=3, num_trials_per_iter=3, builder=builder,
                   check_correctness=False)
    db = JSONDatabase(work_dir=work)
    rec = _records_by_key(db)[builder.injected["wrong"]][0]
    assert rec.is_valid
    # and, far the fastest, it is what ApplyDatabase would take
    best = db.query_tuning_record(mod, target)
    assert candidate_key(best.trace_json) == builder.injected["wrong"]


def test_checker_passes_good_schedules(target, shared_builder, shared_runner):
    mod = matmul_mod(N)
    from relax_tune.search import make_search

    cands = make_search("replay", mod, target, seed=3).next_candidates(4)
    checker = CorrectnessChecker(shared_builder, shared_runner)
    builds = shared_builder.build(mod, target, [c.trace_json for c in cands])
    info = utils.args_info(mod)
    for b in builds:
        assert b.ok
        assert checker.check("mm", mod, target, info, b.artifact_path) is None
    assert checker.checked == 4 and checker.wrong == 0


# ----------------------------------------------------------------------------- processes

_TUNER = textwrap.dedent("""
    import json, sys
    import tvm
    from tvm import te
    from relax_tune import utils
    from relax_tune.database import JSONDatabase
    from relax_tune.tuning.extract import extract_tasks
    from relax_tune.measure import LocalBuilder, LocalRunner
    from relax_tune.database import candidate_key
    from relax_tune.tuning.tune import tune_tasks
    from relax_tune.search import EvolutionarySearch as ES

    # the pools of tests/conftest.py's small_pools, in this process too
    ES.FRESH_PER_CALL, ES.GENERATIONS, ES.MUTANTS_PER_GENERATION = 6, 1, 12
    ES.RANKED_POOL, ES.RANKED_GENERATIONS, ES.RANKED_MUTANTS = 16, 2, 8
    work, n, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    A = te.placeholder((n, n), "float32", name="A"); B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    mod = utils.normalize_mod(te.create_prim_func([A, B, C]))
    tasks = extract_tasks(mod, utils.host_target())
    db = JSONDatabase(work_dir=work)
    committed = []
    commit = db.commit_tuning_record
    def logged(rec):
        commit(rec)
        committed.append([candidate_key(rec.trace_json), rec.run_secs])
        print("COMMITTED", flush=True)
    db.commit_tuning_record = logged
    with LocalBuilder(max_workers=1) as b, LocalRunner() as r:
        tune_tasks(tasks, max_trials_global=trials, num_trials_per_iter=4, database=db,
                   builder=b, runner=r, seed=seed)
    print("RESULT " + json.dumps(committed), flush=True)
""")


def _tuner(work: str, n: int, trials: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _TUNER, work, str(n), str(trials), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_tuner_sigkilled_mid_write_then_load_and_resume(tmp_path, target, caplog):
    work = str(tmp_path / "work")
    proc = _tuner(work, N, 64, 1)
    try:
        seen = 0
        deadline = time.monotonic() + 120
        while seen < 5 and time.monotonic() < deadline:  # wait for a few commits
            line = proc.stdout.readline()
            if not line:
                break
            seen += line.startswith("COMMITTED")
        assert seen >= 5, "the tuner committed nothing"
    finally:
        _kill(proc)  # SIGKILL to the whole process group, workers included
    path = os.path.join(work, "database_tuning_record.json")
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    complete = len(lines)
    # a write torn by the kill: the last record line cut in the middle, without its newline
    with open(path, "ab") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])
    db = JSONDatabase(work_dir=work)
    assert len(db) == complete  # every complete line loads; the torn one is skipped
    assert any("skipped a bad tuning record" in r.getMessage() for r in caplog.records)
    before = {candidate_key(r.trace_json) for r in db.get_all_tuning_records()}
    tasks = extract_tasks(matmul_mod(N), target)
    reports = tune_tasks(tasks, work, max_trials_global=complete + 3, num_trials_per_iter=4)
    assert reports[0].new_trials == 4  # resumed: trials on disk counted (baseline aside)
    db2 = JSONDatabase(work_dir=work)
    keys = [candidate_key(r.trace_json) for r in db2.get_all_tuning_records()]
    assert before <= set(keys) and len(keys) == len(set(keys))  # nothing lost, none repeated
    assert len(db2) == complete + 4


def test_two_tuners_share_one_work_dir(tmp_path):
    work = str(tmp_path / "work")
    procs = [_tuner(work, N, 8, 1), _tuner(work, N, 8, 2)]
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            outs.append(out)
    finally:
        for proc in procs:
            _kill(proc)
    committed = []
    for out in outs:
        result = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert result, "a tuner did not finish"
        committed += json.loads(result[0][len("RESULT "):])
    assert len(committed) >= 2 * 8
    with open(os.path.join(work, "database_tuning_record.json"), "rb") as f:
        lines = f.read().splitlines()
    assert len(lines) == len(committed)
    for line in lines:  # none corrupt
        value = json.loads(line)
        assert isinstance(value, list) and value[0] == 0
    db = JSONDatabase(work_dir=work)
    assert len(db) == len(committed)
    stored = sorted((candidate_key(r.trace_json), r.run_secs) for r in db.get_all_tuning_records())
    assert stored == sorted((k, secs) for k, secs in committed)
    with open(os.path.join(work, "database_workload.json"), "rb") as f:
        assert len(f.read().splitlines()) == 1  # one workload, committed once


def test_record_line_fast_parse_matches_json(tmp_path):
    """The loader's fast path gives exactly what json.loads gives, shared instructions or not."""
    from relax_tune.database.json_database import parse_record_line
    from relax_tune.search import make_search

    mod = matmul_mod(N)
    target = utils.host_target()
    db = JSONDatabase(work_dir=str(tmp_path))
    wl = db.commit_workload(mod)
    cands = make_search("replay", mod, target, seed=5).next_candidates(6)
    for i, cand in enumerate(cands * 2):
        db.commit_tuning_record(TuningRecord(cand.trace_json, wl, [1e-3 * (i + 1)], target,
                                             utils.args_info(mod)))
    with open(os.path.join(str(tmp_path), "database_tuning_record.json")) as f:
        lines = f.read().splitlines()
    odd = ['[0, [[[], []], null, null, null]]', '[0,[[[1],[]],[1.0],null,null]', '[x]', '',
           '[0,[[[],[]],[1],{"a":1},[]]] ']
    known: dict = {}
    for line in lines + odd:
        try:
            want = json.loads(line)
        except ValueError:
            with pytest.raises(ValueError):
                parse_record_line(line, known)
            continue
        assert parse_record_line(line, known) == want
    again = JSONDatabase(work_dir=str(tmp_path))
    assert [r.as_json() for r in again.get_all_tuning_records()] == \
        [r.as_json() for r in db.get_all_tuning_records()]


def test_pool_shutdown_survives_a_worker_killed_while_starting():
    """TVM's PopenWorker.kill raises on a worker whose process is up but whose pipes are
    not yet open (a race between ``start`` and ``shutdown``) and leaves the pool's lock held;
    the pool's ``__del__`` then blocked forever (a CI run hung 900 s). The half-started
    worker is made here by removing its pipe attribute."""
    import threading

    from tvm.support.popen_pool import PopenPoolExecutor

    from relax_tune.measure.base import shutdown_pool

    pool = PopenPoolExecutor(max_workers=1, timeout=30)
    assert pool.submit(os.getpid).result(timeout=60) > 0
    (worker,) = pool._worker_map.values()
    proc = worker._proc
    del worker._writer
    shutdown_pool(pool, [])  # logs, does not raise
    done = threading.Event()
    threading.Thread(target=lambda: (pool.__del__(), done.set()), daemon=True).start()
    assert done.wait(10), "the pool's __del__ blocked on its lock"
    proc.kill()
    proc.wait(timeout=10)
    worker._proc = None  # else the worker's own __del__ trips on the missing pipe


def test_pool_shutdown_does_not_wait_for_the_jobs_in_flight(tmp_path):
    """TVM's PopenWorker.kill closes the pipe a thread is blocked reading before it kills
    the process, so a shutdown waited for the jobs in flight to finish (4.5 s of 5 s jobs):
    a session's time limit was lengthened by the builds and choices it left running."""
    builder = LocalBuilder(max_workers=2, artifact_dir=str(tmp_path / "a"))
    pool = builder.pool
    assert {pool.submit(os.getpid).result(timeout=60) for _ in range(4)}
    jobs = [pool.submit(time.sleep, 30) for _ in range(3)]
    time.sleep(0.5)  # two in the workers, one queued
    start = time.monotonic()
    builder.shutdown()
    assert time.monotonic() - start < 10
    assert all(job.done() for job in jobs)


def test_builder_started_and_stopped_at_once_leaves_no_worker(tmp_path):
    """A tuning call with nothing to measure starts its workers and stops them right away."""
    builder = LocalBuilder(max_workers=1, artifact_dir=str(tmp_path / "a"))
    builder.start()
    pool = builder.pool
    builder.shutdown()
    assert pool._shutdown
    assert all(w._proc is None for w in pool._worker_map.values())
