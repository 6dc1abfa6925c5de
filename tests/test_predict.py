"""The no-measurement compile (measure=False) and a time limit that holds."""

import logging
import re
import os
import time
import types

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te

import relax_tune as rt
from relax_tune.measure import LocalBuilder, LocalRunner
from relax_tune.testing.models import conv_net, model_inputs, split_inputs, transformer_block
from relax_tune.testing.workloads import matmul_mod
from relax_tune.tuning.extract import Task
from relax_tune.space.params import ANN_TILED, target_params
from relax_tune.tuning.predict import (MIN_TILED_FLOPS, MIN_UNTILED_ITERATIONS,
                                       accumulator_registers,
                                       leaves_nothing_to_vectorise, safe_untiled,
                                       power_of_two_compute_vectors, thrashes_l1,
                                       tiles_for_reuse, unrolls_inner_reduction,
                                       vectorises_the_compute, whole_vectors, work_iterations)
from relax_tune.utils import trace_to_json
from relax_tune.work_dir import WorkDir

from model_checks import assert_function_faster, assert_kernel_faster, untuned_output

MODELS = {"conv_net": lambda: conv_net(channels=32, size=32),
          "transformer_block": lambda: transformer_block(seq=64, dim=128, hidden=256)}


class CountingRunner(LocalRunner):
    """A LocalRunner that counts what it is asked to run (a no-measurement session must ask
    nothing)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def run(self, *args, **kwargs):
        self.calls += 1
        return super().run(*args, **kwargs)

    def time_and_fetch(self, *args, **kwargs):
        self.calls += 1
        return super().time_and_fetch(*args, **kwargs)

    def run_and_fetch(self, *args, **kwargs):
        self.calls += 1
        return super().run_and_fetch(*args, **kwargs)


@pytest.mark.parametrize("name", list(MODELS))
def test_no_measurement_compile_times_nothing_is_correct_and_not_slower(name, target,
                                                                        tmp_path):
    mod, _ = MODELS[name]()
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    runner = CountingRunner()
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=str(tmp_path),
                              params=weights, measure=False, runner=runner)
    ex = tvm.compile(mod, target, relax_pipeline=pipe)
    # nothing was timed, built for timing, or recorded as a measurement
    assert runner.calls == 0 and runner._pool is None
    assert len(rt.JSONDatabase(work_dir=str(tmp_path))) == 0
    predicted = WorkDir(str(tmp_path)).open_predicted()
    assert predicted is not None and len(predicted) >= 2
    for record in predicted.database.get_all_tuning_records():
        assert record.run_secs is None
    # correct
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    got = vm["forward"](*args).numpy()
    want = untuned_output(mod, target, arrays)
    # fast-math reassociates long sums: the tolerance follows the outputs' magnitude
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))
    # not slower than the untuned build of the same model (fastest of interleaved calls)
    untuned = tvm.compile(relax.get_pipeline("relax_tune", target=target,
                                             work_dir=str(tmp_path / "none"), params=weights,
                                             max_trials_global=0)(mod), target)
    uvm = relax.VirtualMachine(untuned, tvm.cpu())
    assert_function_faster(vm["forward"], uvm["forward"], args)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_predicted_kernel_is_faster_than_its_untuned_function(name, target, tmp_path,
                                                                    shared_builder,
                                                                    shared_runner):
    """Task by task: each predicted schedule (tiled for reuse, or on a tensor of
    MIN_UNTILED_ITERATIONS or more) against its task's untuned function, both built and
    timed by the tuner's own builder and runner; smaller untiled tasks get none, nor do
    tiled ones under MIN_TILED_FLOPS (conv_net's 1x64 by 64x10 classifier)."""
    mod, _ = MODELS[name]()
    _, weights = split_inputs(mod, model_inputs(mod))
    lowered = rt.transform.lower_for_tuning(mod, target, weights, cpu_weight_prepack=True)
    tasks = rt.extract_tasks(lowered, target)
    reports = rt.tune_tasks(tasks, str(tmp_path), measure=False)
    predicted = WorkDir(str(tmp_path)).open_predicted()
    checked = tiny = 0
    for task, report in zip(tasks, reports):
        sch = predicted.query_schedule(task.mod, target)
        assert (sch is not None) == report.predicted
        if 0 < task.flops < MIN_TILED_FLOPS and work_iterations(task) < MIN_UNTILED_ITERATIONS:
            assert sch is None, task.task_name
            tiny += 1
        if sch is None:
            continue
        assert tiles_for_reuse(trace_to_json(sch.trace)) or \
            work_iterations(task) >= MIN_UNTILED_ITERATIONS, task.task_name
        builds = shared_builder.build(task.mod, target, [None, sch.trace])
        assert all(b.ok for b in builds), [b.error for b in builds]
        assert_kernel_faster(shared_runner, builds[0].artifact_path, builds[1].artifact_path,
                             task.args_info, target, task.task_name)
        checked += 1
    assert checked >= 2 and checked + tiny >= 3


def test_max_time_holds_with_slow_baselines_and_says_what_it_left(tmp_path, target, caplog,
                                                                  own_workers):
    """Sixteen tasks whose untuned functions take a tenth of a second or more, full-size
    pools: the session ends within max_time plus one batch, and the log says which tasks
    the limit left unmeasured and what they keep (on a slow CPU the limit also cuts the
    no-measurement choices short: a Zen 1 chose 6-11 of the 16 in the 8 s)."""
    tasks = []
    # Sixteen: 8 s measured four of them on a Zen 4 (2 threads); ten left too little margin
    # for a faster CPU.
    for n in range(320, 576, 16):
        tasks += rt.extract_tasks(matmul_mod(n), target)
    limit = 8.0
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="relax_tune"):
        reports = rt.tune_tasks(tasks, str(tmp_path), max_time=limit, num_trials_per_iter=4)
    elapsed = time.monotonic() - start
    batch = max(4 * 1.0, 0.5 * limit)  # one batch in flight: builds and timing of 4
    assert elapsed < limit + batch, elapsed
    untried = [r for r in reports if r.trials == 0]
    assert untried, "the limit should leave some task unmeasured"
    assert any(r.predicted for r in untried)
    assert "reached before any candidate of" in caplog.text
    assert "keep their predicted schedules" in caplog.text
    if not all(r.predicted for r in untried):  # a slow CPU: the limit cut the choices short
        assert "keep their untuned code" in caplog.text


def test_a_time_budget_counts_seconds_in_its_progress(tmp_path, target, caplog):
    """Under ``max_time`` alone the progress lines count the limit's seconds, not the 10**9
    trials that stand for "no trial limit" (a resumed session too, whose trials left are
    10**9 less those done), and the no-measurement choices made before the first batch are
    reported, from the first to the last."""
    tasks = rt.extract_tasks(matmul_mod(64), target)
    with caplog.at_level(logging.INFO, logger="relax_tune"):
        rt.tune_tasks(tasks, str(tmp_path), max_time=6, num_trials_per_iter=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "relax_tune.tuning.progress"]
    assert lines[0].startswith("[predicted 0/1 tasks"), lines[:2]
    assert any(line.startswith("[predicted 1/1 tasks") for line in lines)
    assert any(re.match(r"\[\d+ trials, \d+/6 s\] main: ", line) for line in lines), lines
    assert str(10**9) not in caplog.text
    resumed = str(tmp_path / "resumed")
    rt.tune_tasks(tasks, resumed, max_trials_global=2, num_trials_per_iter=2)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="relax_tune"):
        rt.tune_tasks(tasks, resumed, max_time=3, num_trials_per_iter=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "relax_tune.tuning.progress"
             and " trials, " in r.getMessage()]
    assert lines and all(re.match(r"\[\d+ trials, \d+/3 s\] main: ", line) for line in lines)


def test_measure_false_needs_a_work_dir(target):
    with pytest.raises(rt.RelaxTuneError, match="work_dir"):
        rt.tune_tasks(rt.extract_tasks(matmul_mod(64), target), None, measure=False)
    with pytest.raises(rt.RelaxTuneError, match="needs a work_dir"):
        rt.tune_tasks(rt.extract_tasks(matmul_mod(64), target), None, measure=False,
                      database=rt.MemoryDatabase())


def test_max_time_alone_lifts_the_trial_budget():
    assert rt.TuneConfig().trial_budget == 64
    assert rt.TuneConfig(max_time=30).trial_budget > 10**6
    assert rt.TuneConfig(max_time=30, max_trials_global=8).trial_budget == 8


def test_no_measurement_compile_dispatches_dynamic_functions_on_predicted_schedules(
        target, tmp_path, caplog):
    """A model with a dynamic sequence length, compiled with measure=False and hints
    {16, 64}: each symbolic function dispatches to its buckets' predicted schedules
    (nothing timed), correct at sizes below, between, at and past the buckets, and not
    slower than untuned at a hinted size."""
    from test_dynamic import _attention_model

    mod, params = _attention_model(dim=64)
    rng = np.random.default_rng(0)
    weights = {name: rng.uniform(-1, 1, [int(d) for d in p.shape]).astype("float32")
               for name, p in params}
    runner = CountingRunner()
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.apply"):
        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=str(tmp_path / "w"), params=weights,
            shape_hints={"n": [16, 64]}, measure=False, runner=runner))
    assert runner.calls == 0
    dispatched = {r.getMessage().split(":")[0] for r in caplog.records
                  if r.name == "relax_tune.dynamic.apply" and "dispatch over" in r.getMessage()}
    assert len(dispatched) >= 2  # the matmuls at least
    untuned = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path / "none"), params=weights,
        max_trials_global=0))
    vm, uvm = (relax.VirtualMachine(e, tvm.cpu()) for e in (ex, untuned))
    for n in (1, 7, 20, 64, 65):
        x = tvm.runtime.tensor(rng.uniform(-1, 1, (1, n, 64)).astype("float32"))
        np.testing.assert_allclose(vm["forward"](x).numpy(), uvm["forward"](x).numpy(),
                                   rtol=1e-4, atol=1e-4, err_msg=f"n={n}")
    x = tvm.runtime.tensor(rng.uniform(-1, 1, (1, 64, 64)).astype("float32"))
    assert_function_faster(vm["forward"], uvm["forward"], [x])


def _odd_channel_conv():
    """A 3x3 convolution with bias and ReLU on 116 channels (ShuffleNetV2's): 116 is no
    whole number of vectors on any CPU this runs on. (A 1x1 one becomes a matmul,
    graph.PointwiseConvToMatmul; on 7x7 and more, Winograd unless ``winograd=False``.)"""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    class Conv(nn.Module):
        def __init__(self):
            self.conv = nn.Conv2D(116, 116, 3, padding=1)

        def forward(self, x):
            return op.relu(self.conv(x))

    return Conv().export_tvm({"forward": {"x": nn.spec.Tensor((1, 116, 12, 12), "float32")}})


def test_whole_vectors_tells_odd_vector_widths(target):
    mod = matmul_mod(232)  # 29 x 8
    vector_bytes = 32  # 8 floats
    for lanes, whole in ((8, True), (16, True), (2, True), (12, True), (29, False),
                         (58, False), (13, False)):
        sch = tvm.s_tir.Schedule(mod)
        i, j, k = sch.get_loops(sch.get_sblock("C"))
        outer, inner = sch.split(j, [None, lanes])
        sch.reorder(i, outer, k, inner)
        sch.vectorize(inner)
        assert whole_vectors(sch.mod["main"], vector_bytes) == whole, lanes
    assert whole_vectors(mod["main"], vector_bytes)  # nothing vectorised


def _matmul_relu(n: int = 64, m: int = 58) -> tvm.IRModule:
    a = te.placeholder((n, 24), "float32", name="A")
    b = te.placeholder((24, m), "float32", name="B")
    k = te.reduce_axis((0, 24), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((n, m), lambda i, j: te.max(c[i, j], 0.0), name="D")
    return _te_mod(a, b, d)


def test_vectorises_the_compute_looks_at_the_tiled_block_not_its_epilogue():
    """A tiled matmul (its block annotated as the tiling rule does) with its ReLU after it:
    a vector loop over the ReLU alone does not count (ShuffleNetV2's 24 -> 58 channel 1x1
    convolution ran 2,031 us so, scalar, against 187 us untuned, AMD EPYC Zen 4); one over
    the matmul's columns does, and fills half a register at 8 floats of 64 bytes."""
    def schedule(vector_matmul: int, vector_relu: bool) -> tvm.tirx.PrimFunc:
        sch = tvm.s_tir.Schedule(_matmul_relu(m=64))
        block = sch.get_sblock("C")
        sch.annotate(block, ANN_TILED, "SSRSRS")
        i, j, k = sch.get_loops(block)
        if vector_matmul:
            outer, inner = sch.split(j, [None, vector_matmul])
            sch.reorder(i, outer, k, inner)
            sch.vectorize(inner)
        if vector_relu:
            sch.vectorize(sch.get_loops(sch.get_sblock("D"))[-1])
        return sch.mod["main"]

    row = 64 * 4
    assert not vectorises_the_compute(schedule(0, True), 64, row, full=False)
    assert vectorises_the_compute(schedule(4, False), 64, row, full=False)
    assert not vectorises_the_compute(schedule(4, True), 64, row, full=True)
    assert vectorises_the_compute(schedule(8, False), 64, row, full=True)
    assert vectorises_the_compute(_matmul_relu()["main"], 64, row, full=True)  # not tiled


def test_power_of_two_compute_vectors_tells_three_register_accumulators():
    """A tiled matmul's vector loop over 8, 16 or 32 floats spans a power of two bytes; one
    over 12 or 48 floats does not, and a vectorised epilogue does not count."""
    def schedule(lanes: int) -> tvm.tirx.PrimFunc:
        sch = tvm.s_tir.Schedule(_matmul_relu(m=96))
        block = sch.get_sblock("C")
        sch.annotate(block, ANN_TILED, "SSRSRS")
        i, j, k = sch.get_loops(block)
        outer, inner = sch.split(j, [None, lanes])
        sch.reorder(i, outer, k, inner)
        sch.vectorize(inner)
        sch.vectorize(sch.get_loops(sch.get_sblock("D"))[-1])  # 96 floats, not the compute
        return sch.mod["main"]

    for lanes, expected in ((8, True), (16, True), (32, True), (12, False), (48, False)):
        assert power_of_two_compute_vectors(schedule(lanes)) == expected, lanes
    assert power_of_two_compute_vectors(_matmul_relu(m=96)["main"])  # nothing vectorised


def _pointwise_conv_silu(size: int = 14, cin: int = 40, cout: int = 240) -> tvm.IRModule:
    """A 1x1 NHWC convolution with SiLU (EfficientNet's expansion), its weight layout-free."""
    x = te.placeholder((1, size, size, cin), "float32", name="x")
    w = te.placeholder((cout, 1, 1, cin), "float32", name="w")
    rc = te.reduce_axis((0, cin), name="rc")
    conv = te.compute((1, size, size, cout), lambda n, h, v, f: te.sum(
        x[n, h, v, rc] * w[f, 0, 0, rc], axis=rc), name="conv")
    silu = te.compute(conv.shape, lambda *i: conv(*i) * te.sigmoid(conv(*i)), name="silu")
    func = te.create_prim_func([x, w, silu]).with_attr("layout_free_buffers", [1])
    return tvm.IRModule({"main": func})


def test_a_predicted_convolution_accumulates_in_power_of_two_vectors(target, tmp_path,
                                                                      shared_builder,
                                                                      shared_runner):
    """On this convolution the pre-trained model ranks first a schedule whose
    multiply-accumulate runs over 48 floats (three AVX-512 registers; seed 0 on a Zen 4: the
    test fails there without ``power_of_two_compute_vectors``). LLVM moves such an
    accumulator through the stack piece by piece: EfficientNet-B0's 7x7x192 -> 1152 one ran
    1,158 us so against 612 us untuned. The predicted schedule's compute vectors span a power
    of two bytes, and it computes correctly and faster than the untuned function."""
    mod = _pointwise_conv_silu()
    task = Task("fused_conv2d_silu", mod, target, 1)
    (report,) = rt.tune_tasks([task], str(tmp_path), measure=False, seed=0)
    sch = WorkDir(str(tmp_path)).open_predicted().query_schedule(mod, target)
    assert report.predicted and sch is not None
    assert power_of_two_compute_vectors(sch.mod["main"])
    builds = shared_builder.build(mod, target, [None, sch.trace])
    assert all(b.ok for b in builds), [b.error for b in builds]
    untuned, predicted = (shared_runner.run_and_fetch(b.artifact_path, task.args_info, target,
                                                      seed=3)[-1] for b in builds)
    np.testing.assert_allclose(predicted, untuned, rtol=1e-4, atol=1e-4)
    assert_kernel_faster(shared_runner, builds[0].artifact_path, builds[1].artifact_path,
                         task.args_info, target, "1x1 convolution with SiLU")


def test_an_odd_channel_convolution_is_predicted_on_whole_vectors(target, tmp_path,
                                                                   shared_builder,
                                                                   shared_runner):
    """The pre-trained model ranks a candidate on odd vector widths first here (seed 0: the
    test fails without ``whole_vectors``); on ShuffleNetV2's 116-channel 1x1 convolution its
    ten best such ran 1.5x-4x slower than the untuned function on the AMD EPYC
    (docs/results/zen3-epyc.md, session 20). The predicted schedule vectorises whole
    registers instead, and computes correctly."""
    mod, _ = _odd_channel_conv()
    _, weights = split_inputs(mod, model_inputs(mod))
    lowered = rt.transform.lower_for_tuning(mod, target, weights, cpu_weight_prepack=True,
                                            winograd=False)
    (task,) = [t for t in rt.extract_tasks(lowered, target) if "conv2d" in t.task_name]
    (report,) = rt.tune_tasks([task], str(tmp_path), measure=False, seed=0)
    sch = WorkDir(str(tmp_path)).open_predicted().query_schedule(task.mod, target)
    assert report.predicted and sch is not None
    assert whole_vectors(sch.mod["main"], target_params(target).vector_bytes)
    builds = shared_builder.build(task.mod, target, [None, sch.trace])
    assert all(b.ok for b in builds), [b.error for b in builds]
    untuned, predicted = (shared_runner.run_and_fetch(b.artifact_path, task.args_info, target,
                                                      seed=3)[-1] for b in builds)
    np.testing.assert_allclose(predicted, untuned, rtol=1e-4, atol=1e-4)


def _global_average_pool(size: int = 7, channels: int = 1280) -> tvm.IRModule:
    """MobileNetV2's head: the mean of each channel of an NHWC map, as legalised."""
    x = te.placeholder((1, size, size, channels), "float32", name="x")
    kh = te.reduce_axis((0, size), name="kh")
    kw = te.reduce_axis((0, size), name="kw")
    total = te.compute((1, 1, 1, channels), lambda n, h, w, c: te.sum(x[n, kh, kw, c],
                                                                      axis=[kh, kw]),
                       name="total")
    mean = te.compute((1, 1, 1, channels), lambda n, h, w, c: total[n, h, w, c] / size ** 2,
                      name="mean")
    return _te_mod(x, mean)


def test_a_predicted_global_average_pool_starts_its_threads_once(target, tmp_path,
                                                                  shared_builder,
                                                                  shared_runner):
    """A global average pool over 7x7x1280 is a few microseconds of work, as long as a
    thread pool's start: the predicted schedule computes the division inside the sums'
    parallel loop, not in a second one (seed 0 on a Zen 4: the test fails where
    ``leaves_nothing_to_vectorise`` does not see the sums' loop under the parallel one).
    MobileNetV2's ran 2.9 us with two parallel loops against 2.6 untuned and 2.1 with one.
    It computes correctly."""
    mod = _global_average_pool()
    task = Task("mean", mod, target, 1)
    assert work_iterations(task) >= MIN_UNTILED_ITERATIONS
    (report,) = rt.tune_tasks([task], str(tmp_path), measure=False, seed=0)
    sch = WorkDir(str(tmp_path)).open_predicted().query_schedule(mod, target)
    assert report.predicted and sch is not None
    parallel: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body, [(tvm.tirx.For, lambda loop: parallel.append(
        loop) if loop.kind == tvm.tirx.ForKind.PARALLEL else None)])
    assert len(parallel) == 1
    builds = shared_builder.build(mod, target, [None, sch.trace])
    assert all(b.ok for b in builds), [b.error for b in builds]
    untuned, predicted = (shared_runner.run_and_fetch(b.artifact_path, task.args_info, target,
                                                      seed=3)[-1] for b in builds)
    np.testing.assert_allclose(predicted, untuned, rtol=1e-5, atol=1e-5)


def test_the_no_measurement_compile_picks_the_same_schedules_every_time(target, tmp_path):
    """Two no-measurement compiles of the same model into fresh work_dirs record the same
    schedule for every task: the pools are sized in replays, not seconds, so the machine's
    speed at the moment does not change what the model chooses from."""
    mod, _ = MODELS["conv_net"]()
    _, weights = split_inputs(mod, model_inputs(mod))
    lowered = rt.transform.lower_for_tuning(mod, target, weights, cpu_weight_prepack=True)
    tasks = [t for t in rt.extract_tasks(lowered, target) if "conv2d" in t.task_name][:2]
    picks = []
    for run in ("a", "b"):
        rt.tune_tasks(tasks, str(tmp_path / run), measure=False)
        predicted = WorkDir(str(tmp_path / run)).open_predicted()
        picks.append([None if (s := predicted.query_schedule(t.mod, target)) is None
                      else str(s.trace) for t in tasks])
    assert len(tasks) == 2 and None not in picks[0]
    assert picks[0] == picks[1]


def _te_mod(*tensors) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(list(tensors))})


def test_safe_untiled_refuses_sub_register_vectors_and_unrolled_reductions():
    """The two shapes of untiled schedule that ran slower than their untuned loops on the
    AMD EPYC (session 23): a vector narrower than one register, and an innermost reduction
    long enough to vectorise, unrolled explicitly. The same tasks scheduled otherwise pass."""
    vector_bytes = 32
    # an image's NCHW -> NHWC transpose: vectorising the 3 channels is refused
    x = te.placeholder((1, 3, 16, 16), "float32", name="x")
    y = te.compute((1, 16, 16, 3), lambda n, h, w, c: x[n, c, h, w], name="y")
    mod = _te_mod(x, y)
    for vectorised, safe in (("c", False), ("w", True)):
        sch = tvm.s_tir.Schedule(mod)
        n, h, w, c = sch.get_loops(sch.get_sblock("y"))
        sch.parallel(h)
        if vectorised == "w":
            sch.reorder(c, w)
            sch.vectorize(w)
        else:
            sch.vectorize(c)
        assert safe_untiled(sch, vector_bytes) == safe, vectorised
    # a row maximum over 197 int8 values: unrolling the 197 whole is refused, 3 taps are not
    for length, safe in ((197, False), (3, True)):
        a = te.placeholder((64, length), "int8", name="a")
        k = te.reduce_axis((0, length), name="k")
        b = te.compute((64,), lambda i: te.max(a[i, k], axis=k), name="b")
        sch = tvm.s_tir.Schedule(_te_mod(a, b))
        i, _ = sch.get_loops(sch.get_sblock("b"))
        sch.parallel(i)
        sch.annotate(i, "pragma_auto_unroll_max_step", 512)
        sch.annotate(i, "pragma_unroll_explicit", 1)
        assert unrolls_inner_reduction(sch, vector_bytes) == (not safe), length
        assert safe_untiled(sch, vector_bytes) == safe, length
        sch.unannotate(i, "pragma_auto_unroll_max_step")
        assert safe_untiled(sch, vector_bytes)  # left to LLVM's vectoriser


def test_thrashes_l1_finds_a_strided_walk_that_evicts_its_own_lines():
    """BERT's key, transposed by one inlined loop (session 24): its inner loop read 128 rows
    1 KiB apart, 128 lines that fall into 4 of the L1's 64 sets, and ran slower than the
    untuned copies. The indices divide and take remainders, as inlined reshapes leave them.
    Rows 768 bytes apart reach 16 sets, which hold the 128 lines; the walk along a row does
    not thrash; and a candidate that thrashes passes where the untuned function thrashes
    too."""
    def transposed(cols: int, inner: str) -> tvm.s_tir.Schedule:
        x = te.placeholder((128, cols), "float32", name="x")
        heads = cols // 64
        y = te.compute((heads, 64, 128), lambda h, d, s: x[(s * cols + h * 64 + d) // cols,
                                                           (s * cols + h * 64 + d) % cols],
                       name="y")
        sch = tvm.s_tir.Schedule(_te_mod(x, y))
        h, d, s = sch.get_loops(sch.get_sblock("y"))
        if inner == "d":
            sch.reorder(h, s, d)
        sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("y"))[:2]))
        return sch

    assert thrashes_l1(transposed(256, "s"))
    assert not safe_untiled(transposed(256, "s"), 32)
    assert safe_untiled(transposed(256, "s"), 32, untuned_thrashes=True)
    assert not thrashes_l1(transposed(192, "s"))  # 768 bytes apart: 16 sets hold 128 lines
    assert not thrashes_l1(transposed(256, "d"))


def test_a_schedule_that_leaves_nothing_to_vectorise_is_refused():
    """ResNet-18's 7x7x512 Winograd epilogue, predicted as one parallel loop over every
    element with no vector loop (session 25: 39.9 us against 13.4 untuned, whose innermost
    512 channels LLVM vectorises): refused. With the channels left as an inner loop, or
    vectorised, it is not; nor is a row narrower than a register."""
    def epilogue(channels: int, fuse: int, vectorise: bool = False) -> tvm.s_tir.Schedule:
        x = te.placeholder((4, 2 * 2 * 4 * 4 * channels // 4), "float32", name="x")
        y = te.compute((1, 7, 7, channels), lambda n, h, w, c: te.max(
            x[(h % 2) * 2 + w % 2, ((h // 2) * 4 + w // 2) * channels + c], 0.0), name="y")
        sch = tvm.s_tir.Schedule(_te_mod(x, y))
        loops = sch.get_loops(sch.get_sblock("y"))
        fused = sch.fuse(*loops[:fuse])
        sch.parallel(fused)
        if vectorise:
            sch.vectorize(sch.get_loops(sch.get_sblock("y"))[-1])
        return sch

    assert leaves_nothing_to_vectorise(epilogue(512, 4), 32)
    assert not safe_untiled(epilogue(512, 4), 32)
    assert not leaves_nothing_to_vectorise(epilogue(512, 3), 32)  # the channels inner
    assert safe_untiled(epilogue(512, 3), 32)
    assert not leaves_nothing_to_vectorise(epilogue(512, 3, vectorise=True), 32)
    assert not leaves_nothing_to_vectorise(epilogue(4, 4), 32)  # 16-byte rows


def test_work_iterations_counts_what_a_task_computes_not_its_largest_tensor():
    """A gather of one row of a 197 x 192 table computes 192 elements (ViT's class token:
    its largest tensor has 37,824); a reduction counts the elements it reads."""
    table = te.placeholder((197, 192), "float32", name="table")
    row = te.compute((1, 192), lambda i, j: table[0, j], name="row")
    gather = types.SimpleNamespace(mod=_te_mod(table, row), args_info=[
        ["TENSOR", "float32", [197, 192]], ["TENSOR", "float32", [1, 192]]])
    assert work_iterations(gather) == 192 < MIN_UNTILED_ITERATIONS
    a = te.placeholder((591, 197), "float32", name="a")
    k = te.reduce_axis((0, 197), name="k")
    total = te.compute((591,), lambda i: te.sum(a[i, k], axis=k), name="total")
    reduction = types.SimpleNamespace(mod=_te_mod(a, total), args_info=[])
    assert work_iterations(reduction) == 591 * 197


def test_the_workers_choose_the_schedules_this_process_would(target, tmp_path, monkeypatch,
                                                             caplog):
    """A no-measurement session hands whole tasks to the builder's workers
    (``predict_pool``): each worker rebuilds the task's state as the session made it, so
    the predicted schedules are those chosen all in this process (with this process's pool
    sizes: the suite's are smaller than the search's own, ``small_pools``)."""
    import relax_tune.tuning.tune as tune_module

    mod, _ = MODELS["conv_net"]()
    _, weights = split_inputs(mod, model_inputs(mod))
    lowered = rt.transform.lower_for_tuning(mod, target, weights, cpu_weight_prepack=True)
    tasks = rt.extract_tasks(lowered, target)

    def chosen(work_dir: str) -> dict:
        predicted = WorkDir(work_dir).open_predicted()
        schedules = {t.task_name: predicted.query_schedule(t.mod, target) for t in tasks}
        return {name: str(sch.trace) if sch else "None" for name, sch in schedules.items()}

    builder = LocalBuilder()
    try:
        builder.start()
        deadline = time.monotonic() + 120
        while not builder.started and time.monotonic() < deadline:
            time.sleep(0.1)
        with caplog.at_level(logging.INFO, logger="relax_tune"):
            rt.tune_tasks(tasks, str(tmp_path / "workers"), measure=False, builder=builder)
    finally:
        builder.shutdown()
    in_workers = [r.message for r in caplog.records if "chosen in the builder's workers" in
                  r.message]
    assert in_workers and " (0 chosen" not in in_workers[-1], in_workers
    monkeypatch.setattr(tune_module, "worker_session", lambda *args: None)
    rt.tune_tasks(tasks, str(tmp_path / "here"), measure=False)
    here = chosen(str(tmp_path / "here"))
    assert sum(trace != "None" for trace in here.values()) >= 2
    assert chosen(str(tmp_path / "workers")) == here


def test_accumulator_registers_count_the_register_tile():
    # an int8 convolution on VNNI: each register tile holds (vectors of 16 int32 lanes: the
    # channel split's inner factor) x (rows: the width split's inner factor) accumulators
    from relax_tune.space import generate_design_space, space_for_target, without_decisions
    from relax_tune.testing.int8_kernels import integer_kernel

    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
    mod = integer_kernel("conv2d", vnni, channels=64, size=16)
    (sketch,) = generate_design_space(mod, vnni)
    space = space_for_target(vnni)
    seen = set()
    for seed in range(1, 9):  # TVM's seeds start at 1 (0: a random one)
        sch = space.replay(mod, without_decisions(sketch), seed=seed).sch
        vectors, rows = [int(sch.trace.decisions[inst][1]) for inst in sch.trace.insts
                         if inst.kind.name == "SamplePerfectTile"][:2]
        assert accumulator_registers(sch, 64) == vectors * rows
        seen.add(vectors * rows)
    assert len(seen) > 1
    x = te.placeholder((64,), name="x")
    relu = tvm.IRModule({"main": te.create_prim_func(
        [x, te.compute((64,), lambda i: te.max(x[i], 0.0))])})
    assert accumulator_registers(tvm.s_tir.Schedule(relu), 64) is None
