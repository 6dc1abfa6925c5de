"""relax_tune.report and relax_tune.db_tools: summaries, curves, plots, summary files, prune,
merge, export; on records written by hand (exact figures) and by a real tuning run."""

import csv
import json
import os
import struct
import zlib

import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

from relax_tune import report
from relax_tune.database import JSONDatabase, TuningRecord
from relax_tune.cli.db_tools import export_database, merge_databases, prune_database
from relax_tune.work_dir import TASK_META_FILE, WorkDir
from relax_tune.tuning.extract import extract_tasks
from relax_tune.database import BASELINE_TRACE
from relax_tune.tuning.tune import tune_tasks
from relax_tune.utils import FAILED_RUN_SECS, RelaxTuneError, normalize_mod, trace_to_json


def _matmul_relu(n: int = 32) -> tvm.IRModule:
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((n, n), lambda i, j: te.max(c[i, j], tvm.tirx.const(0, "float32")), name="T_relu")
    return normalize_mod(te.create_prim_func([a, b, d]))


def _traces(mod: tvm.IRModule, count: int) -> list[list]:
    """``count`` distinct real traces (different split factors of C's inner loop)."""
    out = []
    for factor in (1, 2, 4, 8, 16, 32)[:count]:
        sch = Schedule(mod)
        _, j, _ = sch.get_loops(sch.get_sblock("C"))
        sch.split(j, [None, factor])
        out.append(trace_to_json(sch.trace))
    return out


def check_png(path: str) -> tuple[int, int]:
    """Assert ``path`` is a complete PNG (signature, IHDR, CRCs, IEND); return (width, height)."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} lacks the PNG signature"
    pos, chunks, size = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        chunks.append(kind)
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    return size


@pytest.fixture
def handmade(tmp_path, target):
    """A work_dir with one workload: baseline 100 us, then trials 50, failed, 80, 20, 30 us."""
    mod = _matmul_relu()
    db = JSONDatabase(work_dir=str(tmp_path / "wd"))
    wl = db.commit_workload(mod)
    traces = _traces(mod, 5)
    secs = [50e-6, None, 80e-6, 20e-6, 30e-6]
    db.commit_tuning_record(TuningRecord(BASELINE_TRACE, wl, [100e-6], target))
    for trace, sec in zip(traces, secs):
        db.commit_tuning_record(TuningRecord(trace, wl, [FAILED_RUN_SECS] if sec is None
                                             else [sec, sec], target))
    return str(tmp_path / "wd"), mod


def test_summary_curve_follows_trial_order(handmade):
    work_dir, mod = handmade
    (s,) = report.summarize(JSONDatabase(work_dir=work_dir))
    assert s.trials == 5 and s.failures == 1
    assert s.baseline_secs == pytest.approx(100e-6)
    assert s.best_secs == pytest.approx(20e-6)
    assert s.curve == pytest.approx([50e-6, 50e-6, 50e-6, 20e-6, 20e-6])
    assert s.trial_secs[1] is None and s.trial_secs[3] == pytest.approx(20e-6)
    assert s.speedup == pytest.approx(5.0)
    assert s.shape == "32x32" and s.weight is None and s.effective_weight == 1
    assert s.best_record is not None and "split" in report.best_schedule_text(s)
    assert s.targets == [report.short_target(s.best_record.target_config)]


def test_workload_name_from_blocks():
    mod = _matmul_relu()
    assert report.block_names(mod) == ["C", "T_relu"]
    assert report.workload_name(mod) == "C_relu"


def test_task_meta_gives_names_and_weights(handmade, target):
    work_dir, mod = handmade
    task = extract_tasks(mod, target)[0]
    task.task_name, task.weight = "my_matmul", 3
    wd = WorkDir.of(work_dir)
    path = wd.write_task_meta([task])
    assert os.path.basename(path) == TASK_META_FILE
    (s,) = report.summarize(JSONDatabase(work_dir=work_dir), wd.read_task_meta())
    assert (s.name, s.weight) == ("my_matmul", 3)
    untuned, tuned = report.end_to_end([s])
    assert tuned == pytest.approx(3 * 20e-6) and untuned == pytest.approx(3 * 100e-6)
    text = report.format_table([s])
    assert "my_matmul" in text and "60.00 us tuned" in text and "weights from tasks.json" in text


def test_tuning_table_of_a_session(target):
    """A session's TaskReports (relax_tune.tuning.state) and the tuning table the bar and the
    CLI print: what is applied, the weighted latencies and their sum."""
    import relax_tune
    from relax_tune.tuning.progress import format_tuning_table
    from relax_tune.tuning.state import TaskReport

    assert relax_tune.TaskReport is TaskReport
    task = extract_tasks(_matmul_relu(), target)[0]
    task.weight = 2
    tuned = TaskReport(task, trials=5, failures=1, best_secs=20e-6,
                       baseline_secs=100e-6, status="budget")
    slower = TaskReport(task, trials=3, best_secs=150e-6, baseline_secs=100e-6,
                        status="converged")
    assert tuned.applied_secs == pytest.approx(20e-6) and tuned.tuned_applied
    assert tuned.speedup == pytest.approx(5.0)
    assert slower.applied_secs == pytest.approx(100e-6) and not slower.tuned_applied
    assert slower.speedup == pytest.approx(1.0)
    lines = format_tuning_table([tuned, slower]).splitlines()
    assert len(lines) == 5
    assert lines[2].split()[4:] == [f"{tuned.gflops:.2f}", "100.00", "20.00", "40.00", "5",
                                    "tuned", "budget"]
    assert lines[3].split()[4:] == [f"{slower.gflops:.2f}", "100.00", "150.00", "200.00", "3",
                                    "untuned", "converged"]
    assert lines[4].endswith(": 240.00 us")


def test_write_report_files(handmade):
    pytest.importorskip("matplotlib")
    work_dir, _ = handmade
    files = report.write_report(work_dir, html_too=True)
    names = sorted(os.path.basename(p) for p in files.plots)
    assert names == ["curve_0_C_relu.png", "curves.png"]
    for path in files.plots:
        width, height = check_png(path)
        assert width >= 300 and height >= 200
    md = open(files.summary[0], encoding="utf-8").read()
    assert "| 0 | C_relu | 32x32 | ? | 5 | 1 | 100.00 | 20.00 | 5.00x" in md
    assert "weights unknown" in md and "(curve_0_C_relu.png)" in md and "sch.split" in md
    page = open(files.summary[1], encoding="utf-8").read()
    assert page.startswith("<!doctype html>") and "curves.png" in page


def test_report_without_matplotlib_still_writes_summary(handmade, monkeypatch):
    work_dir, _ = handmade
    monkeypatch.setattr(report, "_pyplot", lambda: None)
    files = report.write_report(work_dir, out_dir=os.path.join(work_dir, "r2"))
    assert files.plots == [] and os.path.isfile(files.summary[0])
    assert "![" not in open(files.summary[0], encoding="utf-8").read()


def test_report_on_missing_work_dir_is_a_clear_error(tmp_path):
    with pytest.raises(RelaxTuneError, match="holds no tuning database"):
        report.write_report(str(tmp_path / "nothing"))


def test_prune_keeps_top_k_and_baseline(handmade, tmp_path):
    work_dir, _ = handmade
    src = JSONDatabase(work_dir=work_dir)
    dest = JSONDatabase(work_dir=str(tmp_path / "pruned"))
    assert prune_database(src, dest, top_k=2) == 3
    kept = sorted(r.mean_run_secs for r in dest.get_all_tuning_records())
    assert kept == pytest.approx([20e-6, 30e-6, 100e-6])
    (s,) = report.summarize(JSONDatabase(work_dir=str(tmp_path / "pruned")))
    assert s.baseline_secs == pytest.approx(100e-6) and s.best_secs == pytest.approx(20e-6)


def test_merge_skips_records_already_there(handmade, tmp_path):
    work_dir, _ = handmade
    src = JSONDatabase(work_dir=work_dir)
    pruned = JSONDatabase(work_dir=str(tmp_path / "pruned"))
    prune_database(src, pruned, top_k=1)
    merged = JSONDatabase(work_dir=str(tmp_path / "merged"))
    assert merge_databases([pruned, src], merged) == 6  # 2 from pruned + 4 new from src
    assert merge_databases([src], merged) == 0
    assert len(JSONDatabase(work_dir=str(tmp_path / "merged"))) == 6


def test_export_json_and_csv(handmade, tmp_path):
    work_dir, _ = handmade
    db = JSONDatabase(work_dir=work_dir)
    assert export_database(db, str(tmp_path / "best.json"), "json") == 1
    (item,) = json.load(open(tmp_path / "best.json"))
    assert item["best_secs"] == pytest.approx(20e-6) and item["trials"] == 5
    assert item["trace"] == db.get_top_k(db.get_all_workloads()[0], 1)[0].trace_json
    assert export_database(db, str(tmp_path / "all.csv"), "csv") == 6
    rows = list(csv.DictReader(open(tmp_path / "all.csv")))
    assert [r["trial"] for r in rows] == ["", "1", "2", "3", "4", "5"]
    assert [r["valid"] for r in rows] == ["1", "1", "0", "1", "1", "1"]


def test_report_on_a_real_tuning_run(tmp_path, target):
    """A real (small) tuning run: the curve never rises, ends at the best measured trial, and
    the plot of it is a valid PNG."""
    pytest.importorskip("matplotlib")
    work_dir = str(tmp_path / "wd")
    tasks = extract_tasks(_matmul_relu(), target)
    tune_tasks(tasks, work_dir, max_trials_global=8, num_trials_per_iter=8)
    files = report.write_report(work_dir)  # task names and weights: tune_tasks' tasks.json
    (s,) = files.summaries
    assert s.trials == 8 and s.baseline_secs and s.weight == 1
    assert s.name == tasks[0].task_name
    valid = [x for x in s.trial_secs if x is not None]
    assert valid and s.best_secs == min(valid)
    assert all(b >= a for a, b in zip(s.curve[1:], s.curve[:-1]) if a and b)
    assert s.curve[-1] == s.best_secs
    for path in files.plots:
        check_png(path)
    # the model's curve against tuning seconds: from the timeline, never rising, ending at
    # weight x the applied time
    times = [t for t, _, _ in files.curve]
    estimates = [e for _, e, _ in files.curve]
    assert times[0] == 0 and times == sorted(times) and len(times) == 2  # 0 s + one batch
    assert all(b <= a for a, b in zip(estimates, estimates[1:]))
    assert estimates[-1] == pytest.approx(s.applied_secs)
    assert "model_curve.png" in {os.path.basename(p) for p in files.plots}
