"""Task scheduling, budgets, time limits, resumption and progress of tune_tasks."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

import relax_tune as rt
from relax_tune.tuning.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress
from relax_tune.database import candidate_key

SMALL = {"num_trials_per_iter": 2, "min_task_share": 0.0}


@pytest.fixture(scope="module")
def two_task_model(target):
    """A model with a 64x64x64 matmul called four times and a 16x16x16 matmul called once."""

    class TwoTasks(nn.Module):
        def __init__(self):
            self.w = nn.Parameter((64, 64), "float32")
            self.v = nn.Parameter((16, 16), "float32")

        def forward(self, x, z):
            for _ in range(4):
                x = nn.op.matmul(x, self.w)
            return x, nn.op.matmul(z, self.v)

    mod, _ = TwoTasks().export_tvm({"forward": {
        "x": nn.spec.Tensor((64, 64), "float32"), "z": nn.spec.Tensor((16, 16), "float32")}})
    with target:
        lowered = relax.get_pipeline("zero")(mod)
    tasks = rt.extract_tasks(lowered, target)
    assert sorted(t.weight for t in tasks) == [1, 4]
    return tasks


def test_gradient_scheduler_prefers_the_heavy_task_pure():
    heavy = TaskProgress(weight=4, importance=0.9, best_per_round=[1e-3], rounds=1)
    light = TaskProgress(weight=1, importance=0.1, best_per_round=[1e-5], rounds=1)
    assert GradientScheduler().next_task([light, heavy]) == 1
    # first round first, most important first, before anyone gets a second batch
    fresh = TaskProgress(weight=1, importance=0.5)
    assert GradientScheduler().next_task([heavy, fresh]) == 1
    assert RoundRobinScheduler().next_task([heavy, light, fresh]) == 2


def test_gradient_gives_more_trials_to_the_heavier_task_than_round_robin(two_task_model,
                                                                         tmp_path):
    """After both first batches, two batches left: the gradient gives both to the heavy
    task (its gain per batch is several times the light one's), round-robin one each."""
    trials = {}
    for name in ("gradient", "round-robin"):
        reports = rt.tune_tasks(two_task_model, str(tmp_path / name), max_trials_global=8,
                                task_scheduler=name, convergence_window=0, **SMALL)
        heavy = next(r for r in reports if r.weight == 4)
        assert sum(r.trials for r in reports) == 8
        trials[name] = heavy.trials
    assert trials["gradient"] > trials["round-robin"], trials


def test_resume_skips_task_at_budget_and_measures_nothing_twice(two_task_model, tmp_path):
    wd = str(tmp_path)
    first = rt.tune_tasks(two_task_model, wd, max_trials_global=8, max_trials_per_task=3,
                          **SMALL)
    assert [r.trials for r in first] == [3, 3]
    again = rt.tune_tasks(two_task_model, wd, max_trials_global=8, max_trials_per_task=3,
                          **SMALL)
    assert [r.new_trials for r in again] == [0, 0]
    assert all(r.status == "budget" for r in again)
    more = rt.tune_tasks(two_task_model, wd, max_trials_global=10, max_trials_per_task=5,
                         **SMALL)
    assert sum(r.new_trials for r in more) == 4
    db = rt.JSONDatabase(work_dir=wd)
    keys = [(r.workload.shash, candidate_key(r.trace_json)) for r in db.get_all_tuning_records()]
    assert len(keys) == len(set(keys)) == 2 * 5 + 2  # trials + one baseline per task


def test_max_time_stops_tuning(two_task_model, tmp_path, caplog, own_workers):
    """The time limit stops tuning, and a task it left without any measured candidate is
    named in a warning (it stays untuned). (The session's own workers, started and stopped
    at once: the default LocalBuilder and LocalRunner of tune_tasks, as a user gets them.)"""
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="relax_tune"):
        reports = rt.tune_tasks(two_task_model, str(tmp_path), max_trials_global=1000,
                                max_time=1e-6, **SMALL)
    assert sum(r.trials for r in reports) == 0
    assert all(r.status == "time" for r in reports)
    assert time.monotonic() - start < 120
    warned = [r.getMessage() for r in caplog.records if "before any candidate" in r.getMessage()]
    assert len(warned) == 1 and "2 of 2 tasks" in warned[0]
    assert all(r.task_name in warned[0] for r in reports)


def test_no_next_pool_is_grown_for_a_batch_that_cannot_come(two_task_model, tmp_path,
                                                            monkeypatch):
    """The search grows a pool while a batch builds, but only for a batch that can come:
    here the budget is one batch per task, so each task's first pool is the only one grown,
    the second task's while the first task's batch builds (in the first round the next
    task's first pool, not the building task's second, whose batch may never come)."""
    from relax_tune.measure import Measurer
    from relax_tune.search import EvolutionarySearch

    grown, building = [], []
    grow, measure = EvolutionarySearch._grow, Measurer.measure
    monkeypatch.setattr(EvolutionarySearch, "_grow", lambda self, *a, **k: (
        grown.append((self.task, bool(building))), grow(self, *a, **k))[1])

    def measuring(self, *a, **k):
        building.append(1)
        try:
            return measure(self, *a, **k)
        finally:
            building.pop()

    monkeypatch.setattr(Measurer, "measure", measuring)
    # no work_dir: no predicted schedules, whose pools would be grown before the loop
    reports = rt.tune_tasks(two_task_model, None, max_trials_global=4,
                            database=rt.MemoryDatabase(), **SMALL)
    assert [r.trials for r in reports] == [2, 2]
    assert len(grown) == 2 and len({task for task, _ in grown}) == 2
    assert [during for _, during in grown] == [False, True]
    grown.clear()  # room for a second batch: pools for it are grown too
    reports = rt.tune_tasks(two_task_model, str(tmp_path / "two"), max_trials_global=6,
                            convergence_window=0, **SMALL)
    assert sum(r.trials for r in reports) == 6 and len(grown) > 2


def test_too_cheap_is_judged_on_the_tuned_model_after_a_first_batch(two_task_model, tmp_path):
    """Every task gets its first batch; then a task whose share of the estimated tuned
    model time (weight x best latency) is under min_task_share waits, and the budget goes
    to the others. (16^3 x 1 against 64^3 x 4: well under 20% once both are tuned.)"""
    reports = rt.tune_tasks(two_task_model, str(tmp_path), max_trials_global=8,
                            num_trials_per_iter=2, min_task_share=0.2)
    light = next(r for r in reports if r.weight == 1)
    heavy = next(r for r in reports if r.weight == 4)
    assert light.status == "too cheap" and light.trials == 2 and light.baseline_secs
    assert heavy.trials == 6


def test_progress_bar_table_and_log_file(two_task_model, tmp_path, capsys):
    rt.tune_tasks(two_task_model, str(tmp_path), max_trials_global=4, progress_bar=True,
                  **SMALL)
    err = capsys.readouterr().err
    assert "trial" in err and "weighted us" in err and "estimated end-to-end" in err
    log = (tmp_path / "logs" / "tune.log").read_text()
    assert "trials" in log and "tuning table" in log
    # the baselines, timed with each task's first batch, are reported one by one
    assert "[baseline 1/2, " in log and "[baseline 2/2, " in log and ": untuned " in log
    assert log.index("[baseline 1/2, ") < log.index(" trials, best ") \
        < log.index("[baseline 2/2, ")


_CHILD = """
import sys, relax_tune as rt
from tvm import te
import tvm
from relax_tune.search import EvolutionarySearch
# the pools of tests/conftest.py's fixture, in this process too
EvolutionarySearch.FRESH_PER_CALL, EvolutionarySearch.GENERATIONS = 6, 1
EvolutionarySearch.MUTANTS_PER_GENERATION = 12
EvolutionarySearch.RANKED_POOL, EvolutionarySearch.RANKED_GENERATIONS = 16, 2
EvolutionarySearch.RANKED_MUTANTS = 8
A = te.placeholder((128, 128), name="A"); B = te.placeholder((128, 128), name="B")
k = te.reduce_axis((0, 128), name="k")
C = te.compute((128, 128), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
tasks = rt.extract_tasks(tvm.IRModule({"mm": te.create_prim_func([A, B, C])}), rt.host_target())
rt.tune_tasks(tasks, sys.argv[1], max_trials_global=int(sys.argv[2]), num_trials_per_iter=2)
"""


@pytest.mark.slow  # test_faults.py::test_tuner_sigkilled_mid_write_then_load_and_resume
def test_sigkill_during_tuning_then_resume_loses_nothing(tmp_path):
    wd = tmp_path / "work"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(wd), "200"],
                            start_new_session=True)
    records = wd / "database_tuning_record.json"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if records.exists() and records.read_text().count("\n") >= 5:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the tuner wrote no records in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = [ln for ln in records.read_text().splitlines() if ln.strip()]
    complete = []
    for ln in lines:
        try:
            complete.append(json.loads(ln))
        except ValueError:
            pass  # a torn last line is allowed; everything before it must load
    assert len(complete) >= len(lines) - 1 >= 4
    db = rt.JSONDatabase(work_dir=str(wd))
    assert len(db) == len(complete)
    before = {candidate_key(r.trace_json) for r in db.get_all_tuning_records()}
    subprocess.run([sys.executable, str(script), str(wd), str(len(complete) + 2)], check=True,
                   timeout=300)
    after = rt.JSONDatabase(work_dir=str(wd)).get_all_tuning_records()
    keys = [candidate_key(r.trace_json) for r in after]
    assert before <= set(keys)
    assert len(keys) == len(set(keys))
    # the records on disk (one is the baseline) counted against the budget of
    # len(complete) + 2 trials: three new ones
    assert len(after) == len(complete) + 3


def test_first_round_counts_each_hinted_size_evenly(target, tmp_path):
    """Buckets of dynamic-shape functions are ranked by their share of the model's time at
    their own size: with budget for two first batches, the n=1024 matmul goes first and a
    bucket at n=1 second, not the n=1024 elementwise (which is slower than every n=1
    kernel in absolute terms, and came second by absolute untuned time)."""
    from tvm import te, tirx, topi

    n = tirx.Var("n", "int64")
    a, b = te.placeholder((n, 64), name="A"), te.placeholder((64, 48), name="B")
    x = te.placeholder((n, 40), name="X")
    mod = tvm.IRModule({
        "mm": te.create_prim_func([a, b, topi.matmul(a, b)]),
        "ew": te.create_prim_func([x, te.compute((n, 40), lambda i, j: x[i, j] * 2.0 + 1.0)])})
    tasks = rt.extract_tasks(mod, target, shape_hints={"n": [1, 1024]})
    assert len(tasks) == 4
    reports = rt.tune_tasks(tasks, str(tmp_path / "w"), max_trials_global=2,
                            num_trials_per_iter=1, progress_bar=False, head_to_head_rounds=0,
                            dispatch_plan=False)
    tried = sorted(r.task_name for r in reports if r.trials)
    assert "mm[n=1024]" in tried, tried
    assert any(name.endswith("[n=1]") for name in tried), tried


def test_no_batch_is_started_that_the_time_limit_would_cut_pure():
    """Under a time limit a batch holds only what can be built and timed before it, at the
    session's pace so far; with less time left than one trial takes, none starts."""
    from relax_tune.tuning.loop import _Pace

    pace = _Pace()
    pace.record(8.0, 16)  # 0.5 s a trial
    now = time.monotonic()
    assert pace.fits(now + 3.2) == 6
    assert pace.fits(now + 0.3) == 0 and pace.fits(now - 1.0) == 0
