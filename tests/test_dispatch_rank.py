"""Ranking a dynamic-shape bucket's records as they run, replayed on the symbolic function
(``relax_tune.dynamic.rank``), and ApplyDatabase following the ranking."""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi

import relax_tune as rt
from relax_tune import dynamic
from relax_tune.database import is_baseline
from relax_tune.dynamic.rank import RANKING_FILE, UNTUNED, read_rankings
from relax_tune.database import candidate_key
from relax_tune.utils import RelaxTuneError, args_info, normalize_mod, structural_hash
from relax_tune.work_dir import WorkDir
from relax_tune.testing.workloads import symbolic_matmul

HINTS = {"n": [16, 64]}


def _top_records(work_dir: str, size: int, target, k: int = 32) -> list:
    """The ``k`` fastest (static) records of the bucket at n=``size``, baseline included."""
    db = WorkDir.of(work_dir).open_for_apply()
    workload = normalize_mod(dynamic.specialize(symbolic_matmul(), {"n": size}))
    return db.get_top_k(db.commit_workload(workload), k, target)


def _bucket_records(work_dir: str, size: int, target) -> list:
    """The records of the bucket at n=``size``, fastest (static) first, baseline excluded."""
    return [r for r in _top_records(work_dir, size, target) if not is_baseline(r)]


def _ranked_records(work_dir: str, size: int, target, per_bucket: int = 3) -> list:
    """The records the ranker times for the bucket at n=``size``: the fastest (static) ones
    up to the untuned baseline, at most ``per_bucket`` (on a busy machine a few-trial record
    can time slower than the baseline, and is then not ranked)."""
    return list(itertools.takewhile(lambda r: not is_baseline(r),
                                    _top_records(work_dir, size, target, per_bucket)))


def _ranking_id(size: int) -> str:
    workload = normalize_mod(dynamic.specialize(symbolic_matmul(), {"n": size}))
    return f"{structural_hash(workload)}:n={size}"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, target) -> str:
    """A work_dir with the symbolic matmul tuned at n=16 and n=64 (4 trials each), its
    buckets ranked (no dispatch plan: ApplyDatabase dispatches to the nearest bucket)."""
    work = str(tmp_path_factory.mktemp("rank") / "work")
    rt.tune_tir(symbolic_matmul(), target, work, max_trials_global=8, num_trials_per_iter=4,
                shape_hints=HINTS, progress_bar=False, head_to_head_rounds=0,
                dispatch_ranking=3, dispatch_plan=False)
    return work


def test_tuning_ranks_each_bucket_as_dispatched(tuned, target):
    """Each bucket's three fastest records and its untuned function are timed as dispatched
    and kept in the work_dir; the tuned matmul beats the untuned one there."""
    rankings = read_rankings(tuned)
    assert set(rankings) == {_ranking_id(16), _ranking_id(64)}
    for size in (16, 64):
        scores = rankings[_ranking_id(size)]["scores"]
        keys = [candidate_key(r.trace_json) for r in _ranked_records(tuned, size, target)]
        assert keys and set(scores) == set(keys) | {UNTUNED}
        assert all(s is not None and s > 0 for s in scores.values())
        assert min(scores[k] for k in keys) < scores[UNTUNED]


def test_ranking_is_resumed_not_repeated(tuned, target, tmp_path, caplog):
    """Tuning the same work_dir again (at its budget) times nothing again: the ranking file
    stays as it was."""
    work = str(tmp_path / "work")
    shutil.copytree(tuned, work)
    before = open(os.path.join(work, RANKING_FILE)).read()
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.rank"):
        rt.tune_tir(symbolic_matmul(), target, work, max_trials_global=8, num_trials_per_iter=4,
                    shape_hints=HINTS, progress_bar=False, head_to_head_rounds=0,
                    dispatch_ranking=3, dispatch_plan=False)
    assert "ranked as dispatched" not in caplog.text
    assert open(os.path.join(work, RANKING_FILE)).read() == before


def _write_scores(work: str, scores_by_size: dict[int, dict]) -> None:
    rankings = read_rankings(work)
    for size, scores in scores_by_size.items():
        rankings[_ranking_id(size)]["scores"] = scores
    with open(os.path.join(work, RANKING_FILE), "w") as file:
        json.dump(rankings, file)


def _applied(work: str, target) -> tuple[tvm.IRModule, rt.ApplyDatabase]:
    apply = rt.ApplyDatabase(work_dir=work)
    with target:
        out = apply(tvm.IRModule({"main": symbolic_matmul()}))
    return out, apply


def test_apply_database_follows_the_ranking(tuned, target, tmp_path):
    """ApplyDatabase runs the record ranked fastest as dispatched (here made the second
    fastest static one; the fastest failed there), and keeps the untuned function when it
    ranked first in every bucket."""
    work = str(tmp_path / "work")
    shutil.copytree(tuned, work)
    first16, second16 = _bucket_records(work, 16, target)[:2]
    best64 = _bucket_records(work, 64, target)[0]
    _write_scores(work, {16: {candidate_key(first16.trace_json): None,
                              candidate_key(second16.trace_json): 1e-6, UNTUNED: 1.0},
                         64: {candidate_key(best64.trace_json): 1e-6, UNTUNED: 1.0}})
    out, apply = _applied(work, target)
    assert apply.applied == ["main"]
    base = normalize_mod(symbolic_matmul())
    expected = dynamic.dispatch_function(base["main"], [
        ({"n": 16}, dynamic.replay_symbolic(base, second16.trace_json, {"n": 16})),
        ({"n": 64}, dynamic.replay_symbolic(base, best64.trace_json, {"n": 64}))])
    assert tvm_ffi.structural_equal(out["main"].body, expected.body, map_free_vars=True)
    unexpected = dynamic.dispatch_function(base["main"], [
        ({"n": 16}, dynamic.replay_symbolic(base, first16.trace_json, {"n": 16})),
        ({"n": 64}, dynamic.replay_symbolic(base, best64.trace_json, {"n": 64}))])
    assert not tvm_ffi.structural_equal(out["main"].body, unexpected.body, map_free_vars=True)

    _write_scores(work, {size: {UNTUNED: 1e-9, **{candidate_key(r.trace_json): 1.0
                                                  for r in _bucket_records(work, size, target)}}
                         for size in (16, 64)})
    out, apply = _applied(work, target)
    assert apply.applied == [] and apply.kept == ["main"]


def test_a_marked_workload_builds_as_its_bucket_runs(tuned, target, shared_builder,
                                                     shared_runner):
    """A build worker makes the bucket's dispatch of a workload marked by
    ``dispatch_workload``: correct inside the bucket (n=20, served by n=16 up to 32) and
    above it (n=40, the untuned body); a trace that does not fit fails with a reason."""
    base = normalize_mod(symbolic_matmul())
    marked = dynamic.dispatch_workload(base, {"n": 16}, HINTS)
    trace = _bucket_records(tuned, 16, target)[0].trace_json
    build, bad = shared_builder.build(marked, target,
                                      [trace, [[["Nonsense", [], [], []]], []]])
    assert build.ok, build.error
    assert not bad.ok and "does not replay on the symbolic function" in bad.error
    for n in (20, 40):
        info = args_info(normalize_mod(dynamic.specialize(base["main"], {"n": n})))
        a, b, c = shared_runner.run_and_fetch(build.artifact_path, info, target, seed=3)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4, err_msg=f"n={n}")


def test_dispatch_ranking_option_is_checked():
    with pytest.raises(RelaxTuneError, match="dispatch_ranking"):
        rt.TuneConfig(dispatch_ranking=-1)
