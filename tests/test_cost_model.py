"""Cost model: our features, the XGBoost model ranking real measured candidates, save/load."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tvm_ffi
from tvm import te

from relax_tune.cost_model import (N_FEATURES, CostModel, RandomModel, XGBModel,
                                   extract_features, extract_features_batch,
                                   feature_names, make_cost_model)
from relax_tune.measure import LocalRunner
from relax_tune.search import ReplaySearch
from relax_tune.utils import FAILED_RUN_SECS, RelaxTuneError, args_info, normalize_mod
from relax_tune.work_dir import WorkDir


def matmul(n: int, m: int | None = None):
    m = m or n
    a = te.placeholder((n, m), "float32", name="A")
    b = te.placeholder((m, n), "float32", name="B")
    r = te.reduce_axis((0, m), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return normalize_mod(te.create_prim_func([a, b, c]))


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-a between two score vectors."""
    n, s = len(x), 0.0
    for i in range(n):
        for j in range(i + 1, n):
            s += np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
    return 2.0 * s / (n * (n - 1))


@pytest.fixture(scope="module")
def measured(target, shared_builder):
    """64 random candidates of a 256 x 256 x 256 matmul, built and timed on this CPU:
    ``(features, run_secs)``. Timed on one thread, best of 5: the machine is shared, and
    two-thread timings under load rank the same candidates too differently run to run."""
    mod = matmul(256)
    cands = ReplaySearch(mod, target, seed=11).next_candidates(64)
    builds = shared_builder.build(mod, target, [c.trace_json for c in cands])
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TVM_NUM_THREADS", "1")  # read when the runner's worker starts
            runner = LocalRunner(number=1, repeat=5)
            try:
                runs = runner.run([b.artifact_path for b in builds], args_info(mod), target)
            finally:
                runner.shutdown()
    finally:
        shared_builder.discard([b.artifact_path for b in builds])
    secs = []
    for b, r in zip(builds, runs):
        ok = b.error is None and r.error is None and r.run_secs
        secs.append(float(np.min(r.run_secs)) if ok else FAILED_RUN_SECS)
    return extract_features_batch([c.sch for c in cands]), np.asarray(secs)


def test_features_fixed_length_and_tell_schedules_apart(target):
    cands = ReplaySearch(matmul(128), target, seed=2).next_candidates(12)
    start = time.perf_counter()
    feats = extract_features_batch([c.sch for c in cands])
    rate = len(cands) / (time.perf_counter() - start)
    print(f"feature extraction: {rate:.0f} candidates/s")
    assert feats.shape == (12, N_FEATURES) == (12, len(feature_names()))
    assert np.isfinite(feats).all()
    programs = {tvm_ffi.structural_hash(c.sch.mod) for c in cands}
    assert len(programs) >= 10  # (seeded: the sample holds different programs)
    assert len({row.tobytes() for row in feats}) == len(programs)  # one vector per program
    # the unscheduled function is readable too, and differs from every scheduled one
    plain = extract_features(matmul(128))
    assert plain.any() and not any(np.array_equal(plain, row) for row in feats)


def test_features_see_parallel_and_vector_loops(target):
    from tvm.s_tir import Schedule

    sch = Schedule(matmul(64))
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    base = extract_features(sch)
    sch.parallel(i)
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(jo, k, ji)
    sch.vectorize(ji)
    names = feature_names()
    got = dict(zip(names, extract_features(sch)))
    before = dict(zip(names, base))
    assert got["top_log_parallel"] == pytest.approx(np.log2(65)) and before["top_log_parallel"] == 1  # log2(1 + 1 job)
    assert got["top_log_vector"] == pytest.approx(np.log2(9)) and got["top_vector_innermost"] == 1
    # loads in order C (the update), A, B: B is read along j, unit stride in the vector
    # loop; A[i, k] does not move with j
    assert got["top_load2_stride_inner_unit"] == 1 and got["top_load2_stride_inner_zero"] == 0
    assert got["top_load1_stride_inner_zero"] == 1 and got["top_load1_stride_inner_unit"] == 0


def test_xgb_ranks_held_out_candidates_better_than_random(measured):
    feats, secs = measured
    valid = np.flatnonzero(secs < FAILED_RUN_SECS)
    assert len(valid) >= 56, "too many candidates failed to build or run"
    taus, taus_random, recalls = [], [], []
    for split in range(5):  # fixed seeds: 40 to train, the rest held out
        order = np.random.default_rng(split).permutation(valid)
        train, test = order[:40], order[40:]
        model = XGBModel(seed=0)
        model.update_features("mm", feats[train], secs[train])
        assert model.trained
        pred = model.predict_features("mm", feats[test])
        taus.append(kendall_tau(pred, -secs[test]))
        taus_random.append(np.mean([
            kendall_tau(RandomModel(seed=s).predict_features("mm", feats[test]), -secs[test])
            for s in range(10)]))
        k = len(test) // 3
        top_true = set(np.argsort(secs[test])[:k].tolist())
        recalls.append(len(top_true & set(np.argsort(-pred)[:k].tolist())) / k)
    print(f"held-out Kendall tau: xgb {np.mean(taus):.2f} {np.round(taus, 2)}, random "
          f"{np.mean(taus_random):.2f}; top-third recall {np.mean(recalls):.2f} (chance 0.33)")
    assert np.mean(taus) > np.mean(taus_random) + 0.07
    assert np.mean(recalls) > 1 / 3


def test_save_load_round_trip(tmp_path, measured):
    feats, secs = measured
    model = XGBModel(seed=0)
    model.update_features("mm", feats[:40], secs[:40], keys=[str(i) for i in range(40)])
    model.save(str(tmp_path))
    loaded = XGBModel()
    assert loaded.load(str(tmp_path))
    assert loaded.num_rows == 40
    np.testing.assert_allclose(loaded.predict_features("mm", feats[40:]),
                               model.predict_features("mm", feats[40:]), rtol=1e-6)
    # keys already seen are skipped, new ones are learned
    loaded.update_features("mm", feats[:2], secs[:2], keys=["0", "1"])
    assert loaded.num_rows == 40
    loaded.update_features("mm", feats[40:42], secs[40:42], keys=["40", "41"])
    assert loaded.num_rows == 42
    assert not XGBModel().load(str(tmp_path / "nothing-here"))


def test_make_cost_model_by_name_and_warm_start(tmp_path, measured):
    feats, secs = measured
    assert make_cost_model("none") is None and make_cost_model(None) is None
    assert isinstance(make_cost_model("random"), RandomModel)
    fresh = make_cost_model("xgb-fresh", str(tmp_path))
    assert isinstance(fresh, XGBModel) and not fresh.trained
    fresh.update_features("mm", feats[:30], secs[:30])
    fresh.save(WorkDir.of(tmp_path).cost_model_dir)
    warm = make_cost_model("xgb-fresh", str(tmp_path))
    assert warm.trained and warm.num_rows == 30
    mine = RandomModel()
    assert make_cost_model(mine) is mine and isinstance(mine, CostModel)
    with pytest.raises(RelaxTuneError, match="unknown cost model 'bogus'"):
        make_cost_model("bogus")
