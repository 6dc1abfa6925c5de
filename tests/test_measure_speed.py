"""Tests of what keeps a trial cheap: a batch's slow candidates are cut short once a faster
one is known (``LocalRunner(slow_ratio=...)``), a slow untuned function runs once for both
its baseline time and the correctness reference (``time_and_fetch``), workers start early;
and what keeps the best honest: a would-be best is re-timed head-to-head with the best.
Real kernels on this CPU; only orders of magnitude are relied on (a naive 256^3 matmul is
tens of times slower than a parallel, vectorised one)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import relax_tune as rt
from relax_tune import utils
from relax_tune.database import JSONDatabase, is_baseline
from relax_tune.measure import LocalRunner, MeasureError, Measurer, RunResult
from relax_tune.measure.base import calls_per_repeat
from relax_tune.measure.head_to_head import head_to_head
from relax_tune.measure.measurer import Incumbent

from relax_tune.testing.workloads import matmul_mod, tiled_matmul_trace


@pytest.fixture(scope="module")
def mod256():
    return matmul_mod(256)


@pytest.fixture(scope="module")
def built(mod256, target, shared_builder):
    """[fast, untuned (slow)] artifacts of a 256^3 matmul."""
    res = shared_builder.build(mod256, target,
                               [tiled_matmul_trace(mod256, k_inside_rows=False), None])
    assert all(r.ok for r in res), res
    return [r.artifact_path for r in res]


def _runner(shared_runner, monkeypatch, **options) -> LocalRunner:
    """What ``LocalRunner(**options)`` (default timeout) times with, for this test: the
    run's kept runner with those attributes, so no worker process starts for it."""
    for name, value in options.items():
        assert hasattr(shared_runner, name), name
        monkeypatch.setattr(shared_runner, name, value)
    return shared_runner


def test_slow_candidate_cut_after_a_fast_one(built, mod256, target, shared_runner,
                                            monkeypatch):
    info = utils.args_info(mod256)
    runner = _runner(shared_runner, monkeypatch, number=2, repeat=3)
    fast, slow = runner.run(built, info, target, max_secs=10.0)
    assert fast.ok and len(fast.run_secs) == 3
    assert slow.ok and len(slow.run_secs) == 1  # its warm-up was over 2x the fast one
    assert slow.mean_secs > 2 * fast.mean_secs
    # the limit only drops after a fast candidate: slow first, both are timed in full
    slow2, fast2 = runner.run(built[::-1], info, target, max_secs=10.0)
    assert len(slow2.run_secs) == 3 and len(fast2.run_secs) == 3
    # no max_secs: nothing is cut
    assert all(len(r.run_secs) == 3 for r in runner.run(built, info, target))
    off = _runner(shared_runner, monkeypatch, slow_ratio=0)
    assert all(len(r.run_secs) == 3 for r in off.run(built, info, target, max_secs=10.0))


def test_a_repeat_of_short_calls_starts_at_its_minimum_duration_pure():
    """The time evaluator's first try per repeat holds enough calls of a warm call's time to
    last ``min_repeat_ms``: a pause of the process then adds little to each call."""
    assert calls_per_repeat(3, 5, 20e-6) == 250
    assert calls_per_repeat(3, 5, 0.01) == 3
    assert calls_per_repeat(3, 0, 20e-6) == 3
    assert calls_per_repeat(3, 5, 0.0) == 3


def test_slow_ratio_must_be_above_one():
    with pytest.raises(rt.RelaxTuneError, match="slow_ratio"):
        LocalRunner(slow_ratio=0.5)


def test_time_and_fetch_remembers_outputs(built, mod256, target, tmp_path):
    info = utils.args_info(mod256)
    copy = str(tmp_path / "same_bytes.so")
    shutil.copy(built[1], copy)
    runner = LocalRunner()
    runner.start()
    try:
        secs = runner.time_and_fetch(built[1], info, target, seed=7)
        assert secs > 0
        fresh = runner.run_and_fetch(built[0], info, target, seed=7)  # another library: runs
        a, b, c = fresh
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        with pytest.raises(MeasureError):
            runner.time_and_fetch(str(tmp_path / "missing.so"), info, target)
    finally:
        runner.shutdown()
    # the worker is gone: a byte-identical copy is answered from what time_and_fetch kept
    remembered = runner.run_and_fetch(copy, info, target, seed=7)
    assert len(remembered) == len(fresh) == 3
    for x, y in zip(remembered, fresh):
        np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-3)
    with pytest.raises(RuntimeError, match="shut down"):  # a different seed is not kept
        runner.run_and_fetch(copy, info, target, seed=8)


def _tune_recording(mod, target, tmp_path, runner, monkeypatch) -> tuple[list, list]:
    """Tune ``mod``'s one task for 2 trials (one batch and its baseline) with ``runner``;
    returns the calls it got, ``("time_and_fetch", artifact)`` and ``("run", artifacts)``
    in order, and the task's baseline records."""
    calls: list[tuple[str, object]] = []
    time_and_fetch, run = runner.time_and_fetch, runner.run

    def recording_time_and_fetch(artifact, *args, **kwargs):
        calls.append(("time_and_fetch", artifact))
        return time_and_fetch(artifact, *args, **kwargs)

    def recording_run(artifacts, *args, **kwargs):
        calls.append(("run", list(artifacts)))
        return run(artifacts, *args, **kwargs)

    monkeypatch.setattr(runner, "time_and_fetch", recording_time_and_fetch)
    monkeypatch.setattr(runner, "run", recording_run)
    task = rt.extract_tasks(mod, target)[0]
    rt.tune_tasks([task], str(tmp_path), max_trials_global=2, num_trials_per_iter=2,
                  runner=runner, progress_bar=False)
    db = JSONDatabase(work_dir=str(tmp_path))
    return calls, [r for r in db.get_records(db.commit_workload(task.mod)) if is_baseline(r)]


def test_slow_untuned_function_is_called_once(target, tmp_path, shared_runner, monkeypatch):
    """512^3 untuned takes well over 0.1 s here: its baseline, timed before the first batch's
    candidates, is one call, and that call is the correctness reference too (the check
    never calls the untuned function again)."""
    calls, base = _tune_recording(matmul_mod(512), target, tmp_path, shared_runner,
                                  monkeypatch)
    assert shared_runner._memo, "the untuned outputs were not kept for the check"
    assert len(base) == 1 and base[0].is_valid and len(base[0].run_secs) == 1
    assert base[0].run_secs[0] > 0.1
    # the baseline's one call, then the two candidates; the baseline is not run again
    assert [kind for kind, _ in calls] == ["time_and_fetch", "run"], calls
    assert len(calls[1][1]) == 2 and calls[0][1] not in calls[1][1]


def test_a_fast_baseline_is_timed_in_the_candidates_rounds(target, tmp_path, shared_runner,
                                                            monkeypatch):
    """A fast untuned function (well under 0.1 s a call) gives the check its reference with
    one call, then is timed with the first batch's candidates in one ``run``, first (their
    interleaved rounds: a spell of load on the machine falls on it and them alike)."""
    calls, base = _tune_recording(matmul_mod(64), target, tmp_path, shared_runner,
                                  monkeypatch)
    assert len(base) == 1 and base[0].is_valid and len(base[0].run_secs) > 1  # timed, not cut
    assert [kind for kind, _ in calls][:2] == ["time_and_fetch", "run"], calls
    assert len(calls[1][1]) == 3 and calls[1][1][0] == calls[0][1]  # the baseline first


def test_candidate_near_the_cut_gets_single_call_repeats(built, mod256, target, shared_runner,
                                                         monkeypatch):
    """slow_ratio 1000, near_ratio 1: the untuned one is far under the cut but over the
    best known (max_secs / slow_ratio): it is timed by `repeat` single calls, not cut."""
    info = utils.args_info(mod256)
    runner = _runner(shared_runner, monkeypatch, number=50, repeat=3, slow_ratio=1000,
                     near_ratio=1)
    fast, slow = runner.run(built, info, target, max_secs=1.0)
    assert fast.ok and len(fast.run_secs) == 3
    assert slow.ok and len(slow.run_secs) == 3 and slow.mean_secs > fast.mean_secs
    with pytest.raises(rt.RelaxTuneError, match="near_ratio"):
        LocalRunner(near_ratio=0.5)


def test_head_to_head_ratios(built, mod256, target, shared_runner, monkeypatch):
    """The untuned kernel against the tiled one: every round says it is far slower; a
    kernel against itself: about even (the median round; CI machines have neighbours)."""
    info = utils.args_info(mod256)
    fast, slow = built
    runner = _runner(shared_runner, monkeypatch, number=2, repeat=2)
    ratios = head_to_head(runner, fast, slow, info, target, rounds=3)
    assert ratios is not None and len(ratios) == 3
    assert min(ratios) > 3, ratios
    even = head_to_head(runner, fast, fast, info, target, rounds=3)
    assert even is not None and 0.5 < sorted(even)[1] < 2, even
    assert head_to_head(runner, fast, "/nonexistent.so", info, target, rounds=1) is None


def test_lucky_timing_does_not_crown_a_slow_candidate(built, mod256, target, shared_builder,
                                                      shared_runner, monkeypatch):
    """A slow candidate whose batch timing came out just under the best (a fast spell of the
    machine) is re-timed against the best and recorded in its frame: far slower. A clear
    winner keeps its own timing. In a resumed run the incumbent is rebuilt from its trace."""
    fast, slow = built
    info = utils.args_info(mod256)
    task = rt.extract_tasks(mod256, target)[0]
    # the task's best is on record (a resumed run): only its trace is known, no library
    incumbent = Incumbent(trace=tiled_matmul_trace(mod256, k_inside_rows=False))
    runner = _runner(shared_runner, monkeypatch, number=2, repeat=2)
    measurer = Measurer(shared_builder, runner, check_correctness=False, head_to_head_rounds=2)
    best = runner.run([fast], info, target)[0].mean_secs
    lucky = [RunResult([0.7 * best], None), RunResult([0.8 * best], None)]
    out = measurer.challenge(task, incumbent, best, [slow, fast], lucky, info)
    assert incumbent.artifact is not None and incumbent.artifact not in built  # rebuilt
    assert incumbent.reference == (incumbent.artifact, best)
    assert out[0].mean_secs > 3 * best, (out[0], best)
    assert 0.4 * best < out[1].mean_secs < 2.5 * best, (out[1], best)
    clear = measurer.challenge(task, incumbent, best, [slow], [RunResult([best / 3], None)],
                               info)
    assert clear[0].run_secs == [best / 3]
    assert incumbent.reference == (slow, best / 3)  # a clear winner: the new reference
