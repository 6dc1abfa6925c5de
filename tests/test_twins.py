"""Twin tasks (workloads that differ only in their constants) share one search."""

import numpy as np
import tvm
from tvm import te

import relax_tune as rt
from relax_tune.tuning.twins import constant_blind, twin_families
from relax_tune.utils import structural_hash
from relax_tune.work_dir import WorkDir

N = 64


def requantize(scale: float, zero_point: int, shift: int = 0, n: int = N) -> tvm.tirx.PrimFunc:
    """A matmul of int8 data whose result is scaled and offset by constants (the shape of a
    quantized layer's kernel); ``shift`` moves where the left input is read."""
    a = te.placeholder((n, n + 2), "int8", name="a")
    b = te.placeholder((n, n), "int8", name="b")
    k = te.reduce_axis((0, n), name="k")
    acc = te.compute((n, n), lambda i, j: te.sum(
        a[i, k + shift].astype("int32") * b[k, j].astype("int32"), axis=k), name="acc")
    out = te.compute((n, n), lambda i, j: (acc[i, j] - zero_point).astype("float32")
                     * tvm.tirx.const(scale, "float32"), name="out")
    return te.create_prim_func([a, b, out])


def _key(func):
    return structural_hash(constant_blind(tvm.IRModule({"main": func})))


def test_workloads_that_differ_only_in_data_constants_are_twins_and_others_are_not():
    assert _key(requantize(0.02, 114)) == _key(requantize(0.5, 7))
    assert _key(requantize(0.02, 114)) != _key(requantize(0.02, 114, shift=1))  # index
    assert _key(requantize(0.02, 114)) != _key(requantize(0.02, 114, n=32))  # shape


def test_one_twin_is_tuned_and_the_others_get_its_schedule(tmp_path, target):
    mod = tvm.IRModule({"layer0": requantize(0.02, 114), "layer1": requantize(0.5, 7),
                        "other": requantize(0.02, 114, shift=2)})
    tasks = rt.extract_tasks(mod, target)
    assert len(tasks) == 3
    families = twin_families(tasks)
    assert [(f.leader.task_name, f.leader.weight, [m.task_name for m in f.members])
            for f in families] == [("layer0", 2, ["layer1"]), ("other", 1, [])]
    work = str(tmp_path / "work")
    reports = rt.tune_tasks(tasks, work, max_trials_global=4, num_trials_per_iter=2)
    assert [r.task_name for r in reports] == ["layer0", "layer1", "other"]
    assert reports[1].status == "twin" and reports[1].trials == 0 and reports[1].predicted
    assert reports[0].trials >= 1 and reports[2].trials >= 1
    wd = WorkDir(work)
    db = wd.open_database()
    measured = {t.task_name for t in tasks if db.has_workload(t.mod)}
    assert measured == {"layer0", "other"}  # nothing of the twin was timed
    leader_best = db.query_tuning_record(tasks[0].mod, target)
    twin = wd.open_predicted().query_tuning_record(tasks[1].mod, target)
    assert twin.trace_json == leader_best.trace_json

    applied = rt.transform.ApplyDatabase(work_dir=work)
    with target:
        tuned = applied(mod)
    assert "layer1" in applied.predicted
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (N, N + 2)).astype("int8")
    b = rng.integers(-128, 128, (N, N)).astype("int8")
    want = ((a[:, :N].astype(np.int64) @ b.astype(np.int64) - 7) * np.float32(0.5))
    lib = tvm.compile(tvm.IRModule({"main": tuned["layer1"]}), target)
    out = tvm.runtime.tensor(np.zeros((N, N), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


def test_without_measurement_a_family_is_predicted_once(tmp_path, target):
    mod = tvm.IRModule({"layer0": requantize(0.02, 114), "layer1": requantize(0.5, 7)})
    tasks = rt.extract_tasks(mod, target)
    work = str(tmp_path / "work")
    reports = rt.tune_tasks(tasks, work, measure=False)
    assert [(r.task_name, r.status, r.predicted) for r in reports] == [
        ("layer0", "predicted", True), ("layer1", "twin", True)]
    predicted = WorkDir(work).open_predicted()
    assert predicted.query_tuning_record(tasks[1].mod, target).trace_json == \
        predicted.query_tuning_record(tasks[0].mod, target).trace_json
