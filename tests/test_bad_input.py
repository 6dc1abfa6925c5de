"""Bad input, table-driven: each case is something a user may do wrong (issue 44). The CLI
cases run ``relax-tune``'s ``main(argv)`` in-process and check the exit status, the one line
that names the thing and what to do, that no traceback is printed, and that a work_dir's
records are byte for byte what they were. The Python API cases check the same of the
functions a script calls. A few cases need a process of their own (Ctrl-C, a read-only
work_dir for a user that is not root). The database reader is fuzzed with generated lines:
no line of any shape may crash a load or a resume, and no impossible record may load.

Every case fails before any candidate is measured, so the file stays fast."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relax_tune as rt
from relax_tune.cli import commands as cli
from relax_tune.database import JSONDatabase, TuningRecord
from relax_tune.database.records import BASELINE_TRACE
from relax_tune.database.validate import MIN_RUN_SECS, workload_args
from relax_tune.model_loader import load_model
from relax_tune.testing.workloads import matmul_mod
from relax_tune.utils import FAILED_RUN_SECS, RelaxTuneError, host_target, parse_target

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = "relax_tune.demo:demo_model"
ARGS16 = [["TENSOR", "float32", [16, 16]]] * 3


# ---------------------------------------------------------------------------- fixtures
def make_work_dir(path: str) -> str:
    """A work_dir with one workload (a 16x16 matmul) and three records: its baseline, a
    measured time and a failed candidate (``[1e10]``, valid to load, never applied)."""
    db = JSONDatabase(work_dir=path)
    workload = db.commit_workload(matmul_mod(16))
    for secs in ([2e-6, 2.1e-6], [1e-6], [FAILED_RUN_SECS]):
        db.commit_tuning_record(TuningRecord(BASELINE_TRACE, workload, secs, host_target(),
                                             ARGS16))
    return path


def snapshot(work_dir: str) -> dict[str, bytes]:
    """The bytes of every file of a work_dir's database."""
    out = {}
    for name in ("database_workload.json", "database_tuning_record.json"):
        path = os.path.join(work_dir, name)
        if os.path.exists(path):
            out[name] = open(path, "rb").read()
    return out


def tiny_onnx(path: str) -> str:
    """An ONNX model of one MatMul: input x (1, 8), weight (8, 4)."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.ones((8, 4), "float32"), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class Setup:
    """The files a case may name: ``wd`` (a work_dir with records), ``tmp``, models."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.wd = make_work_dir(os.path.join(tmp, "wd"))
        self.raises = self._file("raises.py", "def model():\n    raise ValueError('boom')\n")
        self.good = self._file("good.py", "from relax_tune.demo import demo_model as model\n")
        self.syntax = self._file("syntax.py", "def model(:\n    pass\n")
        self.empty_onnx = self._file("empty.onnx", "")
        os.makedirs(os.path.join(tmp, "dir.onnx"))
        self.a_file = self._file("a_file.txt", "not a folder\n")

    def _file(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
        return path

    def p(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def orphaned(self) -> str:
        """``wd`` with its workload file emptied: its records name a missing workload."""
        open(os.path.join(self.wd, "database_workload.json"), "w").close()
        return self.wd


# (id, argv made from a Setup, exit status, words of the one error line)
CLI_CASES = [
    ("export over the record file",
     lambda s: ["db", "export", s.wd, "-o", os.path.join(s.wd, "database_tuning_record.json")],
     2, "is a file of the work dir"),
    ("export over the workload file",
     lambda s: ["db", "export", s.wd, "-o", os.path.join(s.wd, "database_workload.json")],
     2, "is a file of the work dir"),
    ("export onto a folder", lambda s: ["db", "export", s.wd, "-o", s.tmp], 2,
     "is an existing folder"),
    ("max-time nan", lambda s: ["tune", DEMO, "--work-dir", s.wd, "--max-time", "nan"], 2,
     "--max-time must be a positive, finite number of seconds, not nan"),
    ("max-time negative", lambda s: ["tune", DEMO, "--work-dir", s.wd, "--max-time", "-5"], 2,
     "--max-time must be a positive, finite number of seconds"),
    ("max-time zero", lambda s: ["tune", DEMO, "--work-dir", s.wd, "--max-time", "0"], 2,
     "--max-time must be a positive, finite number of seconds"),
    ("max-time inf", lambda s: ["tune", DEMO, "--work-dir", s.wd, "--max-time", "inf"], 2,
     "leave it out for no time limit"),
    ("input-shape of no input",
     lambda s: ["tune", tiny_onnx(s.p("mm.onnx")), "--work-dir", s.wd, "--input-shape",
                "zz=1,64"], 2, "'zz', which is not an input of"),
    ("input-shape of a non-ONNX model",
     lambda s: ["tune", DEMO, "--work-dir", s.wd, "--input-shape", "x=1,784"], 2,
     "--input-shape fixes the inputs of ONNX models only"),
    ("mcpu no CPU",
     lambda s: ["tune", DEMO, "--work-dir", s.wd, "--target",
                '{"kind": "llvm", "mcpu": "notacpu"}'], 2,
     "target mcpu 'notacpu' is not a CPU LLVM knows"),
    ("model function raises", lambda s: ["tune", f"{s.raises}:model", "--work-dir", s.wd], 2,
     "raised ValueError: boom"),
    ("model file syntax error",
     lambda s: ["tune", f"{s.syntax}:model", "--work-dir", s.wd], 2, "line 1: invalid syntax"),
    ("empty file as model", lambda s: ["tune", s.empty_onnx, "--work-dir", s.wd], 2,
     "is an empty file"),
    ("folder named x.onnx", lambda s: ["tune", s.p("dir.onnx"), "--work-dir", s.wd], 2,
     "is a folder, not a file"),
    ("compile onto a folder",
     lambda s: ["compile", DEMO, "--work-dir", s.wd, "-o", s.tmp], 2, "is an existing folder"),
    ("compile into a folder that cannot be made",
     lambda s: ["compile", DEMO, "--work-dir", s.wd, "-o", os.path.join(s.a_file, "m.so")], 2,
     "is a file, not a folder"),
    ("compile over the model",
     lambda s: ["compile", f"{s.good}:model", "--work-dir", s.wd, "-o", s.good], 2,
     "would be overwritten"),
    ("compile over the record file",
     lambda s: ["compile", DEMO, "--work-dir", s.wd, "-o",
                os.path.join(s.wd, "database_tuning_record.json")], 2, "would be overwritten"),
    ("prune top-k 0",
     lambda s: ["db", "prune", s.wd, "-o", s.p("pruned"), "--top-k", "0"], 2,
     "--top-k must be at least 1, not 0"),
    ("report folder is a file",
     lambda s: ["report", s.wd, "-o", s.a_file], 2, "is a file, not a folder"),
    ("resume with the workload file emptied",
     lambda s: ["tune", DEMO, "--work-dir", s.orphaned(), "--trials", "1"], 2,
     "which it lacks (emptied or cut short?)"),
]


@pytest.mark.parametrize("make_argv, status, words", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(make_argv, status, words, tmp_path, capsys):
    setup = Setup(str(tmp_path))
    argv = make_argv(setup)  # may change the work_dir (empty its workload file)
    before = snapshot(setup.wd)
    if argv[0] == "tune" and "--trials" not in argv:
        argv += ["--trials", "1"]  # should a case ever get as far as tuning: one trial
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == status, (out, err)
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("relax-tune: error:")]
    assert len(errors) == 1 and words in errors[0], err
    assert snapshot(setup.wd) == before  # no record lost, none added
    assert not os.path.exists(setup.p("pruned"))  # a refused prune leaves nothing behind


# ---------------------------------------------------------------------------- Python API
def _bad_lines(path: str) -> None:
    """Append impossible records to a work_dir's record file (what an edited or foreign
    file may hold): each must be skipped with its file and line."""
    record_file = os.path.join(path, "database_tuning_record.json")
    good = json.loads(open(record_file, encoding="utf-8").readline())
    with open(record_file, "a", encoding="utf-8") as file:
        for secs in ([-1.0, 0.0], [1e-15], "fast", [float("nan")], [], [True]):
            file.write(json.dumps([0, [good[1][0], secs, good[1][2], good[1][3]]]) + "\n")
        other = [["TENSOR", "float32", [32, 32]]] * 3  # another workload's arguments
        file.write(json.dumps([0, [good[1][0], [1e-9], good[1][2], other]]) + "\n")
        file.write(json.dumps([0, [good[1][0], [1e-9], good[1][2], ARGS16[:2]]]) + "\n")


def test_impossible_records_are_skipped_with_file_and_line(tmp_path, caplog):
    wd = make_work_dir(str(tmp_path / "wd"))
    _bad_lines(wd)
    with caplog.at_level(logging.WARNING, logger="relax_tune"):
        db = JSONDatabase(work_dir=wd)
    assert [r.run_secs for r in db.get_all_tuning_records()] == \
        [[2e-6, 2.1e-6], [1e-6], [FAILED_RUN_SECS]]  # the failed one loads, never applied
    warned = [r.getMessage() for r in caplog.records]
    for lineno in range(4, 12):
        assert any(f"database_tuning_record.json, line {lineno}: skipped" in w
                   for w in warned), (lineno, warned)
    assert any("no kernel runs in that time" in w for w in warned)
    assert any("are not its workload's" in w for w in warned)
    best = db.get_top_k(db.get_all_workloads()[0], 1)
    assert best[0].run_secs == [1e-6]
    code = cli.main(["db", "show", wd])
    assert code == 0


def test_impossible_records_are_refused_on_commit(tmp_path):
    wd = make_work_dir(str(tmp_path / "wd"))
    before = snapshot(wd)
    db = JSONDatabase(work_dir=wd)
    workload = db.get_all_workloads()[0]
    for secs in ([-1.0, 0.0], [1e-15], [0.0]):
        with pytest.raises(RelaxTuneError, match="no kernel runs in that time"):
            db.commit_tuning_record(TuningRecord(BASELINE_TRACE, workload, secs))
    with pytest.raises(RelaxTuneError, match="are not its workload's"):
        db.commit_tuning_record(TuningRecord(BASELINE_TRACE, workload, [1e-6], None,
                                             [["TENSOR", "float32", [32, 32]]] * 3))
    db.commit_tuning_record(TuningRecord(BASELINE_TRACE, workload, [FAILED_RUN_SECS], None,
                                         ARGS16))  # a failed candidate stays valid
    after = snapshot(wd)
    assert after["database_tuning_record.json"].startswith(
        before["database_tuning_record.json"])
    assert after["database_tuning_record.json"].count(b"\n") == 4


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0, "60"])
def test_api_max_time_is_a_limit(value):
    with pytest.raises(RelaxTuneError, match="max_time must be"):
        rt.TuneConfig(max_time=value)
    with pytest.raises(RelaxTuneError, match="max_time must be"):
        rt.transform.TuneIRMod(params={}, work_dir="unused", max_time=value)


def test_api_bad_models_and_targets(tmp_path):
    setup = Setup(str(tmp_path))
    with pytest.raises(RelaxTuneError, match="raised ValueError: boom"):
        load_model(f"{setup.raises}:model")
    with pytest.raises(RelaxTuneError, match="line 1: invalid syntax"):
        load_model(f"{setup.syntax}:model")
    with pytest.raises(RelaxTuneError, match="is not a CPU LLVM knows"):
        parse_target({"kind": "llvm", "mcpu": "notacpu"})
    assert parse_target({"kind": "llvm", "mcpu": "cortex-a72",
                         "mtriple": "aarch64-linux-gnu"}).kind.name == "llvm"


def test_pipeline_without_work_dir_says_where_records_go(caplog):
    from tvm import relax

    with caplog.at_level(logging.WARNING, logger="relax_tune"):
        relax.get_pipeline("relax_tune", target=host_target())
    warned = [r.getMessage() for r in caplog.records if "no work_dir given" in r.getMessage()]
    assert len(warned) == 1
    assert os.path.abspath("relax_tune_work") in warned[0] and "64 trials" in warned[0]


def test_api_read_only_and_orphaned_work_dirs_refuse_to_tune(tmp_path):
    setup = Setup(str(tmp_path))
    before = snapshot(setup.orphaned())
    tasks = rt.extract_tasks(matmul_mod(8), host_target())
    with pytest.raises(RelaxTuneError, match="which it lacks"):
        rt.tune_tasks(tasks, setup.wd, max_trials_global=1)
    assert snapshot(setup.wd) == before


# ---------------------------------------------------------------------------- processes
def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def test_ctrl_c_three_times_is_one_line(tmp_path):
    """Ctrl-C pressed three times while tuning starts (the whole process group gets SIGINT,
    as from a terminal): exit status 130, no traceback, every record line still loads."""
    wd = str(tmp_path / "wd")
    proc = subprocess.Popen([sys.executable, "-m", "relax_tune.cli", "tune", DEMO,
                             "--work-dir", wd, "--trials", "64"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(),
                            start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "tasks of" in line:
                break
        time.sleep(2.0)  # tuning has started: workers up, baselines building
        for _ in range(3):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.3)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "Exception ignored" not in output, output
    assert "relax-tune: interrupted" in output or "stopped at once" in output, output
    record_file = os.path.join(wd, "database_tuning_record.json")
    if os.path.exists(record_file):
        db = JSONDatabase(work_dir=wd)
        assert len(db) == open(record_file, encoding="utf-8").read().count("\n")


def _as_another_user(argvs: list[list[str]]) -> list[tuple[int, str]]:
    """Run ``relax-tune argv`` for each of ``argvs`` in a forked process that, when this one
    is root (whom permissions do not bind), becomes the user nobody first; return each
    (exit status, stderr)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            results = []
            for argv in argvs:
                err = io.StringIO()
                with contextlib.redirect_stderr(err), \
                        contextlib.redirect_stdout(io.StringIO()):
                    code = cli.main(argv)
                results.append([code, err.getvalue()])
            os.write(write_end, json.dumps(results).encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, json.dumps([[-1, repr(exc)]]).encode())
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return [tuple(item) for item in json.loads(data)]


def test_read_only_work_dir_and_output_folder():
    """tune and report on a read-only work_dir, compile into a read-only folder: one line
    each, exit 2, the records intact."""
    base = tempfile.mkdtemp(prefix="rt_read_only_")
    try:
        os.chmod(base, 0o755)
        wd = make_work_dir(os.path.join(base, "wd"))
        locked = os.path.join(base, "locked")
        os.makedirs(locked)
        before = snapshot(wd)
        for path in (wd, locked):
            for name in os.listdir(path):
                os.chmod(os.path.join(path, name), 0o444)
            os.chmod(path, 0o555)
        results = _as_another_user([
            ["tune", DEMO, "--work-dir", wd, "--trials", "1"],
            ["report", wd],
            ["compile", DEMO, "--work-dir", wd, "-o", os.path.join(locked, "m.so")]])
        words = ["is read-only: tune into a folder you can write to",
                 "cannot create the report folder", "the folder of the library -o"]
        assert len(results) == 3, results
        for (code, err), want in zip(results, words):
            assert code == 2 and "Traceback" not in err, err
            errors = [line for line in err.splitlines() if line.startswith("relax-tune: error:")]
            assert len(errors) == 1 and want in errors[0], err
        assert snapshot(wd) == before
    finally:
        for root, dirs, _ in os.walk(base):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------- fuzzing
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                   max_size=3),
    max_leaves=12)
_SECS = st.one_of(st.none(), _JSON, st.lists(st.one_of(
    st.floats(), st.integers(-3, 3), st.text(max_size=3), st.booleans()), max_size=4))
_ARGS = st.one_of(st.none(), _JSON, st.just(ARGS16), st.lists(st.lists(_JSON, max_size=3),
                                                              max_size=4))


@st.composite
def record_lines(draw) -> str:
    """A record line: JSON of any shape, a near-valid record with one part replaced, raw
    text or bytes, with or without its newline."""
    trace = [[["GetBlock", [], ["C", "main"], ["b0"]]], []]
    kind = draw(st.sampled_from(["near", "near", "record", "json", "text"]))
    if kind == "near":  # a good record of workload 0 with one part replaced
        value = [0, [BASELINE_TRACE, [1e-6], {"kind": "llvm"}, ARGS16]]
        part = draw(st.sampled_from(["index", "trace", "secs", "target", "args"]))
        if part == "index":
            value[0] = draw(_JSON)
        else:
            where = ["trace", "secs", "target", "args"].index(part)
            value[1][where] = draw({"trace": _JSON, "secs": _SECS, "target": _JSON,
                                    "args": _ARGS}[part])
        text = json.dumps(value)
    elif kind == "record":
        index = draw(st.one_of(st.integers(-2, 3), _JSON))
        value = [index, [draw(st.one_of(st.just(trace), st.just(BASELINE_TRACE), _JSON)),
                         draw(_SECS), draw(st.one_of(st.none(), st.just({"kind": "llvm"}),
                                                     _JSON)), draw(_ARGS)]]
        text = json.dumps(value)
    elif kind == "json":
        text = json.dumps(draw(_JSON))
    else:
        text = draw(st.text(max_size=40))
    return text + draw(st.sampled_from(["\n", "\n", ""]))


@functools.lru_cache(maxsize=1)
def _base_files() -> dict[str, bytes]:
    base = tempfile.mkdtemp(prefix="rt_fuzz_base_")
    try:
        return snapshot(make_work_dir(base))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def _other_workload():
    return matmul_mod(8)


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(record_lines(), max_size=8),
       workload_junk=st.lists(st.text(max_size=30), max_size=2))
def test_no_database_line_crashes_a_load_or_a_resume(lines, workload_junk):
    base = tempfile.mkdtemp(prefix="rt_fuzz_")
    try:
        wd = base
        for name, data in _base_files().items():
            with open(os.path.join(wd, name), "wb") as file:
                file.write(data)
        with open(os.path.join(wd, "database_workload.json"), "a", encoding="utf-8") as file:
            for junk in workload_junk:
                file.write(junk.replace("\n", " ") + "\n")
        with open(os.path.join(wd, "database_tuning_record.json"), "a",
                  encoding="utf-8") as file:
            file.write("".join(lines))
        logging.disable(logging.WARNING)
        try:
            db = JSONDatabase(work_dir=wd)  # must not raise
        finally:
            logging.disable(logging.NOTSET)
        expected = workload_args(db.get_all_workloads()[0].mod)
        for record in db.get_all_tuning_records():
            assert record.run_secs is None or (record.run_secs and all(
                math.isfinite(s) and s >= MIN_RUN_SECS for s in record.run_secs))
            assert record.args_info is None or record.args_info == expected
        assert len(db) >= 3  # the three good records survive anything appended
        # resume: another session commits a workload and a record (or says why it cannot)
        try:
            workload = db.commit_workload(_other_workload())
            db.commit_tuning_record(TuningRecord(BASELINE_TRACE, workload, [1e-6]))
        except RelaxTuneError as err:
            assert "which it lacks" in str(err)
        logging.disable(logging.WARNING)
        try:
            again = JSONDatabase(work_dir=wd)
        finally:
            logging.disable(logging.NOTSET)
        assert len(again) >= 3
    finally:
        shutil.rmtree(base, ignore_errors=True)
