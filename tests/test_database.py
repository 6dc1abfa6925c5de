"""Tests for relax_tune.database: records, the MetaSchedule JSON layout in both directions,
tolerant loading, target filtering, the union/schedule-fn databases and module equality."""

from __future__ import annotations

import base64
import json
import logging
import os
import pathlib
import re
import struct
import time

import pytest
import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.s_tir import Schedule

from relax_tune.database import (
    Database,
    JSONDatabase,
    MemoryDatabase,
    ModuleEquality,
    OrderedUnionDatabase,
    ScheduleFnDatabase,
    TuningRecord,
    UnionDatabase,
    Workload,
    is_baseline,
)
from relax_tune.utils import (
    FAILED_RUN_SECS,
    RelaxTuneError,
    load_ir_json,
    normalize_mod,
    structural_hash,
    trace_to_json,
)

T_X86 = {"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}
T_SKX = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}


def matmul(n: int = 64, relu: bool = False) -> tirx.PrimFunc:
    """A te matmul (optionally followed by a ReLU block "D") as a bare PrimFunc."""
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    out = c
    if relu:
        out = te.compute((n, n), lambda i, j: te.max(c[i, j], tirx.const(0, "float32")), name="D")
    return te.create_prim_func([a, b, out])


def tile_trace(mod: tvm.IRModule, factors: tuple[int, int] = (8, 8),
               func_name: str = "main") -> list:
    """A small JSON trace: split C's j loop by a sampled perfect tile and vectorize it."""
    sch = Schedule(mod)
    block = sch.get_sblock("C", func_name)
    _, j, _ = sch.get_loops(block)
    outer, inner = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=64))
    sch.vectorize(inner)
    trace = trace_to_json(sch.trace)
    assert trace[1][0][0] == 2  # the SamplePerfectTile decision
    trace[1] = [[2, list(factors)]]
    return trace


def broken_trace() -> list:
    """A well-formed trace that does not replay (no block "nope")."""
    return [[["GetSBlock", [], ["nope", "main"], ["b0"]]], []]


@pytest.fixture(scope="module")
def mm() -> tvm.IRModule:
    return normalize_mod(matmul())


@pytest.fixture(scope="module")
def mm_relu() -> tvm.IRModule:
    return normalize_mod(matmul(relu=True))


@pytest.fixture(scope="module")
def mm32() -> tvm.IRModule:
    return normalize_mod(matmul(32))


def fill(db: Database, mod: tvm.IRModule, times: list[float | None],
         target: dict | None = T_X86) -> list[TuningRecord]:
    """Commit one record per entry of ``times`` (None = a failed candidate), distinct tiles."""
    workload = db.commit_workload(mod)
    extent = int(mod["main"].params[0].shape[0])
    tiles = [(extent // f, f) for f in (1, 2, 4, 8, 16, 32, 64) if extent % f == 0]
    records = []
    for secs, tile in zip(times, tiles):
        run_secs = [FAILED_RUN_SECS] if secs is None else [secs, secs]
        record = TuningRecord(tile_trace(mod, tile), workload, run_secs, target,
                              [["TENSOR", "float32", [extent, extent]]] * 3)
        db.commit_tuning_record(record)
        records.append(record)
    return records


def expected_mod(mod: tvm.IRModule, trace: list) -> tvm.IRModule:
    """The module ``trace`` produces on ``mod``."""
    sch = Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(trace, sch)
    return sch.mod


# ---------------------------------------------------------------------- records


def test_workload_json_is_length_prefixed_base64(mm):
    workload = Workload(mm)
    assert workload.shash == structural_hash(mm)
    shash, b64 = workload.as_json()
    assert shash == str(structural_hash(mm))
    raw = base64.b64decode(b64)
    (length,) = struct.unpack("<Q", raw[:8])
    assert length == len(raw) - 8 and raw[8:9] == b"{"
    back = Workload.from_json(json.loads(json.dumps(workload.as_json())))
    assert back.shash == workload.shash
    assert tvm_ffi.structural_equal(back.mod, mm)
    with pytest.raises(RelaxTuneError, match="length prefix"):
        Workload.from_json([shash, base64.b64encode(raw[:-10]).decode()])


def test_a_workload_of_this_tvm_loads_without_the_upgrade_pass(mm, monkeypatch):
    """A module this TVM wrote is read as it is (TVM's upgrade pass re-serialises every
    graph in Python, 8x the load); one stamped with another TVM version goes through it."""
    text = tvm.ir.save_json(mm)
    upgraded = []
    real_load_json = tvm.ir.load_json
    monkeypatch.setattr(tvm.ir, "load_json",
                        lambda t: upgraded.append(t) or real_load_json(t))
    assert tvm_ffi.structural_equal(load_ir_json(text), mm) and not upgraded
    older = text.replace(f'"tvm_version":"{tvm.__version__}"', '"tvm_version":"0.26.0"')
    assert older != text
    assert tvm_ffi.structural_equal(load_ir_json(older), mm) and upgraded == [older]
    shash, b64 = Workload(mm).as_json()
    assert tvm_ffi.structural_equal(Workload.from_json([shash, b64]).mod, mm)
    assert len(upgraded) == 1


def test_tuning_record_values(mm):
    workload = Workload(mm)
    trace = tile_trace(mm, (4, 16))
    record = TuningRecord(trace, workload, [1e-4, 3e-4], tvm.target.Target(T_X86))
    assert record.mean_run_secs == pytest.approx(2e-4) and record.is_valid
    assert record.target.kind.name == "llvm" and record.target_config["mcpu"] == "x86-64"
    assert [inst.kind.name for inst in record.trace.insts][-1] == "Vectorize"
    assert TuningRecord(trace, workload, [FAILED_RUN_SECS]).is_valid is False
    assert TuningRecord(trace, workload, None).mean_run_secs == FAILED_RUN_SECS
    assert TuningRecord(trace, workload, []).is_valid is False
    assert TuningRecord(trace, workload, [float("nan")]).run_secs == [FAILED_RUN_SECS]
    back = TuningRecord.from_json(json.loads(json.dumps(record.as_json())), workload)
    assert back.as_json() == record.as_json()
    assert back.target_config == record.target_config
    # a Trace object is accepted and converted
    sch = Schedule(mm)
    sch.get_sblock("C")
    assert TuningRecord(sch.trace, workload).trace_json[0][0][0] == "GetSBlock"
    with pytest.raises(RelaxTuneError, match="unknown kind"):
        TuningRecord.from_json([[[["NoSuchInst", [], [], []]], []], None, None, None], workload)
    with pytest.raises(RelaxTuneError, match="not a TVM target"):
        TuningRecord(trace, workload, [1.0], 42)


# ---------------------------------------------------------------------- JSON database


def test_json_round_trip_creates_work_dir(tmp_path, mm, mm32):
    work_dir = tmp_path / "a" / "b" / "logs"
    db = JSONDatabase(work_dir=work_dir)
    assert work_dir.is_dir() and len(db) == 0
    assert (work_dir / "database_workload.json").exists()
    assert (work_dir / "database_tuning_record.json").exists()
    fill(db, mm, [3e-4, None, 1e-4, 2e-4])
    fill(db, mm32, [5e-5, None])
    assert db.commit_workload(mm) is db.commit_workload(matmul())  # normalised, idempotent
    assert db.has_workload(matmul()) and not db.has_workload(matmul(16))

    lines = (work_dir / "database_workload.json").read_text().splitlines()
    assert len(lines) == 2
    record_lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    assert len(record_lines) == 6
    first = json.loads(record_lines[0])
    assert first[0] == 0 and len(first[1]) == 4 and first[1][2]["mcpu"] == "x86-64"
    assert json.loads(record_lines[1])[1][1] == [FAILED_RUN_SECS]

    again = JSONDatabase(work_dir=str(work_dir))
    assert len(again) == 6
    assert [r.as_json() for r in again.get_all_tuning_records()] == \
        [r.as_json() for r in db.get_all_tuning_records()]
    workload = again.commit_workload(mm)
    assert (work_dir / "database_workload.json").read_text().count("\n") == 2  # no new line
    top = again.get_top_k(workload, 10)
    assert [r.mean_run_secs for r in top] == pytest.approx([1e-4, 2e-4, 3e-4])
    assert [r.as_json() for r in top] == \
        [r.as_json() for r in db.get_top_k(db.commit_workload(mm), 10)]
    assert len(again.get_top_k(workload, 2)) == 2 and again.get_top_k(workload, 0) == []
    assert len(again.get_records(workload)) == 4  # failures included
    assert again.get_records(workload)[1].is_valid is False
    assert again.get_top_k(again.commit_workload(mm32), 5)[0].mean_run_secs == \
        pytest.approx(5e-5)

    sch = again.query_schedule(matmul(), T_X86)
    assert tvm_ffi.structural_equal(sch.mod, expected_mod(mm, top[0].trace_json))
    assert again.query(mm, T_X86, kind="record").as_json() == top[0].as_json()
    assert tvm_ffi.structural_equal(again.query(mm, T_X86, kind="ir_module"), sch.mod)
    assert again.query(matmul(16), T_X86) is None
    with pytest.raises(RelaxTuneError, match="unknown query kind"):
        again.query(mm, T_X86, kind="nope")


def test_metaschedule_reads_our_files(tmp_path, mm, mm32):
    from tvm.s_tir import meta_schedule as ms

    ours = JSONDatabase(work_dir=tmp_path)
    fill(ours, mm, [3e-4, None, 1e-4])
    fill(ours, mm32, [7e-5], target=None)
    ours.commit_tuning_record(TuningRecord([[], []], Workload(mm32), [9e-5]))  # empty trace
    theirs = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(theirs) == 5
    other = theirs.query_tuning_record(mm32, tvm.target.Target(T_SKX), "main")
    assert other.target is None and float(other.run_secs[0]) == pytest.approx(7e-5)
    target = tvm.target.Target(T_X86)
    record = theirs.query_tuning_record(mm, target, "main")
    assert record is not None
    assert [float(s) for s in record.run_secs] == pytest.approx([1e-4, 1e-4])
    assert str(record.target.kind.name) == "llvm"
    top = theirs.get_top_k(theirs.commit_workload(mm), 5)
    assert [float(r.run_secs[0]) for r in top] == pytest.approx([1e-4, 3e-4])
    ms_sch = theirs.query_schedule(mm, target, "main")
    our_sch = ours.query_schedule(mm, target)
    assert tvm_ffi.structural_equal(ms_sch.mod, our_sch.mod)
    assert (tmp_path / "database_workload.json").read_text().count("\n") == 2


def test_we_read_metaschedule_files(tmp_path, mm):
    from tvm.s_tir import meta_schedule as ms

    theirs = ms.database.JSONDatabase(work_dir=str(tmp_path))
    target = tvm.target.Target(T_X86)
    args = ms.arg_info.ArgInfo.from_prim_func(mm["main"])
    workload = theirs.commit_workload(mm)
    for factors, secs in (((4, 16), [2e-4]), ((8, 8), [1e-4]), ((2, 32), [FAILED_RUN_SECS])):
        sch = Schedule(mm)
        block = sch.get_sblock("C")
        _, j, _ = sch.get_loops(block)
        tile = sch.sample_perfect_tile(j, n=2, max_innermost_factor=64, decision=list(factors))
        _, inner = sch.split(j, tile)
        sch.vectorize(inner)
        theirs.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, secs, target, args))
    ms_best = theirs.query_schedule(mm, target, "main")

    ours = JSONDatabase(work_dir=tmp_path)
    assert len(ours) == 3
    record = ours.query_tuning_record(matmul(), T_X86)
    assert record.run_secs == pytest.approx([1e-4])
    assert record.target_config["keys"] == ["cpu"]
    assert record.args_info == [["TENSOR", "float32", [64, 64]]] * 3
    assert tvm_ffi.structural_equal(ours.query_schedule(mm, T_X86).mod, ms_best.mod)
    assert [r.is_valid for r in ours.get_all_tuning_records()].count(False) == 1

    # our appends to their files stay readable by both
    fill(ours, mm, [5e-5])
    assert ours.query_tuning_record(mm, T_X86).run_secs == pytest.approx([5e-5, 5e-5])
    reloaded = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(reloaded) == 4
    assert float(reloaded.query_tuning_record(mm, target, "main").run_secs[0]) == \
        pytest.approx(5e-5)


def test_corrupt_and_truncated_lines_are_skipped(tmp_path, mm, caplog):
    db = JSONDatabase(work_dir=tmp_path)
    fill(db, mm, [3e-4, 2e-4, 1e-4])
    path = tmp_path / "database_tuning_record.json"
    good = path.read_text().splitlines()
    torn = good[2][: len(good[2]) // 2]
    damaged = "\n".join([good[0], "garbage {", "[7," + good[1][3:], good[1], torn])
    path.write_text(damaged)  # the last line lacks its newline: a torn write

    caplog.set_level(logging.WARNING, logger="relax_tune.database")
    loaded = JSONDatabase(work_dir=tmp_path)
    assert len(loaded) == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "relax_tune.database"]
    assert len(messages) == 3
    for lineno, message in zip((2, 3, 5), messages):
        assert str(path) in message and f"line {lineno}:" in message
    assert "workload index 7" in messages[1]
    assert loaded.query_tuning_record(mm, T_X86).mean_run_secs == pytest.approx(2e-4)

    # appending after a torn line starts a new line and never rewrites what was there
    fill(loaded, mm, [5e-5])
    text = path.read_text()
    assert text.startswith(damaged + "\n") and text.endswith("\n")
    caplog.clear()
    reloaded = JSONDatabase(work_dir=tmp_path)
    assert len(reloaded) == 3
    assert reloaded.query_tuning_record(mm, T_X86).mean_run_secs == pytest.approx(5e-5)
    assert len([r for r in caplog.records if r.name == "relax_tune.database"]) == 3


def test_bad_workload_line_skips_its_records(tmp_path, mm, mm32, caplog):
    db = JSONDatabase(work_dir=tmp_path)
    fill(db, mm, [1e-4])
    fill(db, mm32, [2e-4])
    path = tmp_path / "database_workload.json"
    lines = path.read_text().splitlines()
    path.write_text(json.dumps(["123", "bm90IGEgbW9kdWxl"]) + "\n" + lines[1] + "\n")
    caplog.set_level(logging.WARNING, logger="relax_tune.database")
    loaded = JSONDatabase(work_dir=tmp_path)
    assert len(loaded) == 1 and loaded.has_workload(mm32) and not loaded.has_workload(mm)
    messages = [r.getMessage() for r in caplog.records if r.name == "relax_tune.database"]
    assert f"{path}, line 1:" in messages[0]
    assert "line 1 of" in messages[1] and "was skipped" in messages[1]
    # a re-committed workload gets a new index after the bad line
    fill(loaded, mm, [3e-4])
    assert len(JSONDatabase(work_dir=tmp_path)) == 2


def test_bad_paths_give_clear_errors(tmp_path):
    afile = tmp_path / "notadir"
    afile.write_text("x")
    with pytest.raises(RelaxTuneError, match="notadir.*existing file"):
        JSONDatabase(work_dir=afile)
    with pytest.raises(RelaxTuneError, match="notadir"):
        JSONDatabase(work_dir=afile / "sub")
    with pytest.raises(RelaxTuneError, match="work_dir=.*path_workload"):
        JSONDatabase()
    with pytest.raises(RelaxTuneError, match="allow_missing"):
        JSONDatabase(work_dir=tmp_path / "new", allow_missing=False)
    with pytest.raises(RelaxTuneError, match="unknown module_equality"):
        JSONDatabase(work_dir=tmp_path / "x", module_equality="exact")
    db = JSONDatabase(str(tmp_path / "w.json"), str(tmp_path / "deep" / "r.json"))
    assert os.path.exists(db.path_tuning_record)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_files_load_but_refuse_commits(tmp_path, mm):
    [record] = fill(JSONDatabase(work_dir=tmp_path), mm, [1e-4])
    for name in ("database_workload.json", "database_tuning_record.json"):
        (tmp_path / name).chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        db = JSONDatabase(work_dir=tmp_path)
        assert db.read_only
        assert tvm_ffi.structural_equal(db.query_schedule(mm, T_X86).mod,
                                        expected_mod(mm, record.trace_json))
        with pytest.raises(RelaxTuneError, match="read-only"):
            fill(db, mm, [1e-5])
        with pytest.raises(RelaxTuneError, match="cannot create"):
            JSONDatabase(work_dir=tmp_path / "sub")
    finally:
        tmp_path.chmod(0o755)


def test_loading_many_records_is_fast(tmp_path, mm):
    fill(JSONDatabase(work_dir=tmp_path), mm, [1e-4])
    path = tmp_path / "database_tuning_record.json"
    line = path.read_text()
    path.write_text(line * 3000)
    start = time.perf_counter()
    db = JSONDatabase(work_dir=tmp_path)
    assert len(db) == 3000
    assert time.perf_counter() - start < 5.0


# ---------------------------------------------------------------------- queries


def test_queries_filter_by_target(mm):
    db = MemoryDatabase()
    fill(db, mm, [1e-4], target=T_X86)
    fill(db, mm, [None, 2e-4], target=T_SKX)
    fill(db, mm, [None, None, 3e-4], target=None)
    workload = db.commit_workload(mm)
    assert db.query_tuning_record(mm, T_X86).target_config["mcpu"] == "x86-64"
    assert db.query_tuning_record(mm, tvm.target.Target(T_SKX)).target_config["mcpu"] == \
        "skylake-avx512"
    assert db.query_tuning_record(mm, {"kind": "llvm", "mcpu": "znver4"}).target is None
    assert db.query_tuning_record(mm, "llvm").mean_run_secs == pytest.approx(1e-4)
    assert db.query_tuning_record(mm, {"kind": "c"}).target is None
    assert [r.mean_run_secs for r in db.get_top_k(workload, 5, T_SKX)] == \
        pytest.approx([2e-4, 3e-4])
    assert len(db.get_top_k(workload, 5)) == 3
    with tvm.target.Target(T_SKX):
        assert db.query_tuning_record(mm).target_config["mcpu"] == "skylake-avx512"
    assert db.query_tuning_record(mm).mean_run_secs == pytest.approx(1e-4)  # no scope: any


def test_query_normalises_the_function(mm):
    db = MemoryDatabase()
    [record] = fill(db, mm, [1e-4])
    bare = matmul()
    assert db.has_workload(bare)
    for func in (bare, bare.with_attr("global_symbol", "main"), tvm.IRModule({"main": bare})):
        sch = db.query_schedule(func, T_X86)
        assert sch is not None
        assert tvm_ffi.structural_equal(sch.mod, expected_mod(mm, record.trace_json))


def test_query_skips_records_that_do_not_replay(mm, caplog):
    db = MemoryDatabase()
    workload = db.commit_workload(mm)
    db.commit_tuning_record(TuningRecord(broken_trace(), workload, [1e-6], T_X86))
    [good] = fill(db, mm, [1e-4])
    caplog.set_level(logging.WARNING, logger="relax_tune.database")
    assert db.query_tuning_record(mm, T_X86).as_json() == good.as_json()
    sch = db.query_schedule(mm, T_X86)
    assert tvm_ffi.structural_equal(sch.mod, expected_mod(mm, good.trace_json))
    warnings = [r.getMessage() for r in caplog.records if r.name == "relax_tune.database"]
    assert len(warnings) == 1 and str(workload.shash) in warnings[0]  # warned once
    assert len(db.get_top_k(workload, 5)) == 2  # the record itself is kept
    with pytest.raises(RelaxTuneError, match="does not replay"):
        db.get_top_k(workload, 1)[0].trace


# ---------------------------------------------------------------------- combinations


def test_union_and_ordered_union(tmp_path, mm, mm32):
    slow, fast, empty = MemoryDatabase(), JSONDatabase(work_dir=tmp_path), MemoryDatabase()
    fill(slow, mm, [2e-4])
    fill(slow, mm32, [1e-5])
    fill(fast, mm, [1e-4, 3e-4])
    union = UnionDatabase(slow, fast)
    assert union.query_tuning_record(mm, T_X86).mean_run_secs == pytest.approx(1e-4)
    assert union.query_tuning_record(mm32, T_X86).mean_run_secs == pytest.approx(1e-5)
    assert [r.mean_run_secs for r in union.get_top_k(Workload(mm), 2)] == \
        pytest.approx([1e-4, 2e-4])
    assert len(union) == 4 and len(union.get_all_tuning_records()) == 4
    assert union.has_workload(mm32) and not union.has_workload(matmul(16))
    ordered = OrderedUnionDatabase(empty, slow, fast)
    assert ordered.query_tuning_record(mm, T_X86).mean_run_secs == pytest.approx(2e-4)
    assert OrderedUnionDatabase(empty, fast, slow).query_tuning_record(mm32, T_X86) \
        .mean_run_secs == pytest.approx(1e-5)
    assert ordered.get_top_k(Workload(mm), 5)[0].mean_run_secs == pytest.approx(2e-4)
    assert ordered.query_schedule(matmul(16), T_X86) is None
    for combined in (union, ordered):
        with pytest.raises(RelaxTuneError, match="read-only"):
            combined.commit_workload(mm)
    with pytest.raises(RelaxTuneError, match="relax_tune databases"):
        UnionDatabase(slow, object())


def test_union_of_an_ordered_union_takes_the_better_of_their_answers(mm):
    """MetaSchedule's mix-use case: UnionDatabase(db3, OrderedUnionDatabase(db1, db2)) returns
    the better of db3's record and the ordered union's, which is db1's even though db2 holds a
    faster one. Queries and get_top_k agree."""
    db1, db2 = MemoryDatabase(), MemoryDatabase()
    [r1] = fill(db1, mm, [3e-4])  # tile (64, 1)
    fill(db2, mm, [None, None, 1e-5])  # tile (16, 4): fastest of all, but shadowed by db1
    r2 = db2.get_top_k(Workload(mm), 1)[0]
    ordered = OrderedUnionDatabase(db1, db2)
    for db3_times, expected in (([None, 2e-4], "db3"), ([None, 5e-4], "db1"), ([], "db1")):
        db3 = MemoryDatabase()
        fill(db3, mm, db3_times)  # tile (32, 2) when present
        r3 = db3.get_top_k(Workload(mm), 1)
        best = r3[0] if expected == "db3" else r1
        nested = UnionDatabase(db3, ordered)
        assert nested.query_tuning_record(mm, T_X86).as_json() == best.as_json()
        assert nested.query(mm, T_X86, kind="record").mean_run_secs == best.mean_run_secs
        want = expected_mod(mm, best.trace_json)
        assert tvm_ffi.structural_equal(nested.query_schedule(mm, T_X86).mod, want)
        assert tvm_ffi.structural_equal(nested.query_ir_module(matmul(), T_X86), want)
        top = nested.get_top_k(Workload(mm), 5)
        assert top[0].as_json() == best.as_json()
        assert [r.as_json() for r in top] == [r.as_json() for r in
                                              sorted(r3 + [r1], key=lambda r: r.mean_run_secs)]
        assert r2.as_json() not in [r.as_json() for r in top]  # db2 never answers
        assert nested.get_top_k(Workload(mm), 1, T_X86)[0].as_json() == best.as_json()
    # the other way round (Case 5): an ordered union whose member is a union
    outer = OrderedUnionDatabase(MemoryDatabase(), UnionDatabase(db1, db2), db1)
    assert outer.query_tuning_record(mm, T_X86).as_json() == r2.as_json()
    assert outer.get_top_k(Workload(mm), 1)[0].as_json() == r2.as_json()
    # a schedule function's answer has no run time: any measured answer beats it
    unroll = ScheduleFnDatabase(lambda sch: sch.unroll(sch.get_loops(sch.get_sblock("C"))[2])
                                is None)
    assert UnionDatabase(unroll, db1).query_tuning_record(mm, T_X86).as_json() == r1.as_json()
    alone = UnionDatabase(unroll, MemoryDatabase()).query_schedule(mm, T_X86)
    assert alone.trace.insts[-1].kind.name == "Unroll"


class ListDatabase(Database):
    """A database written against MetaSchedule's contract only: records in a list,
    ``get_top_k(workload, top_k)`` without a target, no ``get_records``, and it does not even
    call ``Database.__init__``."""

    def __init__(self) -> None:
        self.workloads: list[Workload] = []
        self.records: list[TuningRecord] = []

    def has_workload(self, mod):
        return any(tvm_ffi.structural_equal(w.mod, mod) for w in self.workloads)

    def commit_workload(self, mod):
        for workload in self.workloads:
            if tvm_ffi.structural_equal(workload.mod, mod):
                return workload
        self.workloads.append(Workload(mod))
        return self.workloads[-1]

    def commit_tuning_record(self, record):
        self.records.append(record)

    def get_top_k(self, workload, top_k):
        mine = [r for r in self.records
                if tvm_ffi.structural_equal(r.workload.mod, workload.mod) and r.is_valid]
        return sorted(mine, key=lambda r: r.mean_run_secs)[:top_k]

    def get_all_tuning_records(self):
        return list(self.records)

    def __len__(self):
        return len(self.records)


def test_metaschedule_style_subclass_answers_for_its_own_modules(mm):
    raw = tvm.IRModule({"dense": matmul().with_attr("global_symbol", "dense")})
    assert not tvm_ffi.structural_equal(raw, mm)  # not as relax_tune normalises it
    db = ListDatabase()
    workload = db.commit_workload(raw)
    x86 = TuningRecord(tile_trace(raw, (16, 4), "dense"), workload, [1e-4], T_X86)
    anywhere = TuningRecord(tile_trace(raw, (8, 8), "dense"), workload, [2e-4], None)
    failed = TuningRecord(tile_trace(raw, (4, 16), "dense"), workload, [FAILED_RUN_SECS],
                          T_X86)
    for record in (failed, x86, anywhere):
        db.commit_tuning_record(record)
    assert db.has_workload(raw) and db.module_equality == "structural"
    assert db.query_tuning_record(raw, T_X86) is x86
    assert db.query_tuning_record(raw, T_SKX) is anywhere  # target filtered by relax_tune
    assert tvm_ffi.structural_equal(db.query_schedule(raw, T_X86).mod,
                                    expected_mod(raw, x86.trace_json))
    assert db.query_tuning_record(matmul(32), T_X86) is None
    assert db.get_records(workload) == [failed, x86, anywhere]
    assert db.get_records(Workload(matmul(32).with_attr("global_symbol", "main"))) == []
    assert db.get_all_workloads() == [workload]
    assert UnionDatabase(db, MemoryDatabase()).get_top_k(workload, 5, T_SKX) == [anywhere]
    assert OrderedUnionDatabase(MemoryDatabase(), db).query_tuning_record(raw, T_X86) is x86
    pruned = MemoryDatabase()
    db.dump_pruned(pruned)
    assert [r.mean_run_secs for r in pruned.get_all_tuning_records()] == [1e-4]


def test_metaschedule_style_subclass_tunes_and_applies(tmp_path, target):
    from relax_tune.transform import ApplyDatabase
    from relax_tune.tuning.tune import tune_tir

    func = matmul(16)
    db = ListDatabase()
    out = tune_tir(func, target, work_dir=str(tmp_path), max_trials_global=2, database=db,
                   progress_bar=False, num_trials_per_iter=2)
    assert out is db
    assert len(db) == 3  # the untuned baseline and the two trials
    assert [is_baseline(r) for r in db.records].count(True) == 1
    assert len(db.workloads) == 1 and db.has_workload(db.workloads[0].mod)
    assert all(r.workload is db.workloads[0] for r in db.records)
    assert not (tmp_path / "database_tuning_record.json").exists()  # nothing bypassed `db`
    (best,) = db.get_top_k(db.workloads[0], 1)
    apply = ApplyDatabase(database=db)
    with target:
        applied = apply(tvm.IRModule({"main": func}))
    if is_baseline(best):  # no trial beat the untuned function: it stays
        assert apply.kept == ["main"] and apply.applied == []
        assert tvm_ffi.structural_equal(applied["main"], func)
    else:
        assert apply.applied == ["main"] and applied["main"].attrs["tirx.is_scheduled"]
        assert tvm_ffi.structural_equal(applied["main"].body,
                                        expected_mod(best.workload.mod,
                                                     best.trace_json)["main"].body)


class DuckTensorInfo:
    """Looks like MetaSchedule's TensorInfo: an ``as_json()`` giving ["TENSOR", dtype, shape]."""

    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = dtype, shape

    def as_json(self) -> list:
        return ["TENSOR", self.dtype, list(self.shape)]


def test_tuning_record_converts_arg_info_objects(tmp_path, mm):
    db = JSONDatabase(work_dir=tmp_path)
    workload = db.commit_workload(mm)
    plain = [["TENSOR", "float32", [64, 64]]] * 3
    record = TuningRecord(tile_trace(mm), workload, [1e-4], T_X86,
                          [DuckTensorInfo("float32", (64, 64))] * 3)
    assert record.args_info == plain and record.as_json()[3] == plain
    db.commit_tuning_record(record)
    mixed = TuningRecord(tile_trace(mm, (4, 16)), workload, [2e-4], T_X86,
                         (DuckTensorInfo("float32", (64, 64)), ("TENSOR", "float32", (64, 64))))
    assert mixed.args_info == plain[:2]
    assert [r.args_info for r in JSONDatabase(work_dir=tmp_path).get_all_tuning_records()] == \
        [plain]
    for bad in ([object()], [3], "TENSOR", 7, [DuckTensorInfo("float32", None)]):
        with pytest.raises(RelaxTuneError, match="args_info"):
            TuningRecord(tile_trace(mm), workload, [1e-4], T_X86, bad)
    try:
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo, TensorInfo
    except ImportError:
        return
    real = TuningRecord(tile_trace(mm), workload, [1e-4], T_X86,
                        [TensorInfo("float32", [64, 64])] * 3)
    assert real.args_info == plain
    assert TuningRecord(tile_trace(mm), workload, [1e-4], T_X86,
                        ArgInfo.from_prim_func(mm["main"])).args_info == plain
    db.commit_tuning_record(real)
    assert len(JSONDatabase(work_dir=tmp_path)) == 2


def test_schedule_fn_database(mm, caplog):
    seen = []

    def vectorize_inner(sch: Schedule) -> bool:
        seen.append(str(sch.mod.attrs["task_name"]))
        if seen[-1] != "matmul":
            return False
        _, _, k = sch.get_loops(sch.get_sblock("C"))
        sch.unroll(k)
        return True

    db = ScheduleFnDatabase(vectorize_inner)
    sch = db.query_schedule(matmul(), T_X86, "matmul")
    assert sch.trace.insts[-1].kind.name == "Unroll"
    assert db.query_schedule(mm, T_X86, "other") is None
    assert seen == ["matmul", "other"]
    record = db.query(mm, T_X86, "matmul", kind="record")
    assert record.trace_json[0][-1][0] == "Unroll" and record.run_secs is None
    assert len(db) == 0 and not db.has_workload(mm)

    tuned = MemoryDatabase()
    fill(tuned, mm, [1e-4])
    first = OrderedUnionDatabase(db, tuned)
    assert first.query_schedule(mm, T_X86, "matmul").trace.insts[-1].kind.name == "Unroll"
    assert first.query_schedule(mm, T_X86, "other").trace.insts[-1].kind.name == "Vectorize"

    def boom(sch: Schedule) -> bool:
        raise ValueError("hand-written schedule is broken")

    caplog.set_level(logging.WARNING, logger="relax_tune.database")
    assert ScheduleFnDatabase(boom).query_schedule(mm, T_X86) is None
    assert "hand-written schedule is broken" in caplog.text
    assert isinstance(Database.create(vectorize_inner), ScheduleFnDatabase)
    assert isinstance(Database.create("memory"), MemoryDatabase)
    with pytest.raises(RelaxTuneError, match="unknown database kind"):
        Database.create("sqlite")


def test_with_database_is_current():
    outer, inner = MemoryDatabase(), MemoryDatabase()
    assert Database.current() is None
    with outer as entered:
        assert entered is outer and Database.current() is outer
        with inner:
            assert Database.current() is inner
        assert Database.current() is outer
    assert Database.current() is None


def test_dump_pruned_keeps_the_best_record_per_workload(tmp_path, mm, mm32, mm_relu):
    src = MemoryDatabase()
    fill(src, mm, [3e-4, 1e-4, None, 2e-4])
    fill(src, mm32, [None, 4e-5, 5e-5])
    src.commit_workload(mm_relu)
    fill(src, mm_relu, [None])
    dst = JSONDatabase(work_dir=tmp_path / "pruned")
    src.dump_pruned(dst)
    assert [r.mean_run_secs for r in dst.get_all_tuning_records()] == pytest.approx([1e-4, 4e-5])
    reloaded = JSONDatabase(work_dir=tmp_path / "pruned")
    assert len(reloaded) == 2 and not reloaded.has_workload(mm_relu)
    assert reloaded.query_tuning_record(mm32, T_X86).mean_run_secs == pytest.approx(4e-5)


# ---------------------------------------------------------------------- module equality


def test_module_equality_variants(tmp_path, mm, mm_relu):
    assert ModuleEquality("ignore-ndarray").name == "ignore-tensor"
    for name in ("structural", "ignore-tensor", "anchor-block"):
        eq = ModuleEquality(name)
        assert eq.equal(mm, normalize_mod(matmul())) and eq.hash(mm) == eq.hash(
            normalize_mod(matmul()))
    assert not ModuleEquality("structural").equal(mm, mm_relu)
    assert ModuleEquality("anchor-block").equal(mm, mm_relu)
    assert ModuleEquality("anchor-block").hash(mm) == ModuleEquality("anchor-block").hash(mm_relu)

    structural = MemoryDatabase()
    fill(structural, mm, [1e-4])
    assert not structural.has_workload(mm_relu)
    assert structural.query_schedule(mm_relu, T_X86) is None

    anchor = JSONDatabase(work_dir=tmp_path, module_equality="anchor-block")
    [record] = fill(anchor, mm, [1e-4])
    assert anchor.has_workload(mm_relu)
    sch = anchor.query_schedule(mm_relu, T_X86)  # the matmul trace replayed on matmul+relu
    assert sch is not None and sch.get_sblock("D") is not None
    assert tvm_ffi.structural_equal(sch.mod, expected_mod(mm_relu, record.trace_json))
    # a record made on the relu module keeps its own module (a second workload line)
    relu_record = TuningRecord(tile_trace(mm_relu, (4, 16)), Workload(mm_relu), [5e-5], T_X86)
    anchor.commit_tuning_record(relu_record)
    assert (tmp_path / "database_workload.json").read_text().count("\n") == 2
    reloaded = JSONDatabase(work_dir=tmp_path, module_equality="anchor-block")
    best = reloaded.query_tuning_record(mm, T_X86)
    assert best.mean_run_secs == pytest.approx(5e-5)
    assert tvm_ffi.structural_equal(best.workload.mod, mm_relu)
    assert best.trace_json == relu_record.trace_json
    assert tvm_ffi.structural_equal(  # the relu trace fits block C of mm
        reloaded.query_schedule(mm, T_X86).mod, expected_mod(mm, relu_record.trace_json))
    assert len(reloaded.get_all_workloads()) == 2
    assert len(reloaded.get_records(reloaded.commit_workload(mm))) == 2


def test_package_does_not_import_metaschedule():
    root = pathlib.Path(__file__).resolve().parents[1] / "relax_tune" / "database"
    pattern = re.compile(r"^\s*(from|import)\s+\S*meta_schedule|import_module\(.*meta_schedule",
                         re.MULTILINE)
    for path in root.glob("*.py"):
        assert not pattern.search(path.read_text()), path


def test_ignore_tensor_matches_modules_differing_in_tensor_contents(tmp_path):
    import numpy as np

    func = matmul()
    ones = normalize_mod(func.with_attr("weights", tvm.runtime.tensor(np.ones(4, "float32"))))
    zeros = normalize_mod(func.with_attr("weights", tvm.runtime.tensor(np.zeros(4, "float32"))))
    assert structural_hash(ones) != structural_hash(zeros)
    db = JSONDatabase(work_dir=tmp_path, module_equality="ignore-tensor")
    [record] = fill(db, ones, [1e-4])
    assert not MemoryDatabase().has_workload(zeros)
    reloaded = JSONDatabase(work_dir=tmp_path, module_equality="ignore-tensor")
    assert reloaded.has_workload(zeros)
    sch = reloaded.query_schedule(zeros, T_X86)
    assert tvm_ffi.structural_equal(sch.mod, expected_mod(zeros, record.trace_json))
    assert not JSONDatabase(work_dir=tmp_path).has_workload(zeros)  # structural: no match


def test_two_writers_on_one_work_dir_keep_indices_apart(tmp_path, mm, mm32):
    first = JSONDatabase(work_dir=tmp_path)
    second = JSONDatabase(work_dir=tmp_path)  # opened before `first` commits anything
    fill(first, mm, [1e-4])
    fill(second, mm32, [2e-4])  # must become workload line 2, not a second "line 1"
    fill(second, mm, [5e-5])  # mm is known to `second` after catching up: no new line
    assert (tmp_path / "database_workload.json").read_text().count("\n") == 2
    assert len(second) == 3 and len(first) == 1
    first.refresh()
    assert len(first) == 3
    assert first.query_tuning_record(mm, T_X86).mean_run_secs == pytest.approx(5e-5)
    reloaded = JSONDatabase(work_dir=tmp_path)
    assert reloaded.query_tuning_record(mm32, T_X86).mean_run_secs == pytest.approx(2e-4)
    assert [json.loads(line)[0] for line in
            (tmp_path / "database_tuning_record.json").read_text().splitlines()] == [0, 1, 0]
