"""Layout rewrite of constant weights: candidates that pack a weight compute the right
answer through the measurement path (packing once, then the kernel), and the "relax_tune"
pipeline folds the packing into the weights at compile time."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi

import relax_tune as rt
from relax_tune.measure import prepack
from relax_tune.testing.models import get_model, model_inputs, split_inputs
from relax_tune.search import ReplaySearch
from relax_tune.space.cpu.layout_rewrite import (PREPROC_ANNOTATION, has_layout_rewrite,
                                             split_layout_rewrite)
from relax_tune.utils import args_info, normalize_mod, trace_to_json

from model_checks import assert_lifted_weights_swappable, untuned_output

N_CANDIDATES = 8


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


def _weighted(tensors, free):
    return normalize_mod(te.create_prim_func(list(tensors)).with_attr("layout_free_buffers",
                                                                      free))


def matmul():
    a, b = _ph((64, 96), "A"), _ph((96, 80), "B")
    return _weighted([a, b, topi.matmul(a, b)], [1]), lambda x, y: x @ y


def dense_bias_relu():
    x, w, bias = _ph((16, 64), "X"), _ph((48, 64), "W"), _ph((48,), "bias")
    y = topi.nn.relu(topi.add(topi.nn.dense(x, w), bias))
    return _weighted([x, w, bias, y], [1, 2]), lambda u, v, c: np.maximum(u @ v.T + c, 0)


def conv2d():
    x, w = _ph((1, 8, 12, 12), "X"), _ph((16, 8, 3, 3), "W")

    def ref(u, v):
        up = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(up, (3, 3), axis=(2, 3))
        return np.einsum("ncyxij,fcij->nfyx", win, v)

    return _weighted([x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)], [1]), ref


WORKLOADS = {f.__name__: f for f in (matmul, dense_bias_relu, conv2d)}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_packed_candidates_match_numpy_through_the_runner(name, target, shared_builder,
                                                          shared_runner):
    mod, ref = WORKLOADS[name]()
    cands = ReplaySearch(mod, target, seed=7).next_candidates(N_CANDIDATES)
    assert len(cands) == N_CANDIDATES
    assert all(has_layout_rewrite(c.sch.mod["main"]) for c in cands)
    info = args_info(mod)
    builder, runner = shared_builder, shared_runner
    builds = builder.build(mod, target, [c.trace_json for c in cands])
    assert all(b.ok for b in builds), [b.error for b in builds]
    # every packed candidate is built as kernel + packing function with a plan beside it
    assert all(prepack.read_plan(b.artifact_path) for b in builds)
    for cand, build in zip(cands, builds):
        arrays = runner.run_and_fetch(build.artifact_path, info, target, seed=3)
        np.testing.assert_allclose(arrays[-1], ref(*arrays[:-1]), rtol=1e-4, atol=1e-5,
                                   err_msg=str(cand.sch.trace))
    timed = runner.run([b.artifact_path for b in builds[:2]], info, target)
    assert all(r.ok for r in timed), [r.error for r in timed]
    builder.discard([b.artifact_path for b in builds])
    assert not any(os.path.exists(path) for b in builds
                   for path in (b.artifact_path, prepack.plan_path(b.artifact_path)))


def test_the_packed_weight_is_read_in_the_kernels_own_order(target):
    mod, _ = matmul()
    cand = ReplaySearch(mod, target, seed=11).next_candidates(1)[0]
    kernel, pack, plan = split_layout_rewrite(cand.sch.mod["main"])
    assert plan.args == [1]
    packed = kernel.params[1]
    assert len(packed.shape) > 2  # tiled: the weight becomes a blocked, higher-rank array
    assert [int(d) for d in packed.shape] == plan.shapes[0]
    assert np.prod(plan.shapes[0]) == 96 * 80  # a permutation of the weight, nothing padded
    assert not has_layout_rewrite(kernel) and PREPROC_ANNOTATION not in kernel.script()


def test_a_padded_weight_is_padded_once_in_the_packing_function(target, shared_builder,
                                                                 shared_runner):
    """A 1x288 by 288x72 matmul: 72 columns are no whole number of AVX-512 vectors, so a
    sketch pads them to the lanes. The padded copy of the weight is the packing block:
    it runs once, in the packing function, and the kernel reads the padded weight in its
    own order (in every call, it took 25 us against 6.7 untuned); the candidates compute
    the product through the runner."""
    from relax_tune.space import generate_design_space, space_for_target, without_decisions

    a, b = _ph((1, 288), "A"), _ph((288, 72), "B")
    mod = _weighted([a, b, topi.matmul(a, b)], [1])
    lanes = rt.space.target_params(target).lanes("float32")
    sketches = [s for s in generate_design_space(mod, target)
                if any(i.kind.name == "PadEinsum" for i in s.insts)]
    assert sketches or 72 % lanes == 0  # 8-lane AVX2 tiles 72 without padding
    space = space_for_target(target)
    cands = [out.sch for s in sketches for seed in (3, 5)
             if (out := space.replay(mod, without_decisions(s), seed=seed)).ok]
    assert len(cands) == 2 * len(sketches)
    for sch in cands:
        kernel, pack, plan = split_layout_rewrite(sch.mod["main"])
        assert plan.args == [1] and np.prod(plan.shapes[0]) >= 288 * 80  # padded
        assert "if_then_else" in pack.script() and "if_then_else" not in kernel.script()
    if not cands:
        return
    builds = shared_builder.build(mod, target, [trace_to_json(c.trace) for c in cands])
    assert all(bd.ok for bd in builds), [bd.error for bd in builds]
    for build in builds:
        arrays = shared_runner.run_and_fetch(build.artifact_path, args_info(mod), target, seed=3)
        np.testing.assert_allclose(arrays[-1], arrays[0] @ arrays[1], rtol=1e-4, atol=1e-5)
    shared_builder.discard([bd.artifact_path for bd in builds])


def test_functions_without_layout_free_buffers_are_not_packed(target):
    a, b = _ph((64, 96), "A"), _ph((96, 80), "B")
    mod = normalize_mod(te.create_prim_func([a, b, topi.matmul(a, b)]))
    cands = ReplaySearch(mod, target, seed=7).next_candidates(4)
    assert len(cands) == 4 and not any(has_layout_rewrite(c.sch.mod["main"]) for c in cands)


def test_pipeline_prepacks_bound_weights_at_compile_time(target, tmp_path):
    mod, _ = get_model("mlp")
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    work_dir = str(tmp_path)
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                              max_trials_global=6, num_trials_per_iter=3, params=weights,
                              cpu_weight_prepack=True)
    vm = relax.VirtualMachine(tvm.compile(mod, target, relax_pipeline=pipe), tvm.cpu())
    got = vm["forward"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    np.testing.assert_allclose(got, untuned_output(mod, target, arrays), rtol=1e-4, atol=1e-4)
    # the tuned records pack weights, and after the database is applied the packing is
    # split out of the kernels and folded into constants: no packing call is left
    records = rt.JSONDatabase(work_dir=work_dir).get_all_tuning_records()
    assert any("transform_layout" in str(r.trace) for r in records)
    with target:
        lowered = tvm.transform.Sequential(rt.transform.lowering_passes(
            target, cpu_weight_prepack=True))(rt.transform.bind_params(mod, weights))
        applied = tvm.transform.Sequential([
            rt.ApplyDatabase(work_dir=work_dir), relax.transform.SplitLayoutRewritePreproc(),
            relax.transform.FoldConstant()])(lowered)
    names = [gv.name_hint for gv, f in applied.functions.items()]
    prepacked = [n for n in names if n.endswith("_prepacked")]
    assert prepacked, names
    assert [n for n in names if n.endswith("_weight_prepack")], names
    forward = applied["forward"].script()
    assert "_prepacked" in forward and "_weight_prepack" not in forward  # folded away


def test_pipeline_prepacks_lifted_weights_in_transform_params(target, tmp_path):
    """Lifted weights are packed by forward_transform_params; the tasks are the bound
    model's, so records tuned with bound weights serve the lifted build too."""
    mod, _ = get_model("mlp")
    inputs, weights = split_inputs(mod, model_inputs(mod))
    tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=6,
        num_trials_per_iter=3, params=weights))
    pipe = relax.get_pipeline("relax_tune", target=target, work_dir=str(tmp_path),
                              max_trials_global=0, lift_transform_params=True)
    packed = assert_lifted_weights_swappable(mod, target, pipe)
    assert any(len(w.shape) > 2 for w in packed)  # 2-D weights came out blocked
