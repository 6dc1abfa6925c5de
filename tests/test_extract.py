"""Task extraction: names, weights, hashing, op_names filtering, skips."""

import logging

import pytest
import tvm
from tvm import relax, te
from tvm.script import tirx as T

import relax_tune as rt
from relax_tune.demo import demo_model
from relax_tune.tuning.extract import call_tir_counts


def test_demo_tasks_names_and_weights(demo, target):
    lowered, _ = demo
    tasks = rt.extract_tasks(lowered, target)
    assert {t.task_name: t.weight for t in tasks} == {
        "transpose": 1, "transpose1": 1, "matmul1": 1, "fused_matmul_add_relu": 1}
    for t in tasks:
        assert list(t.mod.functions.keys())[0].name_hint == "main"
        assert t.shash == rt.utils.structural_hash(t.mod)
        assert t.target.same_as(target) or str(t.target) == str(target)


def test_weight_counts_call_sites_and_merges_equal_functions(target):
    from tvm.relax.frontend import nn

    class Twice(nn.Module):
        def forward(self, x):
            b = nn.op.relu(nn.op.relu(x))
            return nn.op.add(b, b)

    mod, _ = Twice().export_tvm({"forward": {"x": nn.spec.Tensor((4, 8), "float32")}})
    with target:
        lowered = relax.transform.LegalizeOps()(mod)
    assert sum(call_tir_counts(lowered).values()) == 3
    tasks = rt.extract_tasks(lowered, target)
    by_name = {t.task_name: t for t in tasks}
    relu = by_name["relu"]
    assert relu.weight == 2 and by_name["add"].weight == 1, by_name
    assert len(tasks) == 2


def test_same_computation_same_hash_across_models(target):
    first, second = demo_model(), demo_model()
    with target:
        a = relax.get_pipeline("zero")(first[0])
        b = relax.get_pipeline("zero")(second[0])
        # after AttachGlobalSymbol the functions carry their own global_symbol
        b = relax.transform.AttachGlobalSymbol()(b)
    ha = {t.task_name: t.shash for t in rt.extract_tasks(a, target)}
    hb = {t.task_name: t.shash for t in rt.extract_tasks(b, target)}
    assert ha == hb


def test_op_names_filter_and_no_duplicates(demo, target):
    lowered, _ = demo
    tasks = rt.extract_tasks(lowered, target, op_names=["matmul", "add", "relu"])
    names = [t.task_name for t in tasks]
    assert sorted(names) == ["fused_matmul_add_relu", "matmul1"]
    assert len(set(t.shash for t in tasks)) == len(tasks)


def test_unknown_op_name_is_a_clear_error(demo, target):
    lowered, _ = demo
    with pytest.raises(rt.RelaxTuneError, match="conv2d.*match no tunable function"):
        rt.extract_tasks(lowered, target, op_names=["matmul", "conv2d"])
    with pytest.raises(rt.RelaxTuneError, match="list of strings"):
        rt.extract_tasks(lowered, target, op_names="matmul")


def test_not_a_target_is_a_clear_error(demo):
    lowered, _ = demo
    with pytest.raises(rt.RelaxTuneError, match="not a TVM target"):
        rt.extract_tasks(lowered, "no-such-target")
    with pytest.raises(rt.RelaxTuneError, match="no target given"):
        rt.extract_tasks(lowered)


def test_tir_module_and_dynamic_shape_at_default_sizes(target, caplog):
    @T.prim_func(s_tir=True)
    def dyn(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        for i in range(n):
            with T.sblock("B"):
                vi = T.axis.spatial(n, i)
                B[vi] = A[vi] * T.float32(2)

    A = te.placeholder((16, 16), name="A")
    B = te.compute((16, 16), lambda i, j: A[j, i], name="B")
    static = te.create_prim_func([A, B])
    mod = tvm.IRModule({"dyn": dyn, "transpose": static})
    with caplog.at_level(logging.INFO, logger="relax_tune"):
        tasks = rt.extract_tasks(mod, target)
    assert [t.task_name for t in tasks] == [f"dyn[n={s}]" for s in (1, 4, 16, 64, 256, 1024)] \
        + ["transpose"]
    assert "dyn: symbolic n tuned at the default sizes" in caplog.text


def test_extract_tasks_pass_leaves_module_unchanged(demo, target):
    lowered, _ = demo
    pass_ = rt.ExtractTasks(op_names=["transpose"])
    with target:
        out = tvm.ir.transform.Sequential([pass_])(lowered)
    tvm.ir.assert_structural_equal(out, lowered)
    assert sorted(t.task_name for t in pass_.tasks) == ["transpose", "transpose1"]


def test_reshapes_of_contiguous_tensors_are_views_not_tasks(target):
    """The backend turns such reshapes into views (no kernel runs); the pipeline's lowering
    does it before extraction, so no trial goes to them."""
    from tvm.relax.frontend import nn

    class MatmulReshape(nn.Module):
        def forward(self, x, w):
            return nn.op.softmax(nn.op.reshape(nn.op.matmul(x, w), [2, 4, 16]), axis=-1)

    spec = {"forward": {"x": nn.spec.Tensor((8, 16), "float32"),
                        "w": nn.spec.Tensor((16, 16), "float32")}}
    mod, _ = MatmulReshape().export_tvm(spec)
    with target:
        legalized = relax.transform.LegalizeOps()(mod)
    assert any("reshape" in gv.name_hint for gv in legalized.get_global_vars())
    names = [t.task_name for t in rt.extract_tasks(rt.transform.lower_for_tuning(mod, target),
                                                   target)]
    assert names and not any("reshape" in n for n in names), names


def test_a_task_costs_its_flops_and_the_bytes_it_moves(target):
    """``Task.cost`` (the first round's order): FLOPs plus ``BYTE_FLOPS`` per byte of the
    arguments. A depthwise-like task that streams a large activation for few FLOPs comes
    before a small matmul with more FLOPs, as it does in a model's time."""
    from relax_tune.tuning.extract import BYTE_FLOPS

    n = 64
    a, b = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    mm = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    x = te.placeholder((1, 64, 64, 64), name="x")
    relu = te.compute(x.shape, lambda *i: te.max(x(*i), 0.0), name="relu")
    mod = tvm.IRModule({"matmul": te.create_prim_func([a, b, mm]),
                        "relu": te.create_prim_func([x, relu])})
    tasks = {t.task_name: t for t in rt.extract_tasks(mod, target)}
    matmul, act = tasks["matmul"], tasks["relu"]
    assert matmul.cost == pytest.approx(matmul.flops + BYTE_FLOPS * 3 * n * n * 4)
    assert act.cost == pytest.approx(act.flops + BYTE_FLOPS * 2 * 64 ** 3 * 4)
    assert matmul.flops > act.flops and act.cost > matmul.cost
