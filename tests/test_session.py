"""One tuning session, one configuration: every entry point validates what the user passes
before any work, and every entry point leaves the same things in work_dir."""

import json
import os

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune.cli import commands as cli
from relax_tune.config import OPTION_NAMES, TuneConfig, make_config
from relax_tune.demo import demo_inputs, demo_model
from relax_tune.work_dir import TASK_META_FILE, WorkDir
from model_checks import untuned_output
from relax_tune.testing.workloads import matmul_mod

SMALL = {"num_trials_per_iter": 2}


# ------------------------------------------------------------------ the configuration object
def test_unknown_option_names_it_and_the_closest_valid_one():
    with pytest.raises(rt.RelaxTuneError, match=r"'num_trails_per_iter'.*did you mean "
                                                r"'num_trials_per_iter'"):
        make_config(num_trails_per_iter=4)


@pytest.mark.parametrize("option, value, message", [
    ("max_trials_global", -1, ">= 0"),
    ("max_trials_global", 2.5, "must be an integer"),
    ("num_trials_per_iter", 0, ">= 1"),
    ("strategy", "genetic", "is not one of evolutionary, replay"),
    ("cost_model", "xgboost", "is not one of"),
    ("task_scheduler", "fifo", "is not one of gradient, round-robin"),
    ("min_task_share", 2, "between 0 and 1"),
    ("check_correctness", "yes", "True or False"),
    ("op_names", "matmul", "list of strings"),
    ("runner", object(), "is not a relax_tune.measure.Runner"),
    ("max_time", "10", "must be a number"),
])
def test_ill_typed_options_raise_before_any_work(option, value, message):
    with pytest.raises(rt.RelaxTuneError, match=message):
        make_config(**{option: value})


def test_config_is_frozen_and_options_replace_its_values():
    base = TuneConfig(max_trials_global=8, seed=3)
    with pytest.raises(AttributeError):
        base.seed = 4  # type: ignore[misc]
    derived = make_config(base, seed=5, op_names=["matmul"])
    assert (derived.max_trials_global, derived.seed, derived.op_names) == (8, 5, ("matmul",))
    assert base.seed == 3
    assert set(OPTION_NAMES) >= {"max_trials_global", "runner", "builder", "cost_model"}


# ------------------------------------------------------------------ every entry point raises
def test_misspelled_option_stops_the_pass_before_tuning(tmp_path):
    wd = tmp_path / "work"
    with pytest.raises(rt.RelaxTuneError, match="num_trails_per_iter"):
        rt.TuneIRMod(params={}, work_dir=str(wd), max_trials_global=4, num_trails_per_iter=4)
    with pytest.raises(rt.RelaxTuneError, match="max_trails_per_task"):
        rt.TuneTIR(work_dir=str(wd), max_trials_global=4, max_trails_per_task=4)
    assert not wd.exists()


def test_misspelled_option_stops_the_pipeline_before_tuning(tmp_path, target):
    wd = tmp_path / "work"
    with pytest.raises(rt.RelaxTuneError, match="num_trails_per_iter"):
        relax.get_pipeline("relax_tune", target=target, work_dir=str(wd), max_trials_global=4,
                           num_trails_per_iter=4)
    assert not wd.exists()


def test_misspelled_option_stops_the_scripts(tmp_path, target):
    mod, _ = demo_model()
    with pytest.raises(rt.RelaxTuneError, match="seeed"):
        rt.tune_relax(mod, None, target, str(tmp_path), max_trials_global=2, seeed=1)
    with pytest.raises(rt.RelaxTuneError, match="seeed"):
        rt.tune_tasks([], str(tmp_path), seeed=1)


def test_work_dir_that_is_a_file_is_one_clear_error(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(rt.RelaxTuneError, match="is a file, not a directory"):
        rt.TuneIRMod(params={}, work_dir=str(path))
    code = cli.main(["tune", "relax_tune.demo:demo_model", "--work-dir", str(path),
                     "--trials", "2"])
    assert code == 2 and "is a file, not a directory" in capsys.readouterr().err


def test_cli_rejects_a_bad_option_value_before_loading(tmp_path, capsys):
    code = cli.main(["tune", "relax_tune.demo:demo_model", "--work-dir", str(tmp_path / "w"),
                     "--trials", "2", "--strategy", "genetic"])
    assert code == 2 and "strategy='genetic' is not one of" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ one meaning of work_dir
def test_pipeline_leaves_the_whole_session_in_work_dir_and_warm_starts(tmp_path, target):
    """The pipeline (through TuneIRMod) writes what the CLI writes: the database, the cost
    model, the log and the task names; a second run loads that cost model."""
    mod, params = demo_model()
    inputs = demo_inputs(params)
    weights = {name: arr for (name, _), arr in zip(params, inputs[1:])}
    wd = str(tmp_path / "work")
    pipeline = relax.get_pipeline("relax_tune", target=target, work_dir=wd,
                                  max_trials_global=6, params=weights, **SMALL)
    ex = tvm.compile(mod, target, relax_pipeline=pipeline)
    out = relax.VirtualMachine(ex, tvm.cpu())["forward"](tvm.runtime.tensor(inputs[0])).numpy()
    np.testing.assert_allclose(out, untuned_output(mod, target, inputs), rtol=1e-4, atol=1e-4)

    meta = WorkDir.of(wd).read_task_meta()
    db = rt.JSONDatabase(work_dir=wd)
    assert {int(w.shash) for w in db.get_all_workloads()} == set(meta)
    # (AttachAttrLayoutFreeBuffers, for bound weights on CPU, adds a digit to names)
    assert sorted((v["name"].rstrip("0123456789"), v["weight"]) for v in meta.values()) == \
        [("fused_matmul_add_relu", 1), ("matmul", 1)]
    assert os.path.isfile(os.path.join(wd, TASK_META_FILE))
    assert os.listdir(WorkDir.of(wd).cost_model_dir)
    log = WorkDir.of(wd).log_file
    assert "[6/6 trials" in open(log, encoding="utf-8").read()  # the session's own log

    from relax_tune.cost_model import make_cost_model

    warm = make_cost_model("xgb", wd)  # what the next run on this work_dir starts from
    assert warm.num_rows == 6  # every trial of the session (the baselines are not trials)


def test_tune_tir_keeps_cost_model_and_task_names(tmp_path, target):
    wd = str(tmp_path / "w")
    rt.tune_tir(matmul_mod(32), target, wd, max_trials_global=3, **SMALL)
    assert WorkDir.of(wd).read_task_meta() and os.listdir(WorkDir.of(wd).cost_model_dir)
    with open(os.path.join(wd, TASK_META_FILE)) as f:
        assert json.load(f)[0]["name"] == "main"


# ------------------------------------------------------------------ apply-only, devices
def test_apply_database_never_creates_a_work_dir(demo, target, tmp_path, caplog):
    lowered, _ = demo
    missing = tmp_path / "never"
    with target:
        out = rt.ApplyDatabase(work_dir=str(missing))(lowered)
    assert not missing.exists()
    tvm.ir.assert_structural_equal(out, lowered)
    assert "holds no tuning database" in caplog.text


def test_applying_a_work_dir_tuned_for_another_module_warns(demo, target, tmp_path, caplog):
    # a work_dir tuned for another model (or another version's lowering) would otherwise
    # compile an untuned model with no sign of it
    lowered, _ = demo
    wd = str(tmp_path / "w")
    rt.tune_tasks(rt.extract_tasks(lowered, target), wd, measure=False)
    with target:
        rt.ApplyDatabase(work_dir=wd)(lowered)
        assert "are not in the work_dir" not in caplog.text
        other = rt.ApplyDatabase(work_dir=wd)
        other(matmul_mod(48))
    assert other.unknown == ["main"]
    assert "1 of 1 kernels are not in the work_dir" in caplog.text


def test_a_task_the_work_dir_left_untuned_is_not_foreign(demo, target, tmp_path, caplog):
    """A kernel whose task the work_dir's sessions extracted but left without a schedule (a
    no-measurement compile leaves layout and elementwise tasks as they are) belongs to the
    work_dir: applying it raises no "not in the work_dir" warning."""
    lowered, _ = demo
    wd = str(tmp_path / "w")
    rt.tune_tasks(rt.extract_tasks(lowered, target), wd, measure=False)
    WorkDir.of(wd).write_task_meta(rt.extract_tasks(matmul_mod(48), target))  # no schedule
    with target:
        applying = rt.ApplyDatabase(work_dir=wd)
        applying(matmul_mod(48))
    assert applying.unknown == [] and "are not in the work_dir" not in caplog.text


def test_cuda_without_a_gpu_stops_at_once(tmp_path):
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    from relax_tune.space.gpu import cuda_target

    tasks = rt.extract_tasks(matmul_mod(32), cuda_target("sm_80"))
    with pytest.raises(rt.RelaxTuneError, match=r"no cuda device.*--rpc"):
        rt.tune_tasks(tasks, str(tmp_path / "w"), max_trials_global=2)
    assert not os.path.exists(os.path.join(str(tmp_path / "w"), "database_tuning_record.json")) \
        or rt.JSONDatabase(work_dir=str(tmp_path / "w")).get_all_tuning_records() == []


def test_importing_relax_tune_leaves_the_process_environment_alone():
    import subprocess
    import sys

    code = ("import os; before = dict(os.environ); import relax_tune; "
            "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS",
                                                            "TVM_CUDA_COMPILE_MODE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out == "[]"
