"""Measuring which bucket's kernel serves which sizes of a dynamic-shape function
(``relax_tune.dynamic.plan``), and ApplyDatabase following the plan."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx, topi

import relax_tune as rt
from relax_tune import dynamic
from relax_tune.database import is_baseline
from relax_tune.dynamic.plan import PLAN_FILE, read_plans, stretches
from relax_tune.database import candidate_key
from relax_tune.utils import RelaxTuneError, normalize_mod, structural_hash
from relax_tune.work_dir import WorkDir
from relax_tune.testing.workloads import symbolic_matmul

HINTS = {"n": [16, 64]}


def _best(work_dir: str, size: int, target):
    db = WorkDir.of(work_dir).open_for_apply()
    workload = normalize_mod(dynamic.specialize(symbolic_matmul(), {"n": size}))
    records = db.get_top_k(db.commit_workload(workload), 1, target)
    assert records and not is_baseline(records[0])
    return records[0]


@pytest.fixture(scope="module")
def planned(tmp_path_factory, target) -> str:
    """A work_dir with the symbolic matmul tuned at n=16 and n=64 and its dispatch
    measured (on by default)."""
    work = str(tmp_path_factory.mktemp("plan") / "work")
    rt.tune_tir(symbolic_matmul(), target, work, max_trials_global=8, num_trials_per_iter=4,
                shape_hints=HINTS, progress_bar=False, head_to_head_rounds=0)
    return work


def test_stretches_cover_hinted_sizes_and_split_each_gap_four_ways():
    assert stretches([16, 64]) == [(1, 15, 4, 16), (16, 16, 16, 16), (17, 23, 20, 16),
                                   (24, 32, 28, 16), (33, 45, 39, 64), (46, 63, 54, 64),
                                   (64, 64, 64, 64)]
    # the split where the nearest bucket changes is kept with any number per gap
    assert stretches([16, 64], per_gap=2) == [(1, 15, 4, 16), (16, 16, 16, 16),
                                              (17, 32, 23, 16), (33, 63, 46, 64),
                                              (64, 64, 64, 64)]
    assert stretches([1, 2, 4]) == [(1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 4), (4, 4, 4, 4)]
    assert stretches([8]) == [(1, 7, 3, 8), (8, 8, 8, 8)]


def test_tuning_measures_the_dispatch(planned, target):
    """The plan covers every size up to the largest bucket, each stretch served by a bucket
    or the untuned function, with the records ApplyDatabase applies and the times it was
    decided on."""
    plans = read_plans(planned)
    base = normalize_mod(symbolic_matmul())
    plan = plans[str(structural_hash(base))]
    assert [r[:2] for r in plan["ranges"]] == [[1, 15], [16, 16], [17, 23], [24, 32],
                                               [33, 45], [46, 63], [64, 64]]
    assert all(owner in (16, 64, None) for _, _, owner in plan["ranges"])
    assert plan["records"] == {str(s): candidate_key(_best(planned, s, target).trace_json)
                               for s in (16, 64)}
    for probe in ("4", "16", "20", "28", "39", "54", "64"):
        assert {"16", "64"} <= set(plan["probes"][probe])
        assert all(t > 0 for t in plan["probes"][probe].values())


def test_planning_is_resumed_not_repeated(planned, target, tmp_path, caplog):
    work = str(tmp_path / "work")
    shutil.copytree(planned, work)
    before = open(os.path.join(work, PLAN_FILE)).read()
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.plan"):
        rt.tune_tir(symbolic_matmul(), target, work, max_trials_global=8, num_trials_per_iter=4,
                    shape_hints=HINTS, progress_bar=False, head_to_head_rounds=0)
    assert "dispatch measured" not in caplog.text
    assert open(os.path.join(work, PLAN_FILE)).read() == before


def _write_ranges(work: str, ranges: list, records: dict | None = None) -> None:
    plans = read_plans(work)
    (key,) = plans
    plans[key]["ranges"] = ranges
    if records is not None:
        plans[key]["records"] = records
    with open(os.path.join(work, PLAN_FILE), "w") as file:
        json.dump(plans, file)


def test_apply_database_follows_the_plan(planned, target, tmp_path, caplog):
    """ApplyDatabase serves each stretch by the planned kernel (bucket 64's below 16, the
    untuned function at 17..32, bucket 16's at 33..63: a second copy of its branch; bucket
    64's at 64 and above), right at every size; with a plan measured on other records, each
    size goes to the nearest bucket."""
    work = str(tmp_path / "work")
    shutil.copytree(planned, work)
    _write_ranges(work, [[1, 15, 64], [17, 32, None], [33, 63, 16]])
    apply = rt.ApplyDatabase(work_dir=work)
    with target:
        out = apply(tvm.IRModule({"main": symbolic_matmul()}))
    assert apply.applied == ["main"]
    base = normalize_mod(symbolic_matmul())
    branches = [({"n": s}, dynamic.replay_symbolic(base, _best(work, s, target).trace_json,
                                                   {"n": s})) for s in (16, 64)]
    expected = dynamic.dispatch_function(
        base["main"], branches, served=[[[16, 16], [33, 63]], [[64, 64], [1, 15], [65, None]]])
    assert tvm_ffi.structural_equal(out["main"].body, expected.body, map_free_vars=True)
    text = out["main"].script()
    assert "n == T.int64(16)" in text and "T.int64(33) <= n and n <= T.int64(63)" in text
    # bucket 64 at its own size and the sizes above it: two copies (intermediates sized for
    # 64 in the first, symbolic in the second)
    assert "n == T.int64(64)" in text and "T.int64(65) <= n" in text
    assert dynamic.dispatch._merged([[64, 64], [1, 15], [65, None], [16, 20], [90, None]]) \
        == [(1, 20), (64, 64), (65, None)]
    lib = tvm.compile(tvm.IRModule({"main": out["main"].with_attr("global_symbol", "main")}),
                      target)
    rng = np.random.default_rng(5)
    for n in (1, 7, 15, 16, 20, 32, 33, 50, 64, 65, 100):
        a = rng.uniform(-1, 1, (n, 64)).astype("float32")
        b = rng.uniform(-1, 1, (64, 48)).astype("float32")
        c = tvm.runtime.tensor(np.zeros((n, 48), "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4, err_msg=f"n={n}")

    _write_ranges(work, [[1, 15, 64], [17, 32, None], [33, 63, 16]],
                  records={"16": "another record", "64": "another record"})
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.plan"), target:
        out = rt.ApplyDatabase(work_dir=work)(tvm.IRModule({"main": symbolic_matmul()}))
    assert "measured with other records" in caplog.text
    nearest = dynamic.dispatch_function(base["main"], branches)
    assert tvm_ffi.structural_equal(out["main"].body, nearest.body, map_free_vars=True)


def test_a_hinted_size_can_go_to_another_bucket(planned, target, tmp_path):
    """Where the plan gives a hinted size to another bucket's kernel (measured faster there),
    its own bucket does not serve it (the largest size's kernel serves the sizes above it
    too); a plan without the hinted sizes (written before they were timed) leaves each with
    its own bucket."""
    work = str(tmp_path / "work")
    shutil.copytree(planned, work)
    base = normalize_mod(symbolic_matmul())
    branches = [({"n": s}, dynamic.replay_symbolic(base, _best(work, s, target).trace_json,
                                                   {"n": s})) for s in (16, 64)]
    _write_ranges(work, [[1, 15, 64], [16, 16, 64], [17, 63, 16], [64, 64, 16]])
    with target:
        out = rt.ApplyDatabase(work_dir=work)(tvm.IRModule({"main": symbolic_matmul()}))
    swapped = dynamic.dispatch_function(
        base["main"], branches, served=[[[17, 63], [64, 64], [65, None]], [[1, 15], [16, 16]]])
    assert tvm_ffi.structural_equal(out["main"].body, swapped.body, map_free_vars=True)
    lib = tvm.compile(tvm.IRModule({"main": out["main"].with_attr("global_symbol", "main")}),
                      target)
    rng = np.random.default_rng(6)
    for n in (1, 16, 40, 64, 97):
        a = rng.uniform(-1, 1, (n, 64)).astype("float32")
        b = rng.uniform(-1, 1, (64, 48)).astype("float32")
        c = tvm.runtime.tensor(np.zeros((n, 48), "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4, err_msg=f"n={n}")

    _write_ranges(work, [[1, 15, 64], [17, 63, 16]])
    with target:
        out = rt.ApplyDatabase(work_dir=work)(tvm.IRModule({"main": symbolic_matmul()}))
    own = dynamic.dispatch_function(
        base["main"], branches, served=[[[16, 16], [17, 63]], [[64, 64], [1, 15], [65, None]]])
    assert tvm_ffi.structural_equal(out["main"].body, own.body, map_free_vars=True)


def test_a_malformed_plan_falls_back_to_the_nearest_bucket(planned, target, tmp_path, caplog):
    """A plan whose ranges are not ``[low, high, bucket]`` (edited by hand) is logged and
    each size goes to its nearest bucket; the compilation goes on."""
    work = str(tmp_path / "work")
    shutil.copytree(planned, work)
    _write_ranges(work, [[1, 15], "nonsense"])
    with caplog.at_level(logging.WARNING, logger="relax_tune.dynamic.plan"), target:
        apply = rt.ApplyDatabase(work_dir=work)
        out = apply(tvm.IRModule({"main": symbolic_matmul()}))
    assert "dispatch plan is malformed" in caplog.text
    assert apply.applied == ["main"]
    base = normalize_mod(symbolic_matmul())
    branches = [({"n": s}, dynamic.replay_symbolic(base, _best(work, s, target).trace_json,
                                                   {"n": s})) for s in (16, 64)]
    nearest = dynamic.dispatch_function(base["main"], branches)
    assert tvm_ffi.structural_equal(out["main"].body, nearest.body, map_free_vars=True)


def _per_call_secs(libs: dict, n: int, rounds: int = 7, calls: int = 20) -> dict[str, float]:
    """Median seconds per call of each library's ``main`` (a symbolic matmul) at ``n``,
    timed in interleaved rounds of ``calls`` calls after a warm-up call."""
    rng = np.random.default_rng(n)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, shape).astype("float32"))
            for shape in ((n, 64), (64, 48), (n, 48))]
    samples: dict[str, list[float]] = {name: [] for name in libs}
    for _ in range(rounds):
        for name, lib in libs.items():
            func = lib["main"]
            func(*args)
            start = time.perf_counter()
            for _ in range(calls):
                func(*args)
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: float(np.median(times)) for name, times in samples.items()}


@pytest.mark.parametrize("follow_plan", [True, False])
def test_sizes_past_the_largest_bucket_run_its_kernel(planned, target, tmp_path, follow_plan):
    """Past the largest hinted size (64) the dispatch runs the largest bucket's kernel, not
    the untuned function: right at sizes no tile divides, per row at least as fast at
    n=256 as at n=64 (within 25%), and at least 1.5x faster than the untuned function
    there (which it was until issue 43: 0.9x the untuned speed on a decoder block); with
    the measured plan and with the nearest bucket alike."""
    work = str(tmp_path / "work")
    shutil.copytree(planned, work)
    if not follow_plan:
        os.remove(os.path.join(work, PLAN_FILE))
    with target:
        out = rt.ApplyDatabase(work_dir=work)(tvm.IRModule({"main": symbolic_matmul()}))
    libs = {"dispatch": tvm.compile(tvm.IRModule(
                {"main": out["main"].with_attr("global_symbol", "main")}), target),
            "untuned": tvm.compile(tvm.IRModule({"main": symbolic_matmul()}), target)}
    rng = np.random.default_rng(7)
    for n in (65, 97, 131, 256, 301):
        a = rng.uniform(-1, 1, (n, 64)).astype("float32")
        b = rng.uniform(-1, 1, (64, 48)).astype("float32")
        c = tvm.runtime.tensor(np.zeros((n, 48), "float32"))
        libs["dispatch"]["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4, err_msg=f"n={n}")
    at_hint, past = _per_call_secs(libs, 64), _per_call_secs(libs, 256)
    assert past["dispatch"] / 256 <= 1.25 * at_hint["dispatch"] / 64, (at_hint, past)
    assert past["dispatch"] * 1.5 <= past["untuned"], past


def test_served_ranges_need_one_variable():
    m, n = tirx.Var("m", "int64"), tirx.Var("n", "int64")
    a = te.placeholder((m, n), "float32", name="A")
    func = te.create_prim_func([a, topi.exp(a)])
    with pytest.raises(ValueError, match="one symbolic variable"):
        dynamic.dispatch_function(func, [({"m": 4, "n": 4}, func)], served=[[[1, 4]]])


def test_dispatch_plan_option_is_checked():
    with pytest.raises(RelaxTuneError, match="dispatch_plan"):
        rt.TuneConfig(dispatch_plan="yes")
