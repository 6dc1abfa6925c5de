"""Fused attention: the graph pass groups each attention into one kernel, the function rule
schedules it, and what it makes computes softmax(q k^T / sqrt(d)) v at static and dynamic
sizes, through the "relax_tune" pipeline."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

import relax_tune as rt
from relax_tune.testing import models
from relax_tune.space import space_for_target
from relax_tune.space.cpu.attention import FusedAttention
from relax_tune.space.generator import without_decisions
from relax_tune.space.params import target_params

HEADS, HEAD_DIM = 2, 16


def attention_model(seq="n", expose_probs=False):
    """``softmax(q k^T / 4) v`` over inputs q, k, v of shape (1, 2, seq, 16); with
    ``expose_probs`` the softmax is returned as well (a second use)."""

    class Attention(nn.Module):
        def forward(self, q, k, v):
            probs = op.softmax(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])) * 0.25, axis=-1)
            out = op.matmul(probs, v)
            return (out, probs) if expose_probs else out

    spec = {name: nn.spec.Tensor((1, HEADS, seq, HEAD_DIM), "float32") for name in "qkv"}
    mod, _ = Attention().export_tvm({"forward": spec})
    return mod


def reference(q, k, v):
    s = q @ k.transpose(0, 1, 3, 2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, HEADS, n, HEAD_DIM)).astype("float32") for _ in "qkv"]


def kernel_names(mod):
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("name", ["bert_layer", "llama_block", "transformer_block"])
def test_each_attention_becomes_one_kernel(name, target):
    """BERT's scaled scores, Llama's masked ones (a call_tir) and a static-size block: one
    ``attention`` kernel, no softmax kernel left."""
    kwargs = {"dim": 32, "heads": 2, "hidden": 64}
    mod, _ = getattr(models, name)(**kwargs)
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target)
    names = kernel_names(lowered)
    assert "attention" in names and not any("softmax" in n for n in names), names


def test_softmax_used_elsewhere_stays_separate(target):
    """A softmax whose result is also returned is not fused (it must be written whole)."""
    with target:
        lowered = rt.transform.lower_for_tuning(attention_model(16, expose_probs=True), target)
    names = kernel_names(lowered)
    assert "attention" not in names and any("softmax" in n for n in names), names


def test_static_keys_no_multiple_of_16_are_fused_on_padded_operands(target):
    """20 keys in a static kernel: the attention runs on rows and keys padded to 32 (else
    the last vector of keys is predicated and the loop runs scalar), the padded keys'
    scores masked; one attention kernel on the padded shapes, no softmax kernel, and the
    untuned model's output as numpy's."""
    with target:
        lowered = rt.transform.lower_for_tuning(attention_model(20), target)
    names = kernel_names(lowered)
    assert "attention" in names and not any("softmax" in n for n in names), names
    (task,) = [t for t in rt.extract_tasks(lowered, target) if t.task_name == "attention"]
    shapes = [arg[2] for arg in task.args_info]  # q, k transposed, v, the output
    assert shapes == [[1, 2, 32, 16], [1, 2, 16, 32], [1, 2, 32, 16], [1, 2, 32, 16]], shapes
    args = inputs(20)
    lib = tvm.compile(lowered, target)
    out = relax.VirtualMachine(lib, tvm.cpu())["forward"](*map(tvm.runtime.tensor, args))
    np.testing.assert_allclose(out.numpy(), reference(*args), rtol=1e-4, atol=1e-5)


def test_padded_cross_attention_of_a_batch_is_right(target):
    """5 query rows against 21 keys, a batch of 2 x 3 heads, scaled: rows and keys padded
    (to 16 and 32), one attention kernel, the output as numpy's, the padded rows gone."""
    bb = relax.BlockBuilder()
    shapes = {"q": (2, 3, 5, 16), "k": (2, 3, 16, 21), "v": (2, 3, 21, 8)}
    q, k, v = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items())
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = bb.emit(relax.op.multiply(relax.op.matmul(q, k),
                                               relax.const(0.25, "float32")))
            out = bb.emit_output(bb.emit(relax.op.matmul(
                relax.op.nn.softmax(scores, axis=-1), v)))
        bb.emit_func_output(out)
    with target:
        lowered = rt.transform.lower_for_tuning(bb.get(), target)
    names = kernel_names(lowered)
    assert "attention" in names and not any("softmax" in n for n in names), names
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in shapes.values()]
    got = relax.VirtualMachine(tvm.compile(lowered, target), tvm.cpu())["main"](
        *map(tvm.runtime.tensor, args)).numpy()
    s = args[0] @ args[1] * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, p / p.sum(-1, keepdims=True) @ args[2],
                               rtol=1e-4, atol=1e-5)


def _attention_task(target, n):
    """The fused kernel specialised at ``n`` (a static one needs a multiple of 16 keys)."""
    with target:
        lowered = rt.transform.lower_for_tuning(attention_model(), target)
    (task,) = rt.extract_tasks(lowered, target, op_names=["attention"],
                               shape_hints={"n": [n]})
    return task


@pytest.mark.parametrize("n", [5, 28, 48])
def test_rule_schedules_the_fused_kernel_and_its_candidates_are_right(n, target):
    """The design space of the fused kernel is the rule's one sketch; random candidates
    compute the attention, at sizes that are no multiple of the vector width too (their
    last vector of keys is partial)."""
    task = _attention_task(target, n)
    space = space_for_target(target)
    (sketch,) = space.generate_design_space(task.mod)
    assert "compute_at" in str(sketch) and "attention" in str(sketch)
    args = inputs(n)
    want = reference(*args)
    done = 0
    for seed in range(1, 25):
        replayed = space.replay(task.mod, without_decisions(sketch), seed=seed)
        if not replayed.ok:
            continue  # a register tile past the budget: redrawn in the search
        lib = tvm.compile(replayed.sch.mod, target)
        out = tvm.runtime.tensor(np.full_like(want, np.nan))
        q, k, v = args  # the kernel reads k transposed, as the model's permute_dims makes it
        kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
        lib(*[tvm.runtime.tensor(a) for a in (q, kt, v)], out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
        done += 1
    assert done >= 2


def test_rule_leaves_other_functions_alone(target):
    """A matmul is not an attention: no sketch from the rule, the block rules schedule it."""
    from tvm import te

    a, b = te.placeholder((32, 32), name="a"), te.placeholder((32, 32), name="b")
    r = te.reduce_axis((0, 32), "r")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    sch = tvm.s_tir.Schedule(mod)
    assert FusedAttention(target_params(target)).sketches(sch) == []
    sketches = space_for_target(target).generate_design_space(mod)
    assert all("SSRSRS" in str(s) for s in sketches)  # multi-level tiling's sketches


def test_dynamic_attention_through_the_pipeline(target, tmp_path, caplog):
    """Tuned at n = 16 and 64 (two trials per task, every bucket's schedule applied), the
    fused attention matches numpy at 1, 7, 64, 65, 100 and 131 (past the largest bucket:
    its kernel)."""
    mod = attention_model()
    hints = {"n": [16, 64]}
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target)
    tasks = rt.extract_tasks(lowered, target, shape_hints=hints, op_names=["attention"])
    assert [t.task_name for t in tasks] == ["attention[n=16]", "attention[n=64]"]
    work = str(tmp_path / "work")
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.apply"):
        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=work, max_trials_global=2 * len(tasks),
            shape_hints=hints, op_names=["attention"], num_trials_per_iter=2,
            measure_baseline=False, dispatch_ranking=0, dispatch_plan=False,
            head_to_head_rounds=0, progress_bar=False))
    # the pipeline's ApplyDatabase replaced the function by its dispatch over both buckets
    assert [r.getMessage().split(":")[0] for r in caplog.records
            if r.name == "relax_tune.dynamic.apply" and "dispatch over" in r.getMessage()] \
        == ["attention"]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in (1, 7, 64, 65, 100, 131):
        args = inputs(n, seed=n)
        out = vm["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        np.testing.assert_allclose(out, reference(*args), rtol=1e-4, atol=1e-5,
                                   err_msg=f"n={n}")


@pytest.mark.parametrize("n", [16, 20])
def test_nn_attention_is_written_as_the_fusable_ops(n, target):
    """``R.nn.attention`` (what the PyTorch frontend makes of scaled_dot_product_attention,
    (batch, seq, heads, dim) layout) becomes the fused kernel the rule schedules, over 20
    static keys too (padded to 32), and the model still computes the attention; a causal
    one is left to TVM."""

    def module(causal, seq=n):
        bb = relax.BlockBuilder()
        params = [relax.Var(name, relax.TensorType((1, seq, HEADS, HEAD_DIM), "float32"))
                  for name in "qkv"]
        with bb.function("forward", params):
            with bb.dataflow():
                out = bb.emit_output(bb.emit(relax.op.nn.attention(
                    *params, causal_mask="TopLeft" if causal else None)))
            bb.emit_func_output(out)
        return bb.get()

    rule = FusedAttention(target_params(target))
    with target:
        lowered = rt.transform.lower_for_tuning(module(False), target)
        causal = rt.transform.lower_for_tuning(module(True), target)
    assert not any(rule.recognise(tvm.s_tir.Schedule(t.mod))
                   for t in rt.extract_tasks(causal, target))
    (task,) = rt.extract_tasks(lowered, target, op_names=["attention"])
    assert rule.recognise(tvm.s_tir.Schedule(task.mod))
    ex = tvm.compile(lowered, target)
    args = inputs(n)
    bsnh = [np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in args]
    out = relax.VirtualMachine(ex, tvm.cpu())["forward"](
        *[tvm.runtime.tensor(a) for a in bsnh]).numpy()
    want = reference(*args).transpose(0, 2, 1, 3)  # its scale 1 / sqrt(16): the reference's
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
