"""Replay search: new keys only, ``exclude`` respected, bounded, and decisions validated."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import tvm_ffi
from tvm import te, topi
from tvm.s_tir import Schedule

from relax_tune.database import candidate_key
from relax_tune.search import (Candidate, ReplaySearch, SearchStrategy,
                               make_search, search_names)
from relax_tune.space import (generate_design_space, sampling_instructions, space_for_target,
                              validate_decisions, without_decisions)
from relax_tune.utils import RelaxTuneError, normalize_mod, schedule_from_json, trace_to_json


def matmul(n: int):
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    r = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return normalize_mod(te.create_prim_func([a, b, c]))


def softmax():
    x = te.placeholder((8, 32), "float32", name="X")
    return normalize_mod(te.create_prim_func([x, topi.nn.softmax(x, axis=-1)]))


def test_no_duplicate_keys_across_calls(target):
    search = ReplaySearch(matmul(64), target, seed=3)
    keys: list[str] = []
    for _ in range(4):
        batch = search.next_candidates(6)
        assert len(batch) == 6
        assert all(isinstance(c, Candidate) and c.key == candidate_key(c.trace_json)
                   for c in batch)
        keys += [c.key for c in batch]
    assert len(keys) == len(set(keys))


def test_exclude_is_respected(target):
    mod = matmul(64)
    first = ReplaySearch(mod, target, seed=9).next_candidates(10)
    excluded = {c.key for c in first}
    again = ReplaySearch(mod, target, seed=9).next_candidates(10, exclude=excluded)
    assert len(again) == 10 and not ({c.key for c in again} & excluded)


def test_same_seed_same_candidates(target):
    mod = matmul(64)
    a = [c.key for c in ReplaySearch(mod, target, seed=4).next_candidates(5)]
    b = [c.key for c in ReplaySearch(mod, target, seed=4).next_candidates(5)]
    c = [c.key for c in ReplaySearch(mod, target, seed=5).next_candidates(5)]
    assert a == b and a != c


def test_exhausting_a_tiny_space_terminates(target):
    """a transpose has one sketch whose only choice is the parallel budget (3 categories):
    at most 4 programs."""
    x = te.placeholder((8, 32), "float32", name="X")
    search = ReplaySearch(normalize_mod(te.create_prim_func([x, topi.transpose(x)])), target,
                          seed=1)
    start = time.perf_counter()
    got = []
    for _ in range(4):
        got += search.next_candidates(8)
    assert 1 <= len(got) <= 4
    assert len({c.key for c in got}) == len(got)
    assert search.next_candidates(8) == []
    assert time.perf_counter() - start < 30


def test_candidate_key_is_stable_across_replay_and_processes(target):
    mod = matmul(64)
    cand = ReplaySearch(mod, target, seed=2).next_candidates(1)[0]
    replayed = schedule_from_json(mod, cand.trace_json)
    assert tvm_ffi.structural_equal(replayed.mod, cand.sch.mod)
    assert candidate_key(trace_to_json(replayed.trace)) == cand.key
    code = ("import json,sys; from relax_tune.database import candidate_key; "
            "print(candidate_key(json.loads(sys.stdin.read())))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(cand.trace_json),
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == cand.key


def _first_tile(trace, extent_hint: int | None = None):
    tiles = [i for i in sampling_instructions(trace) if i.kind.name == "SamplePerfectTile"]
    assert tiles
    return tiles[0]


def test_validator_flags_a_tile_tvm_would_silently_replace(target):
    mod = matmul(1024)
    sketch = without_decisions(generate_design_space(mod, target)[0])
    tile = _first_tile(sketch)  # the i loop, extent 1024, four factors
    bad = sketch.with_decision(tile, [3, 3, 3, 3], True)
    # TVM itself replays it without complaint, recording a different decision ...
    sch = Schedule(mod)
    bad.apply_to_schedule(sch, remove_postproc=True)
    replayed = [i for i in sampling_instructions(sch.trace)][0]
    assert [int(x) for x in sch.trace.get_decision(replayed)] != [3, 3, 3, 3]
    # ... which our validation flags
    reason = validate_decisions(bad, sch.trace)
    assert reason is not None and "replaced" in reason
    out = space_for_target(target).replay(mod, bad, seed=7)
    assert not out.ok and "replaced" in out.error
    good = sketch.with_decision(tile, [16, 8, 4, 2], True)
    assert space_for_target(target).replay(mod, good, seed=7).ok


def test_validator_flags_innermost_factor_past_its_limit(target):
    mod = matmul(1024)
    sketch = without_decisions(generate_design_space(mod, target)[0])
    tile = _first_tile(sketch)
    limit = int(tile.attrs[1])
    bad = sketch.with_decision(tile, [1024 // (limit * 2), 1, 1, limit * 2], True)
    out = space_for_target(target).replay(mod, bad, seed=7)
    assert not out.ok and "max_innermost_factor" in out.error


def test_validator_flags_bad_categorical(target):
    mod = matmul(64)
    sketch = without_decisions(generate_design_space(mod, target)[0])
    cat = [i for i in sampling_instructions(sketch) if i.kind.name == "SampleCategorical"][0]
    out = space_for_target(target).replay(mod, sketch.with_decision(cat, 9, True), seed=7)
    assert not out.ok and "index" in out.error


def test_make_search_registry(target):
    assert "replay" in search_names()
    search = make_search("replay", matmul(32), target, seed=2)
    assert isinstance(search, SearchStrategy) and isinstance(search, ReplaySearch)
    with pytest.raises(RelaxTuneError, match="replay"):
        make_search("no-such-search", matmul(32), target)


def test_search_on_unschedulable_function_returns_it_once(target):
    from tvm.script import tirx as T

    @T.prim_func
    def plain(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i] * T.float32(2)

    search = ReplaySearch(normalize_mod(plain), target)
    first = search.next_candidates(5)
    assert len(first) == 1
    assert search.next_candidates(5) == []
