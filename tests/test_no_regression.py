"""Tuning never makes a model slower: the untuned function is a measured candidate of every
task and ApplyDatabase keeps it whenever no tuned schedule beats it."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te

import relax_tune as rt
from relax_tune.demo import demo_inputs
from relax_tune.search import ReplaySearch
from relax_tune.database import BASELINE_TRACE
from relax_tune.utils import args_info, normalize_mod


def _matmul(n=32):
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C])


def _db_with(func, target, baseline_secs, tuned_secs):
    mod = normalize_mod(func)
    db = rt.MemoryDatabase()
    wl = db.commit_workload(mod)
    tuned = ReplaySearch(mod, target, seed=3).next_candidates(1)[0]
    for trace, secs in ((BASELINE_TRACE, baseline_secs), (tuned.trace_json, tuned_secs)):
        db.commit_tuning_record(rt.TuningRecord(trace, wl, [secs], target, args_info(mod)))
    return db


def test_slower_records_keep_the_original_function(target):
    func = _matmul()
    mod = tvm.IRModule({"mm": func})
    apply = rt.ApplyDatabase(database=_db_with(func, target, baseline_secs=1e-6,
                                               tuned_secs=1e-3))
    with target:
        out = apply(mod)
    assert apply.applied == [] and apply.kept == ["mm"]
    assert tvm_ffi.structural_equal(out["mm"], func)


def test_faster_record_is_applied(target):
    func = _matmul()
    apply = rt.ApplyDatabase(database=_db_with(func, target, baseline_secs=1e-3,
                                               tuned_secs=1e-6))
    with target:
        out = apply(tvm.IRModule({"mm": func}))
    assert apply.applied == ["mm"]
    assert out["mm"].attrs["tirx.is_scheduled"]
    assert not tvm_ffi.structural_equal(out["mm"], func)


def _min_call_secs(ex, inputs, rounds=5):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    timer = vm.time_evaluator("forward", tvm.cpu(), number=20, repeat=1)
    return [timer(*args).mean for _ in range(rounds)]


def test_budget_smaller_than_task_count_is_never_slower(demo, target, tmp_path):
    lowered, params = demo
    tasks = rt.extract_tasks(lowered, target)
    reports = rt.tune_tasks(tasks, str(tmp_path), max_trials_global=len(tasks) - 1,
                            num_trials_per_iter=1)
    # one trial each for all but one task (the first round is split evenly), each timed as
    # it is with its first batch; the last keeps its predicted schedule or untuned code
    assert sorted(r.trials for r in reports) == [0] + [1] * (len(tasks) - 1)
    assert all(bool(r.baseline_secs) == (r.trials > 0) for r in reports)
    with target:
        tuned = rt.ApplyDatabase(work_dir=str(tmp_path))(lowered)
    inputs = demo_inputs(params)
    ex_untuned, ex_tuned = tvm.compile(lowered, target), tvm.compile(tuned, target)
    # interleave the two so that load from elsewhere hits both alike; compare the best calls
    untuned, tuned_t = [], []
    for _ in range(3):
        untuned += _min_call_secs(ex_untuned, inputs)
        tuned_t += _min_call_secs(ex_tuned, inputs)
    assert min(tuned_t) <= 1.10 * min(untuned), (min(tuned_t), min(untuned))
    out = relax.VirtualMachine(ex_tuned, tvm.cpu())["forward"](
        *[tvm.runtime.tensor(x) for x in inputs]).numpy()
    ref = relax.VirtualMachine(ex_untuned, tvm.cpu())["forward"](
        *[tvm.runtime.tensor(x) for x in inputs]).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
