"""A task's baseline on cuda is the target's default schedule (dlight), not the unbound
function (which TVM compiles to host code, no GPU kernel): the builder builds it for the
baseline record and for the correctness check's reference. Without a GPU: the baseline
module is dlight's, it compiles to CUDA kernels, and the builder's baseline library carries
them. With a GPU (``tvm.cuda(0).exist``) a short tuning session also times the baseline and
checks candidates against it; only that test skips without one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, topi

from relax_tune.database import BASELINE_TRACE, JSONDatabase, is_baseline
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import LocalBuilder, LocalRunner
from relax_tune.measure.baseline import baseline_module, uses_default_schedule
from relax_tune.measure.verify import CorrectnessChecker
from relax_tune.search import ReplaySearch
from relax_tune.space.gpu import cuda_source, cuda_target, default_schedule_pass
from relax_tune.tuning.tune import tune_tasks
from relax_tune.utils import RelaxTuneError, normalize_mod

HAS_GPU = tvm.cuda(0).exist
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine")


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


def matmul():
    a, b = _ph((64, 64), "A"), _ph((64, 64), "B")
    return normalize_mod(te.create_prim_func([a, b, topi.matmul(a, b)])), lambda x, y: x @ y


def softmax():
    x = _ph((16, 64), "X")

    def ref(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return normalize_mod(te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])), ref


def row_sum():
    x = _ph((16, 128), "X")
    return normalize_mod(te.create_prim_func([x, topi.sum(x, axis=1)])), lambda v: v.sum(1)


def transpose():
    x = _ph((32, 48), "X")
    return normalize_mod(te.create_prim_func([x, topi.transpose(x)])), lambda v: v.T


ZOO = {"matmul": matmul, "softmax": softmax, "row_sum": row_sum, "transpose": transpose}


@pytest.fixture(scope="module")
def sm80():
    return cuda_target("sm_80")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_cuda_baseline_is_the_dlight_schedule(name, sm80):
    """The baseline module is exactly what dlight's default schedules make of the function
    (what the pipeline compiles when no tuned record wins), and it compiles to CUDA kernels
    bound to GPU threads, where the unbound function gives none."""
    mod, _ = ZOO[name]()
    text = mod.script()
    base = baseline_module(mod, sm80)
    assert mod.script() == text  # the workload itself is left alone (dlight edits in place)
    with sm80:
        expected = default_schedule_pass()(ZOO[name]()[0])
    assert tvm_ffi.structural_equal(base["main"], expected["main"])
    assert not tvm_ffi.structural_equal(base["main"], mod["main"])
    assert bool(base["main"].attrs["tirx.is_scheduled"])
    source = cuda_source(base, sm80)
    assert "__global__" in source and "threadIdx.x" in source
    with pytest.raises(RelaxTuneError, match="no CUDA kernel"):
        cuda_source(mod, sm80)  # the unbound function: host code only


def test_cpu_baseline_is_the_function_as_it_is(target):
    mod, _ = matmul()
    assert not uses_default_schedule(target) and uses_default_schedule(cuda_target("sm_80"))
    assert baseline_module(mod, target) is mod


@pytest.fixture(scope="module")
def one_worker():
    """A LocalBuilder of one worker (every build of a test in the same worker), shared by
    this module's tests."""
    with LocalBuilder(max_workers=1) as builder:
        yield builder


@pytest.mark.parametrize("trace", [None, BASELINE_TRACE], ids=["none", "empty-trace"])
def test_builder_builds_the_cuda_baseline_as_gpu_kernels(trace, sm80, one_worker):
    """What the tuner builds for the baseline record and for the correctness check's
    reference (the trace None, or the baseline's empty trace) is dlight's program: the
    library embeds a CUDA kernel -- its source where TVM's CUDA runtime is not loaded (no
    GPU driver: nvcc or NVRTC compile it on load), else the binary NVRTC or nvcc made of it.
    A tuned candidate built next in the same worker replays on the workload as it was."""
    mod, _ = matmul()
    cand = ReplaySearch(mod, sm80, seed=11).next_candidates(1)[0]
    builder = one_worker
    (build,) = builder.build(mod, sm80, [trace])
    assert build.ok, build.error
    data = open(build.artifact_path, "rb").read()
    (tuned,) = builder.build(mod, sm80, [cand.trace_json])
    assert tuned.ok, tuned.error
    assert b"main_kernel" in data  # the unbound function would be host code: no kernel
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        assert b"__global__" in data and b"threadIdx.x" in data


def _gpu_target() -> tvm.target.Target:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return cuda_target(f"sm_{major}{minor}")


@needs_gpu
@pytest.mark.parametrize("name", ["matmul", "softmax"])
def test_cuda_tuning_times_and_checks_against_the_dlight_baseline(name, tmp_path):
    """On a GPU: the baseline record is valid (dlight's kernel ran; the unbound function
    would run as host code on device memory), the check's reference -- the baseline's
    outputs -- is the right answer, and the best record passes the check against it."""
    target = _gpu_target()
    mod, ref = ZOO[name]()
    tasks = extract_tasks(mod, target)
    (report,) = tune_tasks(tasks, str(tmp_path), max_trials_global=8, num_trials_per_iter=8,
                           check_correctness=True, progress_bar=False)
    assert report.trials == 8 and report.baseline_secs is not None
    db = JSONDatabase(work_dir=str(tmp_path))
    records = db.get_all_tuning_records()
    (base,) = [r for r in records if is_baseline(r)]
    assert base.is_valid and base.mean_run_secs == pytest.approx(report.baseline_secs)
    builder, runner = LocalBuilder(max_workers=1), LocalRunner()
    try:
        checker = CorrectnessChecker(builder, runner)
        got = checker.reference(name, tasks[0].mod, target, tasks[0].args_info)
        assert got is not None
        np.testing.assert_allclose(got[-1], ref(*got[:-1]), rtol=1e-4, atol=1e-4)
        best = db.get_top_k(db.commit_workload(tasks[0].mod), 1)[0]
        if not is_baseline(best):
            (build,) = builder.build(tasks[0].mod, target, [best.trace_json])
            assert build.ok and checker.check(name, tasks[0].mod, target, tasks[0].args_info,
                                              build.artifact_path) is None
    finally:
        builder.shutdown()
        runner.shutdown()


def test_no_measurement_on_cuda_keeps_dlight_and_says_why(sm80, tmp_path, caplog):
    """``measure=False`` on a GPU target: the pre-trained model and the shipped library are
    CPU ones, so nothing is predicted; every task is reported untuned with one warning that
    says why, and the demo model still compiles to dlight's GPU kernels through the pipeline."""
    from tvm import relax

    from relax_tune.demo import demo_inputs, demo_model

    mod, params = demo_model()
    weights = {name: a for (name, _), a in zip(params, demo_inputs(params)[1:])}
    with caplog.at_level("WARNING", logger="relax_tune"):
        ex = tvm.compile(mod, sm80, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=sm80, work_dir=str(tmp_path), measure=False, params=weights))
    (line,) = [r.getMessage() for r in caplog.records if "measure=False" in r.getMessage()]
    assert "measure=False on cuda" in line and "dlight" in line
    kinds, stack = [], [ex.mod]
    while stack:
        kinds.append(stack[-1].kind)
        stack.extend(stack.pop().imports)
    assert "cuda" in kinds  # GPU kernels: dlight bound every function to blocks and threads
    reports = tune_tasks(extract_tasks(matmul()[0], sm80), str(tmp_path / "direct"),
                         measure=False)
    assert reports and all(r.status == "untuned" and not r.predicted for r in reports)
