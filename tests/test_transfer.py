"""Schedules transferred from alike workloads (relax_tune.transfer): found, refitted, applied
without measurement where close, measured first where tuning, and the shipped library
replays under the current design space."""

import numpy as np
import pytest
import tvm
from tvm import te

import relax_tune as rt
from relax_tune.database import MemoryDatabase, TuningRecord
from relax_tune.database.records import candidate_key, is_baseline
from relax_tune.space import space_for_target
from relax_tune.space.cpu.multi_level_tiling import accumulator_budget
from relax_tune.space.params import target_params
from relax_tune.testing.workloads import matmul_mod
from relax_tune.transfer.refit import kept_share, refit_trace, register_fallbacks
from relax_tune.transfer import (TransferSource, fit_tile, library_database,
                                 machine_class, shape_distance, workload_shape)
from relax_tune.transfer.similarity import anchor_distance
from relax_tune.utils import args_info, normalize_mod, schedule_from_json, trace_to_json
from relax_tune.work_dir import WorkDir

from test_predict import CountingRunner


@pytest.mark.parametrize("factors,extent", [([7, 1, 8, 8], 56), ([2, 4, 16], 96),
                                            ([1, 32], 7), ([4, 4, 4, 4], 256), ([3], 10)])
def test_fitted_tiles_multiply_to_the_new_extent_and_keep_inner_tiles(factors, extent):
    fitted = fit_tile(factors, extent)
    assert len(fitted) == len(factors) and int(np.prod(fitted)) == extent
    if extent % factors[-1] == 0:
        assert fitted[-1] == factors[-1]  # the innermost (vector) tile carries over
    if extent == int(np.prod(factors)):
        assert fitted == factors  # the same shape: the same tiles


def test_the_kept_share_says_how_much_of_the_inner_tiles_survived():
    assert kept_share([7, 1, 8, 8], fit_tile([7, 1, 8, 8], 448)) == 1.0
    assert fit_tile([7, 1, 8, 8], 112) == [2, 1, 7, 8]  # the divisor nearest 8 in size: 7
    assert kept_share([7, 1, 8, 8], [2, 1, 7, 8]) == 56 / 64
    assert fit_tile([1, 5], 7) == [1, 7]  # a 5x5 map's tile on a 7x7 one
    assert kept_share([1, 32], fit_tile([1, 32], 7)) == 7 / 32


def test_alike_workloads_are_the_same_computation_on_other_shapes():
    a, b = workload_shape(matmul_mod(64)), workload_shape(matmul_mod(128))
    assert a.key == b.key and shape_distance(a, a) == 0
    assert 0 < shape_distance(a, b) < shape_distance(a, workload_shape(matmul_mod(512)))
    x = te.placeholder((64, 64), "float32", name="A")
    y = te.compute((64, 64), lambda i, j: x[i, j] * 2.0, name="C")
    scale = normalize_mod(te.create_prim_func([x, y]))
    assert shape_distance(a, workload_shape(scale)) == float("inf")


def _tuned_source(target, work_dir, n=64, trials=8):
    tasks = rt.extract_tasks(matmul_mod(n), target)
    rt.tune_tasks(tasks, work_dir, max_trials_global=trials, num_trials_per_iter=4,
                  transfer=False)
    return rt.JSONDatabase(work_dir=work_dir)


def _transferred_key(db, mod, target) -> str:
    found = TransferSource([db]).find(mod, target)
    assert found, "the tuned alike workload should give a transferred schedule"
    assert found[0].kept == 1.0  # 64 -> 128: every inner tile of 64 divides 128
    replayed = space_for_target(target).replay(mod, found[0].trace)
    assert replayed.ok, replayed.error
    return candidate_key(trace_to_json(replayed.sch.trace))


def _predicted_record(mod, wd: str, target):
    """The no-measurement compile of ``mod``'s one task in ``wd`` (nothing timed): the
    record of the schedule it chose."""
    runner = CountingRunner()
    tasks = rt.extract_tasks(mod, target)
    (report,) = rt.tune_tasks(tasks, wd, measure=False, runner=runner)
    assert runner.calls == 0 and report.predicted
    (record,) = [r for r in WorkDir(wd).open_predicted().database.get_all_tuning_records()
                 if r.workload.mod is not None and args_info(r.workload.mod) == tasks[0].args_info]
    return record


def test_no_measurement_compile_applies_the_closest_alike_schedule(target, tmp_path):
    wd = str(tmp_path)
    db = _tuned_source(target, wd)
    mod = matmul_mod(128)
    want = _transferred_key(db, mod, target)
    record = _predicted_record(mod, wd, target)
    assert candidate_key(record.trace_json) == want
    # the applied schedule computes the product
    sch = schedule_from_json(mod, record.trace_json)
    lib = tvm.compile(sch.mod, target)
    a, b = np.random.rand(128, 128).astype("float32"), np.random.rand(128, 128).astype("float32")
    c = tvm.runtime.tensor(np.zeros((128, 128), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_tuning_measures_the_transferred_schedule_in_the_first_batch(target, tmp_path):
    wd = str(tmp_path)
    db = _tuned_source(target, wd)
    mod = matmul_mod(128)
    want = _transferred_key(db, mod, target)
    tasks = rt.extract_tasks(mod, target)
    rt.tune_tasks(tasks, wd, max_trials_global=4, num_trials_per_iter=4)
    db = rt.JSONDatabase(work_dir=wd)
    (wl,) = [w for w in db.get_all_workloads() if args_info(w.mod) == tasks[0].args_info]
    keys = {candidate_key(r.trace_json) for r in db.get_records(wl)
            if not is_baseline(r.trace_json)}
    assert want in keys


def test_a_record_of_another_machine_class_is_not_applied_unmeasured(target, tmp_path):
    db = _tuned_source(target, str(tmp_path))
    (wl,) = db.get_all_workloads()
    best = [r for r in db.get_top_k(wl, 4) if not is_baseline(r.trace_json)][0]
    other = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": (  # another class
        "skylake-avx512" if target_params(target).vector_bytes < 64 else "haswell")})
    foreign = MemoryDatabase()
    foreign.commit_tuning_record(TuningRecord(
        trace_json=best.trace_json, workload=foreign.commit_workload(wl.mod),
        run_secs=best.run_secs, target=other, args_info=best.args_info))
    mod = matmul_mod(128)
    found = TransferSource([foreign]).find(mod, target)
    assert found and not found[0].same_class  # it still seeds a measured search
    assert TransferSource([foreign]).find(mod, target, same_class_only=True) == []
    assert TransferSource([foreign]).find(mod, other)[0].same_class


def test_a_record_tuned_for_this_very_target_is_preferred_within_its_class(target, tmp_path):
    """The library keeps one record per workload and target: two CPUs of one class (an
    AVX2 Zen 3 and a Zen 4 with AVX-512 hidden) each keep theirs, and a task takes the one
    tuned for its own target even where the other ran faster on its machine."""
    db = _tuned_source(target, str(tmp_path))
    (wl,) = db.get_all_workloads()
    mine, theirs = [r for r in db.get_top_k(wl, 8) if not is_baseline(r.trace_json)][:2]
    sibling = tvm.target.Target({**{k: v for k, v in target.export().items()
                                    if k in ("kind", "mcpu", "keys")},
                                 "num-cores": 64})  # the same class, another target
    assert str(sibling) != str(target) and machine_class(sibling) == machine_class(target)
    both = MemoryDatabase()
    for rec, tgt, secs in ((mine, target, [1e-3]), (theirs, sibling, [1e-6])):
        both.commit_tuning_record(TuningRecord(rec.trace_json, both.commit_workload(wl.mod),
                                               secs, tgt, rec.args_info))
    mod = matmul_mod(128)
    want, _ = refit_trace(schedule_from_json(wl.mod, mine.trace_json), mod)
    other, _ = refit_trace(schedule_from_json(wl.mod, theirs.trace_json), mod)
    assert trace_to_json(want.trace) != trace_to_json(other.trace)
    (found,) = TransferSource([both]).find(mod, target)
    assert found.same_class and trace_to_json(found.trace) == trace_to_json(want.trace)
    (found,) = TransferSource([both]).find(mod, sibling)
    assert trace_to_json(found.trace) == trace_to_json(other.trace)


def test_the_shipped_library_replays_under_the_current_design_space(target):
    """Every record of the library replays on its own workload: a change of the design
    space that strands it fails here, not silently in users' sessions."""
    lib = library_database()
    assert lib is not None, "relax_tune/transfer/library is missing: build it with " \
        "python -m tools.transfer_library.build_library"
    records = lib.get_all_tuning_records()
    assert len(records) >= 20
    failed = []
    for rec in records:  # each under the design space of the machine it was tuned on
        assert rec.is_valid and not is_baseline(rec.trace_json)
        sch = schedule_from_json(rec.workload.mod, rec.trace_json)
        replayed = space_for_target(rec.target).replay(rec.workload.mod, sch.trace)
        if not replayed.ok:
            failed.append(replayed.error)
    assert not failed, failed[:3]


def _gelu_tasks(n: int, target) -> list:
    """The task of a ViT MLP's GELU (erf form, between reshapes) on n tokens of 768
    features: a space of one program."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 768), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.gelu(relax.op.reshape(x, (1, n, 768))))
            out = bb.emit_output(bb.emit(relax.op.reshape(y, (n, 768))))
        bb.emit_func_output(out)
    return rt.extract_tasks(rt.transform.lower_for_tuning(bb.get(), target, {}), target)


def test_a_far_transferred_schedule_does_not_leave_a_large_task_untuned(target, tmp_path):
    """A record of an alike workload too far to apply unmeasured stays out of the
    no-measurement choice, but the task still gets the model's: here the transferred
    program is the only one sampling finds, and its samples were dropped as repeats of it
    (ViT's GELU was left untuned this way: 1.34 ms against 0.29 ms in the model)."""
    wd = str(tmp_path)
    rt.tune_tasks(_gelu_tasks(50, target), wd, max_trials_global=4, num_trials_per_iter=4,
                  transfer=False)
    tasks = _gelu_tasks(197, target)
    found = TransferSource([rt.JSONDatabase(work_dir=wd)]).find(tasks[0].mod, target)
    assert found and found[0].distance > 4.5  # too far to be applied as it is
    runner = CountingRunner()
    (report,) = rt.tune_tasks(tasks, wd, measure=False, runner=runner)
    assert runner.calls == 0 and report.predicted


def test_the_library_keeps_the_best_record_of_each_machine_class(target, tmp_path):
    """build_library's export: one record per workload and machine class; --add keeps the
    records of the other classes already in the library."""
    from tools.transfer_library.build_library import export

    here = _tuned_source(target, str(tmp_path / "here"), trials=4)
    other = rt.JSONDatabase(work_dir=str(tmp_path / "other"))
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    for rec in here.get_all_tuning_records():
        if rec.is_valid and not is_baseline(rec.trace_json):
            other.commit_tuning_record(TuningRecord(
                rec.trace_json, other.commit_workload(rec.workload.mod),
                [s * 2 for s in rec.run_secs], avx512, rec.args_info))
    out = str(tmp_path / "library")
    export({"here": str(tmp_path / "here"), "other": str(tmp_path / "other")}, out)
    lib = rt.JSONDatabase(work_dir=out)
    classes = sorted(str(r.target.attrs.get("mcpu", "")) for r in lib.get_all_tuning_records())
    assert len(lib.get_all_workloads()) == 1 and len(classes) == 2
    assert "skylake-avx512" in classes
    del lib
    export({"here": str(tmp_path / "here")}, out, keep_existing=True)  # a build on this class
    assert len(rt.JSONDatabase(work_dir=out).get_all_tuning_records()) == 2
    export({"here": str(tmp_path / "here")}, out)  # without --add: this class alone
    assert len(rt.JSONDatabase(work_dir=out).get_all_tuning_records()) == 1


def _matmul(m: int, n: int = 64, k: int = 64) -> tvm.IRModule:
    a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return normalize_mod(te.create_prim_func([a, b, c]))


def _tiles(trace) -> list[list[int]]:
    insts, decisions = trace_to_json(trace)
    return [d for i, d in decisions if insts[i][0] == "SamplePerfectTile"]


def test_a_register_tile_grown_past_the_registers_falls_back_to_one_that_fits(target, tmp_path):
    """Rows of w vectors filling the register budget at 2s rows (s rows a tile) become
    s+1 rows at 2(s+1): past the budget, LimitRegisterTile rejects the nearest fit (it left
    MobileNetV2's heaviest 1x1 convolutions to the model's choice on a Zen 3). The
    no-measurement compile then applies a fallback with the same cache tiles that fits.
    (w: the most vectors a loop may hold that divide the budget with rows under the largest
    innermost tile: 7 rows of 2 on AVX2's 14 accumulators, 7 of 4 on AVX-512's 28, where 14
    rows of 2 would be past that tile.)"""
    params = target_params(target)
    budget = accumulator_budget(params)  # LimitRegisterTile's
    vectors = 64 * 4 // params.vector_bytes  # the 64 columns, in vectors
    w = next(w for w in range(min(params.max_vector_registers_per_loop, vectors), 0, -1)
             if budget % w == 0 and vectors % w == 0
             and budget // w < params.max_innermost_spatial)
    s = budget // w  # s rows of w vectors: the whole budget
    space = space_for_target(target)
    src_mod, new_mod = _matmul(2 * s), _matmul(2 * (s + 1))
    sketch = space.generate_design_space(src_mod)[0]
    tiles = [i for i in sketch.insts if i.kind.name == "SamplePerfectTile"]
    trace = sketch.with_decision(tiles[0], [2, 1, 1, s], True)
    trace = trace.with_decision(tiles[1], [vectors // w, 1, 1, w], True)
    source = space.replay(src_mod, trace)
    assert source.ok, source.error
    refitted, why = refit_trace(source.sch, new_mod)
    assert refitted is not None, why
    assert _tiles(refitted.trace)[0][-1] == s + 1  # the nearest divisor: one row more
    nearest = space.replay(new_mod, refitted.trace)
    assert not nearest.ok and "LimitRegisterTile" in nearest.error
    fallbacks = register_fallbacks(refitted)
    fits = [f for f in fallbacks if space.replay(new_mod, f).ok]
    assert fits, [_tiles(f) for f in fallbacks]
    for f in fallbacks:  # the same cache tiles: every tiling's inner levels multiply alike
        for a, b in zip(_tiles(f), _tiles(refitted.trace)):
            assert int(np.prod(a[1:])) == int(np.prod(b[1:])) and a[0] == b[0]

    wd = str(tmp_path)
    db = rt.JSONDatabase(work_dir=wd)
    db.commit_tuning_record(TuningRecord(trace_to_json(source.sch.trace),
                                         db.commit_workload(src_mod), [1e-4], target,
                                         args_info(src_mod)))
    record = _predicted_record(new_mod, wd, target)
    assert _tiles(schedule_from_json(new_mod, record.trace_json).trace)[:2] == _tiles(fits[0])[:2]


def test_remeasure_keeps_the_schedule_fastest_on_this_machine(target, tmp_path):
    """build_library --remeasure: a workload's records of every target are timed here, and
    another target's schedule that runs faster here than this target's own record becomes
    this target's, whatever the stored times said (those came from other machines and
    sessions); export then writes it in place of the own one."""
    from relax_tune.measure import LocalBuilder, LocalRunner
    from tools.transfer_library.build_library import export
    from tools.transfer_library.remeasure import remeasure

    tuned = _tuned_source(target, str(tmp_path / "tuned"), n=128, trials=4)
    (wl,) = tuned.get_all_workloads()
    fast = next(r for r in tuned.get_top_k(wl, 8) if not is_baseline(r.trace_json))
    untiled = [[["GetSBlock", [], ["C", "main"], ["b0"]]], []]  # the serial loop nest
    other = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    lib = rt.JSONDatabase(work_dir=str(tmp_path / "library"))
    for trace, tgt, secs in ((untiled, target, [1e-7]), (fast.trace_json, other, [1e-3])):
        lib.commit_tuning_record(TuningRecord(trace, lib.commit_workload(wl.mod), secs, tgt,
                                              fast.args_info))
    builder, runner = LocalBuilder(max_workers=1), LocalRunner()
    try:
        (chosen,) = remeasure(lib, target, builder, runner, log=lambda _: None)
    finally:
        builder.shutdown()
        runner.shutdown()
    assert str(chosen.target) == str(target) and chosen.trace_json == fast.trace_json
    del lib
    out = str(tmp_path / "library")
    export({}, out, keep_existing=True, chosen=[chosen])
    mine = [r for r in rt.JSONDatabase(work_dir=out).get_all_tuning_records()
            if str(r.target) == str(target)]
    assert [r.trace_json for r in mine] == [fast.trace_json]


def _epilogue_mod(n: int, bias: bool, extra: bool = False) -> tvm.IRModule:
    """C = A @ B (n x n), plus a bias row (``bias``), a ReLU, and an added residual
    (``extra``): one matmul with several epilogues, as importers produce them (an ONNX
    convolution whose folded bias is zero has no bias add)."""
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    out = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    args = [a, b]
    if bias:
        row = te.placeholder((n,), "float32", name="bias")
        out = te.compute((n, n), lambda i, j: out[i, j] + row[j], name="T_add")
        args.append(row)
    out = te.compute((n, n), lambda i, j: te.max(out[i, j], 0.0), name="compute")
    if extra:
        res = te.placeholder((n, n), "float32", name="R")
        out = te.compute((n, n), lambda i, j: out[i, j] + res[i, j], name="T_add_res")
        args.append(res)
    return normalize_mod(te.create_prim_func([*args, out]))


def test_a_schedule_carries_over_to_the_same_matmul_with_another_epilogue(target, tmp_path):
    """A tuned matmul + bias + ReLU gives its schedule to the same matmul with a ReLU alone
    (the bias add's instructions dropped): found, replayed, applied without measurement and
    correct. Not to one with an extra residual add: that block would be left as its own
    loop nest."""
    source = _epilogue_mod(64, bias=True)
    plain, extra = _epilogue_mod(64, bias=False), _epilogue_mod(64, bias=True, extra=True)
    shapes = [workload_shape(m) for m in (source, plain, extra)]
    assert len({s.key for s in shapes}) == 3 and len({s.anchor for s in shapes}) == 1
    assert anchor_distance(shapes[0], shapes[1]) == 0
    assert 0 < anchor_distance(shapes[0], workload_shape(matmul_mod(128))) < float("inf")
    x = te.placeholder((64, 64), "float32", name="A")  # no reduction: no anchor
    scale = normalize_mod(te.create_prim_func([x, te.compute((64, 64), lambda i, j: x[i, j])]))
    assert anchor_distance(workload_shape(scale), workload_shape(scale)) == float("inf")
    wd = str(tmp_path)
    rt.tune_tasks(rt.extract_tasks(source, target), wd, max_trials_global=8,
                  num_trials_per_iter=4, transfer=False)
    db = rt.JSONDatabase(work_dir=wd)
    (found,) = TransferSource([db], per_task=1).find(plain, target)
    assert found.distance == 0
    replayed = space_for_target(target).replay(plain, found.trace)
    assert replayed.ok, replayed.error
    assert "T_add" not in str(found.trace)
    # one block more than the source scheduled: it would run as its own loop nest
    assert TransferSource([db], per_task=1).find(extra, target) == []
    # the no-measurement compile of the plain one takes the carried-over schedule
    record = _predicted_record(plain, wd, target)
    assert candidate_key(record.trace_json) == candidate_key(trace_to_json(replayed.sch.trace))
    lib = tvm.compile(schedule_from_json(plain, record.trace_json).mod, target)
    x, w = np.random.rand(64, 64).astype("float32"), np.random.rand(64, 64).astype("float32")
    y = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), y)
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


def _add(out: te.Tensor, other: te.Tensor, name: str) -> te.Tensor:
    if len(other.shape) == 1:
        return te.compute(out.shape, lambda i, j: out[i, j] + other[j], name=name)
    return te.compute(out.shape, lambda i, j: out[i, j] + other[i, j], name=name)


def _matmul_then(n: int, *adds: str) -> tvm.IRModule:
    """C = A @ B (n x n), then the adds in order ("bias": a row; "residual": a whole
    matrix), named as TVM names a fused function's: T_add, T_add1."""
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    out = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    args = [a, b]
    for index, add in enumerate(adds):
        other = te.placeholder((n,) if add == "bias" else (n, n), "float32", name=add)
        out = _add(out, other, f"T_add{index or ''}")
        args.append(other)
    return normalize_mod(te.create_prim_func([*args, out]))


def test_a_schedule_carries_over_where_the_epilogue_lacks_a_block_and_is_named_otherwise(
        target, tmp_path):
    """A matmul + bias + residual add (T_add, T_add1) gives its schedule to the same matmul
    with no epilogue (the matmul is then the output block: no consumer to compute at) and
    to one with the residual add alone, which TVM then names T_add (an ONNX convolution
    whose folded bias is zero). Each replays, is applied without measurement and computes
    its own sum. Before the blocks were matched by what they compute, neither replayed, and
    MobileNetV2's 1x1 projections took schedules of far shapes (distance 5-11)."""
    wd = str(tmp_path)
    rt.tune_tasks(rt.extract_tasks(_matmul_then(64, "bias", "residual"), target), wd,
                  max_trials_global=8, num_trials_per_iter=4, transfer=False)
    db = rt.JSONDatabase(work_dir=wd)
    rng = np.random.default_rng(0)
    x, w, r = (rng.random((64, 64), dtype=np.float32) for _ in range(3))
    for adds, want in (((), x @ w), (("residual",), x @ w + r)):
        mod = _matmul_then(64, *adds)
        (found,) = TransferSource([db], per_task=1).find(mod, target)
        assert found.distance == 0 and found.kept == 1.0
        replayed = space_for_target(target).replay(mod, found.trace)
        assert replayed.ok, replayed.error
        record = _predicted_record(mod, wd, target)
        assert candidate_key(record.trace_json) == candidate_key(
            trace_to_json(replayed.sch.trace))
        lib = tvm.compile(schedule_from_json(mod, record.trace_json).mod, target)
        args = [tvm.runtime.tensor(v) for v in (x, w, r)[:2 + len(adds)]]
        y = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
        lib["main"](*args, y)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_split_into_whole_vectors_does_not_carry_over_to_an_extent_it_leaves_a_rest_of():
    """A 64-wide loop split into vectors of 8 becomes 8 x 8 iterations under a predicate on
    a 58-wide one, which LLVM does not vectorise (ShuffleNetV2's 58-channel convolutions ran
    1.7x slower than untuned with such a transfer): the trace does not carry over there."""
    source = tvm.s_tir.Schedule(matmul_mod(64))
    _, j, _ = source.get_loops(source.get_sblock("C"))
    source.vectorize(source.split(j, [None, 8])[1])
    refitted, why = refit_trace(source, matmul_mod(58))
    assert refitted is None and "a loop of 58 split by [None, 8] leaves a remainder" in why
    refitted, why = refit_trace(source, matmul_mod(128))
    assert refitted is not None, why



def test_a_transferred_schedule_that_fails_the_transfer_check_is_not_applied(
        target, tmp_path, monkeypatch):
    """The no-measurement compile applies a close transferred schedule only where it passes
    ``predict._transfer_fits`` (it vectorises this task's compute: a depthwise
    convolution's schedule on RegNetX's grouped one vectorised none, 840 us a call against
    55): refused, the task gets the model's choice instead."""
    from relax_tune.tuning import predict

    wd = str(tmp_path)
    db = _tuned_source(target, wd)
    mod = matmul_mod(128)
    transferred = _transferred_key(db, mod, target)
    monkeypatch.setattr(predict, "_transfer_fits", lambda task: lambda cand: False)
    assert candidate_key(_predicted_record(mod, wd, target).trace_json) != transferred
