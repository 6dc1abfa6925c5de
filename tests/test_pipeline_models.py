"""The "relax_tune" pipeline on whole models: bound weights, lifted weights, GPU fallback."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import relax_tune as rt
from relax_tune.demo import run_demo
from relax_tune.testing.models import MODELS, get_model, model_inputs, split_inputs

from model_checks import assert_lifted_weights_swappable, untuned_output

SMALL = {"num_trials_per_iter": 2}
TRIALS = 2
# Tune one heavy task of the bigger models (every task tuned costs a baseline measurement);
# the rest stay untuned, so outputs mix applied records and untuned kernels.
TUNED_OPS = {"mlp": None, "conv_net": ["fused_conv2d_add_relu"],
             "transformer_block": ["fused_matmul2_add21"]}


@pytest.fixture(scope="module")
def work_dirs(tmp_path_factory):
    """One work_dir per model, shared by the tests of this module (tuned once, then reused)."""
    return {name: str(tmp_path_factory.mktemp(name)) for name in MODELS}


@pytest.mark.parametrize("name", list(MODELS))
def test_bound_params_tuned_model_equals_untuned(name, target, work_dirs):
    mod, _ = get_model(name)
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=work_dirs[name],
                              max_trials_global=TRIALS, params=weights,
                              op_names=TUNED_OPS[name], **SMALL)
    ex = tvm.compile(mod, target, relax_pipeline=pipe)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["forward"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    np.testing.assert_allclose(got, untuned_output(mod, target, arrays), rtol=1e-4, atol=1e-4)
    recorded = {r.workload.shash
                for r in rt.JSONDatabase(work_dir=work_dirs[name]).get_all_tuning_records()}
    with target:
        # with params the pipeline prepacks weights on CPU by default (layout-free marking)
        bound = tvm.transform.Sequential(rt.transform.lowering_passes(
            target, cpu_weight_prepack=True))(rt.transform.bind_params(mod, weights))
        unbound = tvm.transform.Sequential(rt.transform.lowering_passes(target))(mod)
    # the tuned tasks are the bound model's; weight-only kernels (transposes) were folded
    assert recorded == {t.shash for t in rt.extract_tasks(bound, target,
                                                          op_names=TUNED_OPS[name])}
    weight_only = {t.shash for t in rt.extract_tasks(unbound, target)} - recorded
    assert any(t.task_name.startswith("transpose") and t.shash in weight_only
               for t in rt.extract_tasks(unbound, target))


@pytest.mark.parametrize("name", list(MODELS))
def test_lifted_weights_are_swappable_without_recompiling(name, target, work_dirs):
    mod, _ = get_model(name)
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=work_dirs[name],
                              max_trials_global=0, lift_transform_params=True)
    assert_lifted_weights_swappable(mod, target, pipe)


def test_tune_irmod_with_params_tunes_no_weight_transposes(demo, target, tmp_path):
    lowered, params = demo
    mod, _ = get_model("mlp")
    _, weights = split_inputs(mod, model_inputs(mod))
    tune = rt.TuneIRMod(params=weights, work_dir=str(tmp_path), max_trials_global=4, **SMALL)
    with target:
        out = tune(lowered)
    tvm.ir.assert_structural_equal(out, lowered)
    assert sorted(r.task_name for r in tune.reports) == ["fused_matmul_add_relu", "matmul1"]
    assert sum(r.trials for r in tune.reports) == 4
    without = rt.extract_tasks(lowered, target)
    assert {t.task_name for t in without} > {r.task_name for r in tune.reports}


def test_weight_prepack_flag_compiles_and_matches(target, work_dirs):
    mod, _ = get_model("mlp")
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=work_dirs["mlp"],
                              max_trials_global=0, params=weights, cpu_weight_prepack=True)
    with target:
        lowered = tvm.transform.Sequential(rt.transform.lowering_passes(
            target, cpu_weight_prepack=True))(rt.transform.bind_params(mod, weights))
    marked = [f for _, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)
              and f.attrs is not None and "layout_free_buffers" in f.attrs]
    prims = [f for _, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert len(marked) == len(prims) == 2  # both matmuls' weight operands are layout-free
    vm = relax.VirtualMachine(tvm.compile(mod, target, relax_pipeline=pipe), tvm.cpu())
    got = vm["forward"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    np.testing.assert_allclose(got, untuned_output(mod, target, arrays), rtol=1e-4, atol=1e-4)


def test_parameter_errors_are_clear(target, tmp_path):
    mod, _ = get_model("mlp")
    with pytest.raises(rt.RelaxTuneError, match="fc3.weight"):
        tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
            params={"fc3.weight": np.zeros((2, 2), "float32")}))
    with pytest.raises(rt.RelaxTuneError, match="cpu_weight_prepack"):
        relax.get_pipeline("relax_tune", target=target, work_dir=str(tmp_path),
                           cpu_weight_prepack=True)
    bare = tvm.IRModule({"forward": mod["forward"].without_attr("num_input")})
    with pytest.raises(rt.RelaxTuneError, match="num_input"):
        tvm.compile(bare, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
            lift_transform_params=True))


def _runtime_modules(root) -> list:
    """``root`` and every runtime module it imports."""
    return [root] + [m for sub in root.imports for m in _runtime_modules(sub)]


@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_functions_without_records_get_dlight_schedules(name, target, tmp_path):
    """Compiles for CUDA without a GPU: every kernel must have a thread binding to build."""
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host=target)
    mod, _ = get_model(name)
    _, weights = split_inputs(mod, model_inputs(mod))
    pipe = relax.get_pipeline("relax_tune", target=cuda, work_dir=str(tmp_path),
                              max_trials_global=0, params=weights)
    with cuda:
        out = pipe(mod)
    prims = {gv.name_hint: f for gv, f in out.functions.items() if isinstance(f, tirx.PrimFunc)}
    assert prims and all(f.attrs["tirx.is_scheduled"] for f in prims.values())
    ex = tvm.compile(mod, cuda, relax_pipeline=pipe)
    source = "\n".join(m.inspect_source() for m in _runtime_modules(ex.mod) if m.kind == "cuda")
    assert [n for n in prims if f"{n}_kernel" not in source] == []  # every one a GPU kernel


def test_demo_reports_model_latency_next_to_kernel_sum(target, tmp_path):
    lines: list[str] = []
    result = run_demo(str(tmp_path), max_trials_global=4, target=target,
                              num_trials_per_iter=2, out=lines.append)
    assert result["outputs_match"]
    # (AttachAttrLayoutFreeBuffers, on for bound weights on CPU, renames by adding a digit)
    names = sorted(r.task_name for r in result["reports"])
    assert len(names) == 2 and names[0].startswith("fused_matmul_add_relu") \
        and names[1].startswith("matmul1")
    assert sum(r.trials for r in result["reports"]) == 4
    assert all(r.applied_secs for r in result["reports"])  # every task has a time
    kernels = sum(r.applied_secs * r.weight for r in result["reports"])
    assert result["kernels_secs"] == pytest.approx(kernels) and result["after"].median_secs > 0
    text = "\n".join(lines)
    assert f"sum of the tuned kernels {kernels * 1e6:.1f} us" in text
    assert f"tuned {result['after'].median_secs * 1e6:.1f} us" in text and "overhead" in text
