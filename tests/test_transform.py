"""The passes end to end on the demo model: tune, apply, compile, run."""

import json
from collections import Counter

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import relax_tune as rt
from relax_tune.demo import demo_inputs
from relax_tune.database import candidate_key
from relax_tune.search import ReplaySearch

SMALL = {"num_trials_per_iter": 2}


def _run(mod, target, inputs):
    ex = tvm.compile(mod, target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["forward"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


@pytest.fixture(scope="module")
def tuned(demo, target, tmp_path_factory):
    """The demo model tuned with 8 trials through TuneIRMod in a Sequential."""
    lowered, _ = demo
    work_dir = str(tmp_path_factory.mktemp("tuned") / "work")
    tune = rt.TuneIRMod(params={}, work_dir=work_dir, max_trials_global=8, **SMALL)
    with target:
        out = tvm.ir.transform.Sequential([tune])(lowered)
    return work_dir, out, tune.reports


def test_tune_irmod_returns_module_unchanged_and_records_every_task(tuned, demo, target):
    work_dir, out, reports = tuned
    lowered, _ = demo
    tvm.ir.assert_structural_equal(out, lowered)
    assert sum(r.trials for r in reports) == 8
    db = rt.JSONDatabase(work_dir=work_dir)
    tasks = rt.extract_tasks(lowered, target)
    assert {r.workload.shash for r in db.get_all_tuning_records()} == {t.shash for t in tasks}
    assert len(reports) == len(tasks) == 4
    for r in reports:  # every task gets its first batch before any is judged too cheap
        assert r.baseline_secs is not None
        assert r.trials >= 1, r
    assert len(db) == 8 + 4  # the trials and one baseline per task


def test_no_trace_measured_twice_and_resume_spends_nothing(tuned, demo, target):
    work_dir, _, _ = tuned
    db = rt.JSONDatabase(work_dir=work_dir)
    per_workload = Counter((r.workload.shash, candidate_key(r.trace_json))
                           for r in db.get_all_tuning_records())
    assert max(per_workload.values()) == 1
    before = len(db)
    again = rt.tune_tasks(rt.extract_tasks(demo[0], target), work_dir, max_trials_global=8)
    assert sum(r.new_trials for r in again) == 0
    assert len(rt.JSONDatabase(work_dir=work_dir)) == before


def test_op_names_only_matching_tasks_in_database(demo, target, tmp_path):
    lowered, _ = demo
    with target:
        rt.TuneIRMod(params={}, work_dir=str(tmp_path), max_trials_global=4,
                     op_names=["matmul1", "transpose1"], **SMALL)(lowered)
    db = rt.JSONDatabase(work_dir=str(tmp_path))
    wanted = {t.shash for t in rt.extract_tasks(lowered, target,
                                                op_names=["matmul1", "transpose1"])}
    assert len(wanted) == 2
    assert {r.workload.shash for r in db.get_all_tuning_records()} == wanted


def test_apply_database_replaces_exactly_the_recorded_functions(tuned, demo, target):
    work_dir, _, _ = tuned
    lowered, _ = demo
    db = rt.JSONDatabase(work_dir=work_dir)
    # keep records for two tasks only
    keep = {t.shash for t in rt.extract_tasks(lowered, target, op_names=["matmul1", "fused"])}
    partial = rt.MemoryDatabase()
    for rec in db.get_all_tuning_records():
        if rec.workload.shash in keep:
            wl = partial.commit_workload(rec.workload.mod)
            partial.commit_tuning_record(rt.TuningRecord(rec.trace_json, wl, rec.run_secs,
                                                         rec.target, rec.args_info))
    copy = lowered.clone()
    apply = rt.ApplyDatabase(database=partial)
    with target:
        out = apply(lowered)
    tvm.ir.assert_structural_equal(lowered, copy)  # input not mutated
    # recorded functions are replaced, or kept when their untuned baseline won
    assert sorted(apply.applied + apply.kept) == ["fused_matmul_add_relu", "matmul1"]
    assert "fused_matmul_add_relu" in apply.applied  # 1x784x256: tuning always wins here
    for gv, func in out.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        orig = lowered[gv.name_hint]
        if gv.name_hint in apply.applied:
            assert func.attrs["tirx.is_scheduled"]
            for key in orig.attrs.keys():
                assert key in func.attrs
        else:
            assert tvm_ffi.structural_equal(func, orig)


def test_tuned_model_output_equals_untuned(tuned, demo, target):
    work_dir, _, _ = tuned
    lowered, params = demo
    with target:
        out = rt.ApplyDatabase(work_dir=work_dir)(lowered)
    inputs = demo_inputs(params)
    np.testing.assert_allclose(_run(out, target, inputs), _run(lowered, target, inputs),
                               rtol=1e-4, atol=1e-5)


def test_records_for_another_cpu_are_not_applied(tuned, demo):
    work_dir, _, _ = tuned
    lowered, _ = demo
    other = tvm.target.Target({"kind": "llvm", "mcpu": "cortex-a72",
                               "mtriple": "aarch64-linux-gnu"})
    apply = rt.ApplyDatabase(work_dir=work_dir)
    with other:
        apply(lowered)
    assert apply.applied == []


def test_registered_pipeline_compiles_and_matches(tuned, target):
    work_dir, _, _ = tuned
    mod, params = rt.demo.demo_model()
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                              max_trials_global=0)
    ex = tvm.compile(mod, target, relax_pipeline=pipe)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = demo_inputs(params)
    got = vm["forward"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    x, w1, b1, w2 = inputs
    np.testing.assert_allclose(got, np.maximum(x @ w1.T + b1, 0) @ w2.T, rtol=1e-4, atol=1e-4)


def test_pipeline_tunes_when_given_trials(target, tmp_path):
    mod, params = rt.demo.demo_model()
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=str(tmp_path),
                              max_trials_global=2, op_names=["transpose1"], **SMALL)
    ex = tvm.compile(mod, target, relax_pipeline=pipe)
    inputs = demo_inputs(params)
    got = relax.VirtualMachine(ex, tvm.cpu())["forward"](
        *[tvm.runtime.tensor(x) for x in inputs]).numpy()
    x, w1, b1, w2 = inputs
    np.testing.assert_allclose(got, np.maximum(x @ w1.T + b1, 0) @ w2.T, rtol=1e-4, atol=1e-4)
    records = rt.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    # the pipeline did tune: both trials, or every program of the transpose's space when it
    # holds fewer (one on some CPUs)
    space = ReplaySearch(records[0].workload.mod, target, seed=1)
    programs = [c for _ in range(4) for c in space.next_candidates(8)]
    trials = [r for r in records if not rt.database.is_baseline(r)]
    assert len(records) - len(trials) == 1 and len(trials) == min(2, len(programs))


def test_tune_tir_shares_one_budget(target, tmp_path):
    from tvm import te
    A = te.placeholder((32, 32), name="A")
    B = te.compute((32, 32), lambda i, j: A[j, i] + 1.0, name="B")
    C = te.placeholder((32, 32), name="C")
    D = te.compute((32, 32), lambda i, j: C[i, j] * 2.0, name="D")
    mod = tvm.IRModule({"f": te.create_prim_func([A, B]), "g": te.create_prim_func([C, D])})
    tune = rt.TuneTIR(work_dir=str(tmp_path), max_trials_global=4, **SMALL)
    with target:
        tune(mod)
    assert sum(r.trials for r in tune.reports) == 4  # one budget, spent once over both
    assert {r.task_name for r in tune.reports} == {"f", "g"}
    assert all(r.trials >= 1 for r in tune.reports)


def test_work_dir_that_is_a_file_is_a_clear_error(demo, target, tmp_path):
    lowered, _ = demo
    bad = tmp_path / "file"
    bad.write_text("not a directory")
    with target, pytest.raises(rt.RelaxTuneError, match=str(bad)):
        rt.TuneIRMod(params={}, work_dir=str(bad), max_trials_global=2)(lowered)


def test_bad_target_and_unknown_op_name_are_clear_errors(demo, tmp_path):
    lowered, _ = demo
    with pytest.raises(rt.RelaxTuneError, match="not a TVM target"):
        rt.TuneIRMod(params={}, work_dir=str(tmp_path), max_trials_global=2,
                     target="not-a-target")(lowered)
    with pytest.raises(rt.RelaxTuneError, match="softmax"):
        rt.TuneIRMod(params={}, work_dir=str(tmp_path), max_trials_global=2,
                     target="llvm", op_names=["softmax"])(lowered)
    with pytest.raises(rt.RelaxTuneError, match="no target given"):
        rt.ApplyDatabase(work_dir=str(tmp_path))(lowered)
