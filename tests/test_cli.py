"""The ``relax-tune`` command line on the demo model: an ONNX file the test builds with the onnx
package (tune, resume, compile, run the library, db show/prune/merge/export, report), a
``file.py:function`` model, ``--help`` of every sub-command, and the errors a user can cause."""

import json
import os
import textwrap

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_tune.cli import commands as cli
from relax_tune.database import JSONDatabase, is_baseline
from relax_tune.tuning.extract import extract_tasks
from relax_tune.model_loader import load_model, parse_shape_dict
from relax_tune.utils import RelaxTuneError

SUBCOMMANDS = [["tune"], ["compile"], ["db"], ["db", "show"], ["db", "merge"], ["db", "prune"],
               ["db", "export"], ["report"], ["demo"]]


def _demo_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.uniform(-1, 1, (784, 256)).astype("float32"),
            "b1": rng.uniform(-1, 1, (256,)).astype("float32"),
            "w2": rng.uniform(-1, 1, (256, 10)).astype("float32")}


def _reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> tuple[str, dict]:
    """The demo MLP (Linear 784->256, ReLU, Linear 256->10 without bias) as an ONNX file."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = _demo_weights()
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 784])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = str(tmp_path_factory.mktemp("model") / "mlp.onnx")
    onnx.save(model, path)
    return path, w


def _pruned_count(db: JSONDatabase, top_k: int) -> int:
    """Records ``db prune --top-k`` keeps: per workload its ``top_k`` fastest valid records
    and its valid baseline (counted once when it is one of them)."""
    count = 0
    for workload in db.get_all_workloads():
        records = db.get_records(workload)
        top = sorted((r for r in records if r.is_valid), key=lambda r: r.mean_run_secs)[:top_k]
        base = [r for r in records if is_baseline(r) and r.is_valid and r not in top]
        count += len(top) + len(base)
    return count


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``relax-tune argv`` in-process; return (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=" ".join)
def test_help_of_every_subcommand(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: relax-tune " + " ".join(argv))
    assert len(out.splitlines()) > 5  # a description and the options, not just a usage line


def test_tune_compile_db_report_on_the_onnx_demo_model(onnx_model, tmp_path, capsys, target):
    pytest.importorskip("matplotlib")
    path, weights = onnx_model
    wd = str(tmp_path / "wd")
    tgt = json.dumps(json.loads(str(target)))
    args = ["tune", path, "--work-dir", wd, "--trials", "8", "--trials-per-iter", "4",
            "--target", tgt]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "fused_matmul_add_relu" in out and "8 new trials" in out
    db = JSONDatabase(work_dir=wd)
    n_records = len(db)
    assert n_records == 8 + 2  # 8 trials + one untuned baseline per task (two tasks)
    meta = json.load(open(os.path.join(wd, "tasks.json")))
    assert sorted(m["name"].rstrip("0123456789") for m in meta) == \
        ["fused_matmul_add_relu", "matmul"]

    # resuming with the same budget measures nothing new
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "0 new trials" in out and len(JSONDatabase(work_dir=wd)) == n_records

    # the relax_tune pipeline finds nothing new to tune in what the CLI tuned: same tasks
    with target:
        model = load_model(path)
        tvm.compile(model.mod, target, relax_pipeline=model.compile_pipeline(
            target, wd, max_trials_global=8))
    assert len(JSONDatabase(work_dir=wd)) == n_records

    lib_path = str(tmp_path / "out" / "model.so")
    code, out, err = run_cli(capsys, "compile", path, "--work-dir", wd, "-o", lib_path,
                             "--target", tgt)
    assert code == 0, err
    tuned = sum(not is_baseline(db.get_top_k(w, 1)[0]) for w in db.get_all_workloads())
    assert tuned >= 1 and f"tuned schedules for {tuned} of 2 tasks" in out
    vm = relax.VirtualMachine(tvm.runtime.load_module(lib_path), tvm.cpu())
    x = np.random.default_rng(1).uniform(-1, 1, (1, 784)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    np.testing.assert_allclose(got, _reference(x, weights), rtol=1e-4, atol=1e-4)

    code, out, err = run_cli(capsys, "db", "show", wd)
    assert code == 0, err
    assert "fused_matmul_add_relu" in out and "1x256" in out and "-mcpu=" in out
    assert "estimated end-to-end" in out

    code, out, err = run_cli(capsys, "report", wd)
    assert code == 0, err
    from test_report import check_png

    pngs = [line for line in out.splitlines() if line.endswith(".png")]
    assert len(pngs) == 4  # model_curve.png, curves.png + one per task
    assert "| tuning s | estimated us | vs 0 s |" in out
    for png in pngs:
        check_png(png)
    summary = open(os.path.join(wd, "report", "summary.md"), encoding="utf-8").read()
    assert "Estimated end-to-end time" in summary and "weights from tasks.json" in summary
    assert "Estimated model latency against tuning seconds" in summary

    pruned = str(tmp_path / "pruned")
    code, out, err = run_cli(capsys, "db", "prune", wd, "-o", pruned, "--top-k", "2")
    assert code == 0, err
    assert len(JSONDatabase(work_dir=pruned)) == _pruned_count(db, 2) >= 2 * 2
    merged = str(tmp_path / "merged")
    code, out, err = run_cli(capsys, "db", "merge", pruned, wd, "-o", merged)
    assert code == 0, err
    assert len(JSONDatabase(work_dir=merged)) == n_records  # pruned records are all in wd
    code, out, err = run_cli(capsys, "db", "export", wd, "-o", str(tmp_path / "best.json"))
    assert code == 0, err
    best = json.load(open(tmp_path / "best.json"))
    assert {b["name"].rstrip("0123456789") for b in best} == {"fused_matmul_add_relu", "matmul"}


def test_compile_predict_times_nothing(onnx_model, tmp_path, capsys, target):
    """``compile --predict`` into a new work dir: the model's first choices, no record
    measured, the library correct."""
    path, weights = onnx_model
    wd, lib_path = str(tmp_path / "new"), str(tmp_path / "model.so")
    code, out, err = run_cli(capsys, "compile", path, "--work-dir", wd, "--predict", "-o",
                             lib_path, "--target", json.dumps(json.loads(str(target))))
    assert code == 0, err
    # the 1x256 by 256x10 classifier (5.1e3 FLOPs) is under MIN_TILED_FLOPS: untuned
    assert "predicted schedules for 1 of 2 tasks" in out and "nothing measured" in out
    assert "predicted ones for 1" in out
    assert len(JSONDatabase(work_dir=wd)) == 0
    vm = relax.VirtualMachine(tvm.runtime.load_module(lib_path), tvm.cpu())
    x = np.random.default_rng(1).uniform(-1, 1, (1, 784)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    np.testing.assert_allclose(got, _reference(x, weights), rtol=1e-4, atol=1e-4)


def test_python_function_model_binds_its_params(tmp_path, target):
    """``file.py:function`` returning (mod, {name: array}): the params are bound, so the
    weight transposes fold away and only the two matmul tasks remain."""
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent("""
        import numpy as np
        from relax_tune.demo import demo_model

        def with_weights():
            mod, params = demo_model()
            rng = np.random.default_rng(0)
            return mod, {name: rng.uniform(-1, 1, [int(d) for d in p.shape]).astype("float32")
                         for name, p in params}

        def without_weights():
            return demo_model()[0]
    """))
    bound = load_model(f"{path}:with_weights")
    assert sorted(bound.params) == ["fc1.bias", "fc1.weight", "fc2.weight"]
    names = sorted(t.task_name for t in extract_tasks(bound.lowered(target), target))
    # (AttachAttrLayoutFreeBuffers, for the bound weights on CPU, adds a digit to names)
    assert [n.rstrip("0123456789") for n in names] == ["fused_matmul_add_relu", "matmul"]
    free = load_model(f"{path}:without_weights")
    assert free.params == {}
    assert len(extract_tasks(free.lowered(target), target)) == 4  # + two weight transposes


def test_module_path_model():
    model = load_model("relax_tune.demo:demo_model")
    assert "forward" in [gv.name_hint for gv in model.mod.functions]


@pytest.mark.parametrize("spec, message", [
    ("nothing_here.onnx", "does not exist"),
    ("model.txt", "neither an ONNX file"),
    ("no_such_file.py:f", "does not exist"),
    ("relax_tune.demo:no_such_function", "has no function"),
    ("relax_tune.demo:demo_inputs", "without arguments"),
])
def test_bad_models_are_clear_errors(spec, message, capsys):
    code, _, err = run_cli(capsys, "tune", spec, "--work-dir", "unused", "--trials", "1")
    assert code == 2 and message in err and err.startswith("relax-tune: error:")


def test_user_errors_exit_2_with_one_line(tmp_path, capsys, onnx_model):
    path, _ = onnx_model
    code, _, err = run_cli(capsys, "compile", path, "--work-dir", str(tmp_path / "none"),
                           "-o", str(tmp_path / "m.so"))
    assert code == 2 and "holds no tuning database" in err
    code, _, err = run_cli(capsys, "tune", path, "--work-dir", str(tmp_path / "w"),
                           "--trials", "4", "--rpc", "localhost:notaport:key")
    assert code == 2 and "is not host:port:key" in err
    code, _, err = run_cli(capsys, "tune", path, "--work-dir", str(tmp_path / "w"),
                           "--trials", "4", "--op-names", "conv2d")
    assert code == 2 and "match no tunable function" in err
    code, _, err = run_cli(capsys, "db", "show", str(tmp_path / "none"))
    assert code == 2 and "holds no tuning database" in err
    code, _, err = run_cli(capsys, "tune", path, "--work-dir", str(tmp_path / "w"),
                           "--trials", "4", "--target", "{bad json")
    assert code == 2 and "not valid JSON" in err
    code, _, err = run_cli(capsys, "tune", path, "--work-dir", str(tmp_path / "w"),
                           "--trials", "4", "--cost-model", "xgboost")
    assert code == 2 and "cost_model='xgboost' is not one of" in err


def test_parse_helpers():
    from relax_tune.measure import parse_rpc_spec

    assert parse_rpc_spec("10.0.0.1:9190:rasp4") == ("10.0.0.1:9190", "rasp4")
    with pytest.raises(RelaxTuneError, match="is not host:port:key"):
        parse_rpc_spec("localhost:9190")
    assert parse_shape_dict(["x=1,784", "y=2x3"]) == {"x": [1, 784], "y": [2, 3]}
    with pytest.raises(RelaxTuneError, match="NAME=D0,D1"):
        parse_shape_dict(["x"])
    assert cli._split_names(["matmul,add", "conv"]) == ["matmul", "add", "conv"]


def test_tune_through_rpc(onnx_model, tmp_path, capsys, rpc_cluster):
    """``--rpc host:port:key`` measures on a real local RPC tracker + servers."""
    path, _ = onnx_model
    wd = str(tmp_path / "wd")
    code, out, err = run_cli(capsys, "tune", path, "--work-dir", wd, "--trials", "4",
                             "--trials-per-iter", "4", "--op-names", "fused",
                             "--rpc", f"{rpc_cluster.tracker}:{rpc_cluster.key}")
    assert code == 0, err
    assert "4 new trials" in out
    records = JSONDatabase(work_dir=wd).get_all_tuning_records()
    assert len(records) == 5 and [is_baseline(r) for r in records].count(True) == 1
    assert all(r.is_valid for r in records if is_baseline(r))  # timed through RPC
    assert any(r.is_valid for r in records if not is_baseline(r))


def test_tune_max_time_and_scheduler_reach_the_tuner(onnx_model, tmp_path, capsys):
    path, _ = onnx_model
    wd = str(tmp_path / "wd")
    config = cli._tune_config(cli.build_parser().parse_args(
        ["tune", path, "--work-dir", wd, "--trials", "2000", "--max-time", "8",
         "--scheduler", "round-robin"]))
    assert (config.max_time, config.task_scheduler) == (8.0, "round-robin")
    start = __import__("time").perf_counter()
    code, out, err = run_cli(capsys, "tune", path, "--work-dir", wd, "--trials", "2000",
                             "--trials-per-iter", "4", "--max-time", "8",
                             "--scheduler", "round-robin")
    assert code == 0, err
    # 2000 trials take many minutes: stopping within the limit shows --max-time reached
    # the tuner. 8 s, not 3: the limit counts the session's fixed costs too (the shipped
    # library's read, the searches, the predictions: 3-4 s when this test runs first in
    # its process), and both tasks' first batches come after them
    records = JSONDatabase(work_dir=wd).get_all_tuning_records()
    assert sum(is_baseline(r) for r in records) == 2  # both tasks' first batches
    assert len(records) - 2 < 200
    assert __import__("time").perf_counter() - start < 120
