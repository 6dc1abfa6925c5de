"""Dynamic shapes: shape hints, one task per hinted size, the dispatching function
ApplyDatabase builds from the buckets' records, correct at every size (1, a prime, between
buckets, beyond the largest)."""

from __future__ import annotations

import logging
import os
import zlib

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.script import tirx as T

import relax_tune as rt
from relax_tune import dynamic
from relax_tune.testing import models
from relax_tune.dynamic import dynamic_base
from relax_tune.space import space_for_target, without_decisions
from relax_tune.utils import RelaxTuneError, normalize_mod, trace_to_json

# ---------------------------------------------------------------------------------------
# Hints


def test_hint_forms_and_defaults():
    assert dynamic.normalize_hints({"n": [64, 16]}) == {"n": {16: 1.0, 64: 1.0}}
    assert dynamic.normalize_hints({"n": {16: 2, 64: 0.5}}) == {"n": {16: 2.0, 64: 0.5}}
    assert dynamic.normalize_hints("n=1,16:3;m=8") == {"n": {1: 1.0, 16: 3.0}, "m": {8: 1.0}}
    assert dynamic.parse_shape_hints(["n=4", "m=2,1"]) == {"n": {4: 1.0}, "m": {1: 1.0, 2: 1.0}}
    assert dynamic.default_sizes() == [1, 4, 16, 64, 256, 1024]
    assert dynamic.default_sizes(300) == [1, 4, 16, 64, 256, 300]
    assert rt.TuneConfig(shape_hints={"n": [16]}).shape_hints == {"n": {16: 1.0}}


@pytest.mark.parametrize("text, message", [
    ("n", "NAME=SIZE"),
    ("=1,2", "NAME=SIZE"),
    ("n=", "not a positive integer size"),
    ("n=1,x", "'x' is not a positive integer size"),
    ("n=0", "'0' is not a positive integer size"),
    ("n=-4", "is not a positive integer size"),
    ("n=16:0", "weight '0' of size 16"),
    ("n=16:abc", "weight 'abc' of size 16"),
    ("n=1;n=2", "'n' is given twice"),
    ("", "no sizes given"),
])
def test_hint_parser_errors(text, message):
    with pytest.raises(RelaxTuneError, match=message):
        dynamic.parse_shape_hints(text)


@pytest.mark.parametrize("hints, message", [
    ({"n": []}, "is empty"),
    ({"n": [0]}, "size 0 is not a positive integer"),
    ({"n": [16.5]}, "size 16.5 is not a positive integer"),
    ({"n": {16: -1}}, "weight -1 of size 16"),
    ({"n": 16}, "must be a list of sizes"),
    ({3: [16]}, "is not a symbolic variable name"),
    ([16, 64], "must be a dict"),
])
def test_bad_hints_stop_the_user_at_once(hints, message, tmp_path):
    with pytest.raises(RelaxTuneError, match=message):
        rt.TuneConfig(shape_hints=hints)
    with pytest.raises(RelaxTuneError, match=message):
        rt.TuneIRMod(work_dir=str(tmp_path / "w"), shape_hints=hints)
    with pytest.raises(RelaxTuneError, match=message):
        rt.ApplyDatabase(work_dir=str(tmp_path / "w"), shape_hints=hints)


def test_cli_dynamic_errors_exit_2(capsys):
    from relax_tune.cli import commands as cli

    code = cli.main(["tune", "relax_tune.testing.models:llama_block", "--work-dir", "unused",
                     "--trials", "1", "--dynamic", "n=1,sixteen"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("relax-tune: error:") and "'sixteen' is not a positive integer" in err


# ---------------------------------------------------------------------------------------
# Extraction


@T.prim_func(s_tir=True)
def _double(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(8)), "float32")
    B = T.match_buffer(b, (n, T.int64(8)), "float32")
    for i, j in T.grid(n, T.int64(8)):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


@T.prim_func(s_tir=True)
def _computed_dim(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n * T.int64(2),), "float32")
    B = T.match_buffer(b, (n * T.int64(2),), "float32")
    for i in range(n * T.int64(2)):
        with T.sblock("B"):
            vi = T.axis.spatial(n * T.int64(2), i)
            B[vi] = A[vi] + T.float32(1)


def test_one_static_task_per_hinted_size(target):
    mod = tvm.IRModule({"double": _double})
    tasks = rt.extract_tasks(mod, target, shape_hints={"n": {16: 3.0, 64: 1.0}})
    assert [t.task_name for t in tasks] == ["double[n=16]", "double[n=64]"]
    assert [t.shape for t in tasks] == [{"n": 16}, {"n": 64}]
    assert [t.weight for t in tasks] == [3, 1]
    assert [t.args_info[0][2] for t in tasks] == [[16, 8], [64, 8]]
    assert len({t.shash for t in tasks}) == 2
    for task in tasks:  # ordinary static workloads: what MetaSchedule would store
        assert not rt.utils.dynamic_shape_vars(task.mod["main"])
        assert tvm_ffi.structural_equal(task.mod, normalize_mod(task.mod))


def test_default_sizes_follow_the_upper_bound_and_are_logged(target, caplog):
    mod, _ = models.bert_layer(dim=32, heads=2, hidden=64, max_seq=100)
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target)
    with caplog.at_level(logging.INFO, logger="relax_tune"):
        tasks = rt.extract_tasks(lowered, target, op_names=["attention"])
    assert [t.task_name for t in tasks] == [f"attention[n={s}]" for s in (1, 4, 16, 64, 100)]
    assert "default sizes n=1, n=4, n=16, n=64, n=100" in caplog.text


def test_unspecialisable_function_is_a_logged_skip(target, caplog):
    mod = tvm.IRModule({"computed": _computed_dim, "double": _double})
    with caplog.at_level(logging.WARNING, logger="relax_tune"):
        tasks = rt.extract_tasks(mod, target, shape_hints={"n": [4]})
    assert [t.task_name for t in tasks] == ["double[n=4]"]
    assert "skipping computed: dynamic shape" in caplog.text


# ---------------------------------------------------------------------------------------
# ApplyDatabase without records


def _attention_model(dim: int = 16):
    class Attention(nn.Module):
        def __init__(self):
            self.ln = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, dim)

        def forward(self, x):
            h = self.fc(self.ln(x))
            scores = op.matmul(h, op.permute_dims(h, [0, 2, 1])) * (1.0 / dim**0.5)
            return op.matmul(op.softmax(scores, axis=-1), h)

    return Attention().export_tvm({"forward": {"x": nn.spec.Tensor((1, "n", dim), "float32")}})


def test_apply_database_without_records_leaves_symbolic_functions_unchanged(target, tmp_path):
    mod, _ = _attention_model()
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target)
    # a database holding records of another workload only
    rt.tune_tir(dynamic.specialize(_double, {"n": 8}), target, str(tmp_path / "w"),
                max_trials_global=1, num_trials_per_iter=1, progress_bar=False)
    apply = rt.ApplyDatabase(work_dir=str(tmp_path / "w"), shape_hints={"n": [8, 16]})
    with target:
        out = apply(lowered)
    tvm.ir.assert_structural_equal(out, lowered)
    assert apply.applied == []


# ---------------------------------------------------------------------------------------
# The dispatching function: a dynamic zoo

BUCKETS = (16, 64)
SIZES = (1, 13, 16, 17, 33, 64, 65, 131)
"""1, a prime, a bucket, between buckets (nearer the smaller, nearer the larger), the
largest bucket, beyond it (the largest bucket's kernel, at sizes no tile divides)."""


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


def _zoo(name: str):
    """``(PrimFunc with symbolic n, numpy reference)`` per operator of the zoo that takes
    a symbolic dimension."""
    n = tirx.Var("n", "int64")
    if name == "matmul":
        a, b = _ph((n, 64), "A"), _ph((64, 48), "B")
        return [a, b, topi.matmul(a, b)], lambda x, y: x @ y
    if name == "dense":
        x, w = _ph((n, 64), "X"), _ph((32, 64), "W")
        return [x, w, topi.nn.dense(x, w)], lambda u, v: u @ v.T
    if name == "attention_scores":
        q, k = _ph((2, n, 16), "Q"), _ph((2, n, 16), "K")
        return [q, k, topi.nn.batch_matmul(q, k)], lambda x, y: x @ y.transpose(0, 2, 1)
    if name == "attention_values":
        p, v = _ph((2, n, n), "P"), _ph((2, 16, n), "V")
        return [p, v, topi.nn.batch_matmul(p, v)], lambda x, y: x @ y.transpose(0, 2, 1)
    if name == "conv2d_batch":
        x, w = _ph((n, 3, 10, 10), "X"), _ph((8, 3, 3, 3), "W")
        return [x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)], _conv_ref
    if name == "softmax_rows":
        x = _ph((n, 32), "X")
        return [x, topi.nn.softmax(x, axis=-1)], _softmax
    if name == "softmax_over_n":
        x = _ph((4, n), "X")
        return [x, topi.nn.softmax(x, axis=-1)], _softmax
    if name == "layer_norm":
        x, g, b = _ph((n, 32), "X"), _ph((32,), "G"), _ph((32,), "B")
        return [x, g, b, topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)], _layer_norm
    if name == "row_sum":
        x = _ph((n, 48), "X")
        return [x, topi.sum(x, axis=1)], lambda u: u.sum(axis=1)
    if name == "col_max":
        x = _ph((n, 48), "X")
        return [x, topi.max(x, axis=0)], lambda u: u.max(axis=0)
    if name == "elementwise_chain":
        x, y = _ph((n, 40), "X"), _ph((n, 40), "Y")
        out = te.compute((n, 40), lambda i, j: te.max(x[i, j] * y[i, j] + 1.0, 0.0), name="E")
        return [x, y, out], lambda u, v: np.maximum(u * v + 1, 0)
    if name == "transpose":
        x = _ph((n, 24), "X")
        return [x, topi.transpose(x, [1, 0])], lambda u: u.T
    if name == "concatenate":
        x, y = _ph((n, 8), "X"), _ph((n, 24), "Y")
        return [x, y, topi.concatenate([x, y], axis=1)], lambda u, v: np.concatenate([u, v], 1)
    raise KeyError(name)


def _conv_ref(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((x.shape[0], w.shape[0], x.shape[2], x.shape[3]), "float32")
    for kh in range(3):
        for kw in range(3):
            patch = xp[:, :, kh:kh + x.shape[2], kw:kw + x.shape[3]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw])
    return out


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x, g, b):
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


DYNAMIC_ZOO = ["matmul", "dense", "attention_scores", "attention_values", "conv2d_batch",
               "softmax_rows", "softmax_over_n", "layer_norm", "row_sum", "col_max",
               "elementwise_chain", "transpose", "concatenate"]


def _candidates(space, workload, seed: int, count: int) -> list:
    """``count`` sampled candidates (plain-JSON traces) of a static workload."""
    sketches = space.generate_design_space(workload)
    out = []
    for draw in range(seed, seed + 200):
        replayed = space.replay(workload, without_decisions(sketches[draw % len(sketches)]),
                                seed=draw)
        if replayed.ok:
            out.append(trace_to_json(replayed.sch.trace))
            if len(out) == count:
                break
    return out


def _shape_at(buf, n: int) -> list[int]:
    return [int(d) if isinstance(d, tirx.IntImm) else n for d in buf.shape]


def _symbolic_branches(space, base, func, bucket: int, seed: int, count: int) -> list:
    """``count`` sampled candidates of ``func`` at n=``bucket`` replayed on the symbolic
    ``base``. Candidates that do not replay there are passed over, as ApplyDatabase passes
    over such records (an rfactor split that does not divide n is not quasi-affine for
    TVM)."""
    static = normalize_mod(dynamic.specialize(func, {"n": bucket}))
    out, failed = [], 0
    for trace in _candidates(space, static, seed, 6 * count):
        try:
            out.append(dynamic.replay_symbolic(base, trace, {"n": bucket}))
        except Exception:
            failed += 1
        if len(out) == count:
            break
    assert len(out) == count, (len(out), failed)
    return out


def _check_dispatch(name: str, target, picks: int) -> None:
    """``picks`` dispatching functions of ``name``, each of other sampled candidates, match
    numpy at every size of SIZES."""
    tensors, ref = _zoo(name)
    func = dynamic_base(te.create_prim_func(tensors))  # as extraction and apply see it
    base = normalize_mod(func)
    space = space_for_target(target)
    seed = zlib.crc32(name.encode()) % 1000 + 1
    per_bucket = {b: _symbolic_branches(space, base, func, b, seed + b, picks)
                  for b in BUCKETS}
    rng = np.random.default_rng(seed)
    for pick in range(picks):
        branches = [({"n": b}, per_bucket[b][pick]) for b in BUCKETS]
        disp = dynamic.dispatch_function(base["main"], branches)
        assert [str(p.name) for p in disp.params] == [str(p.name) for p in func.params]
        lib = tvm.compile(tvm.IRModule({"main": disp}), target)
        for n in SIZES:
            ins = [rng.uniform(-1, 1, _shape_at(p, n)).astype("float32")
                   for p in func.params[:-1]]
            out = func.params[-1]
            args = [tvm.runtime.tensor(a) for a in ins]
            args.append(tvm.runtime.empty(_shape_at(out, n), "float32", tvm.cpu()))
            lib["main"](*args)
            np.testing.assert_allclose(args[-1].numpy(), ref(*ins), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} at n={n}, candidates #{pick}")


@pytest.mark.parametrize("name", DYNAMIC_ZOO)
def test_dispatch_matches_numpy_at_every_size(name, target):
    """Sampled candidates of the CPU space at n=16 and n=64, replayed on the symbolic
    function and dispatched on n, compute what numpy computes at 1, a prime, the buckets,
    between them and beyond the largest (the untuned function)."""
    _check_dispatch(name, target, picks=1)


@pytest.mark.slow  # test_dispatch_matches_numpy_at_every_size, three sets of candidates
@pytest.mark.parametrize("name", DYNAMIC_ZOO)
def test_more_dispatches_match_numpy_at_every_size(name, target):
    _check_dispatch(name, target, picks=3)


def _run_at(lib, func, ref, n: int, rng) -> None:
    ins = [rng.uniform(-1, 1, _shape_at(p, n)).astype("float32") for p in func.params[:-1]]
    args = [tvm.runtime.tensor(a) for a in ins]
    args.append(tvm.runtime.empty(_shape_at(func.params[-1], n), "float32", tvm.cpu()))
    lib["main"](*args)
    np.testing.assert_allclose(args[-1].numpy(), ref(*ins), rtol=1e-4, atol=1e-4,
                               err_msg=f"n={n}")


def _predicated(stmt) -> int:
    return len(dynamic._predicated_blocks(stmt, []))


def test_full_tiles_run_without_predicates(target):
    """A row tile of 8 on a symbolic matmul: each parallel iteration tests once whether
    its tile is full and then runs blocks without predicates; the partial tile keeps them
    (tested per row). Correct at 1, 7, 8, a prime, a multiple and between."""
    tensors, ref = _zoo("matmul")
    func = te.create_prim_func(tensors).with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock("T_matmul")
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, 8])
    ko, ki = sch.split(k, [None, 16])
    sch.reorder(io, j, ko, ii, ki)
    sch.parallel(io)
    sch.decompose_reduction(block, ko)
    before = sch.mod["main"]
    assert _predicated(before.body) == 2  # init and update, tile of 8 on n
    after = dynamic.unswitch_partial_tiles(before)
    guard = after.body.block.body.body  # the parallel loop's body
    assert isinstance(guard, tirx.IfThenElse)
    assert _predicated(guard.then_case) == 0 and _predicated(guard.else_case) == 2
    # the partial tile tests each row once, outside the reduction's inner loop
    assert "for k_1 in range(16)" in guard.else_case.script()
    lib = tvm.compile(tvm.IRModule({"main": after}), target)
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 37, 64, 100):
        _run_at(lib, func, ref, n, rng)


def test_full_tile_test_stays_inside_an_intermediates_tile_loop(target):
    """q k^T computed at a column tile of the scale that follows (as the Llama block's
    q k^T + causal mask): the full-tile tests are made inside the tile loop, never around
    it, so TVM still allocates the intermediate per tile at a constant shape (a test at
    the row loop gave it the whole symbolic region: 3.5x slower at n=256). Correct at
    every size."""
    n = tirx.Var("n", "int64")
    q, k = _ph((n, 16), "Q"), _ph((n, 16), "K")
    kk = te.reduce_axis((0, 16), name="kk")
    s = te.compute((n, n), lambda i, j: te.sum(q[i, kk] * k[j, kk], axis=kk), name="S")
    out = te.compute((n, n), lambda i, j: s[i, j] * 0.25, name="O")
    func = te.create_prim_func([q, k, out]).with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    i, j = sch.get_loops(sch.get_sblock("O"))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 32])
    sch.reorder(i0, j0, i1, j1)
    sch.parallel(i0)
    sch.compute_at(sch.get_sblock("S"), j0)
    after = dynamic.unswitch_partial_tiles(sch.mod["main"])
    row_loop = after.body.block.body
    assert isinstance(row_loop.body, tirx.For)  # the tile loop, not a test
    assert isinstance(row_loop.body.body, tirx.IfThenElse)  # the test, inside it
    assert _predicated(row_loop.body.body.then_case) == 0
    lowered = tvm.IRModule({"main": after})
    with target:
        for p in (tvm.s_tir.transform.LowerInitBlock(),
                  tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                  tvm.s_tir.transform.ConvertBlocksToOpaque(),
                  tvm.s_tir.transform.CompactBufferAllocation()):
            lowered = p(lowered)
    allocs = [line for line in lowered.script().splitlines() if "alloc_buffer" in line]
    # a tile (the dispatch bounds n, so it comes out as a constant 4 x 32 there)
    assert [a.split("alloc_buffer")[1] for a in allocs] == [
        "((T.min(n, T.int64(4)), T.min(n, T.int64(32))))"], allocs
    lib = tvm.compile(tvm.IRModule({"main": after}), target)
    rng = np.random.default_rng(7)
    for size in (1, 5, 32, 37, 64):
        _run_at(lib, func, lambda a, b: (a @ b.T) * 0.25, size, rng)


def test_replayed_tile_grows_its_parallel_factor(target):
    """A row tile decided as [1, 2, 2, 2] at n=8 whose two outer loops are fused into the
    parallel loop replays on n as [1, ceil(n/4), 2, 2]: the parallel loop has ceil(n/4)
    iterations at any n, dealt evenly to the threads (with the outermost factor
    ceil-divided it had ceil(n/8) * 2: at n=9 a second outer tile, mostly empty, on one
    thread). A factor outside the parallel loop, or the innermost, stays constant; correct
    at every size."""
    tensors, ref = _zoo("matmul")
    func = te.create_prim_func(tensors)
    static = normalize_mod(dynamic.specialize(func, {"n": 8}))
    sch = tvm.s_tir.Schedule(static)
    block = sch.get_sblock("T_matmul")
    i, _, _ = sch.get_loops(block)
    factors = sch.sample_perfect_tile(i, n=4, decision=[1, 2, 2, 2])
    i0, i1, _, _ = sch.split(i, factors)
    sch.parallel(sch.fuse(i0, i1))
    trace = trace_to_json(sch.trace)
    pick = dynamic.parallel_variable_factors
    assert pick({5: [1, 4, 2]}, {5: {0, 1}}) == {5: 1}
    assert pick({5: [1, 4, 2]}, {5: {0}}) == {}  # the 4 is not in the parallel loop
    assert pick({5: [1, 1, 8]}, {5: {0, 1, 2}}) == {}  # the innermost stays constant
    assert pick({5: [4, 2, 2]}, {5: {0, 1}}) == {}  # the outermost is the largest
    assert pick({5: [2, 4, 2]}, {5: {0, 1}}) == {5: 1}  # the finer padding: 2 x 2 rows
    assert pick({5: [2, 1, 64, 2]}, {5: {0, 1}}) == {}  # the 64 is a cache tile: constant
    replayed = dynamic.replay_symbolic(normalize_mod(func), trace, {"n": 8})
    loop = replayed.body.block.body
    assert loop.kind == tirx.ForKind.PARALLEL
    assert str(loop.extent) == "(n + T.int64(3)) // T.int64(4)", loop.extent
    lib = tvm.compile(tvm.IRModule({"main": replayed.with_attr("global_symbol", "main")}),
                      target)
    rng = np.random.default_rng(11)
    for size in (1, 2, 7, 8, 9, 31):
        _run_at(lib, func, ref, size, rng)


def test_partial_tile_runs_full_chunks_vectorised_and_skips_chunks_past_n(target):
    """q k^T at a size between buckets: a tile of 64 columns of n in chunks of 16 lanes.
    The partial tile tests each chunk: full chunks run vectorised without predicates, the
    one that straddles n runs predicated, chunks wholly past n are skipped (they cost as
    much as full ones before: bucket 256's tiles made the Llama block's q k^T 4x slower at
    n=300). Correct at sizes that end inside, at and past a chunk."""
    tensors, ref = _zoo("attention_scores")
    func = te.create_prim_func(tensors).with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock("T_batch_matmul_NT")
    b, i, j, k = sch.get_loops(block)
    j0, j1, j2 = sch.split(j, [None, 4, 16])
    sch.reorder(b, i, j0, k, j1, j2)
    sch.vectorize(j2)
    sch.decompose_reduction(block, k)
    after = dynamic.unswitch_partial_tiles(sch.mod["main"])
    guards = []
    tvm_ffi.structural_walk(after.body, [(tirx.IfThenElse, guards.append)])
    skips = [g for g in guards if g.else_case is None and isinstance(g.condition, tirx.Not)]
    full = [g for g in guards if g.else_case is not None]
    assert skips and all(_predicated(g.then_case) for g in skips)
    # one per 64-tile (init and update share its loop), then one per 16-chunk inside the
    # partial tile in each of the two nests, then one per 4 lanes inside the partial chunk
    assert len(full) == 5 and all(_predicated(g.then_case) == 0 for g in full)
    lib = tvm.compile(tvm.IRModule({"main": after}), target)
    rng = np.random.default_rng(5)
    for n in (1, 15, 16, 20, 64, 100):
        _run_at(lib, func, ref, n, rng)


def test_partial_vector_tile_runs_in_chunks(target):
    """A 64-lane vector tile over n (bucket 256's column tile of q k^T) at a size inside
    it: what unswitching leaves predicated is vectorised in chunks of 16 lanes (each full
    one without the predicate), the chunk that straddles n in chunks of 4, the rest past
    n skipped, instead of one scalar loop over 64 lanes (the BERT layer's q k^T ran 7x
    slower at n=300 than at 256). Correct at sizes that end inside, at and past a chunk."""
    tensors, ref = _zoo("attention_scores")
    func = te.create_prim_func(tensors).with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock("T_batch_matmul_NT")
    b, i, j, k = sch.get_loops(block)
    j0, j1 = sch.split(j, [None, 64])
    sch.reorder(b, i, j0, k, j1)
    sch.vectorize(j1)
    sch.decompose_reduction(block, k)
    after = dynamic.unswitch_partial_tiles(sch.mod["main"])
    vectors = []
    tvm_ffi.structural_walk(after.body, [(tirx.For, lambda f: vectors.append(f)
                                          if f.kind == tirx.ForKind.VECTORIZED else None)])
    # per nest (init, update): the full tile's 64 lanes, a full chunk's 16, a full and a
    # partial 4-lane chunk
    assert sorted(int(f.extent) for f in vectors) == [4, 4, 4, 4, 16, 16, 64, 64]
    assert sum(_predicated(f) for f in vectors if int(f.extent) > 4) == 0
    lib = tvm.compile(tvm.IRModule({"main": after}), target)
    rng = np.random.default_rng(6)
    for n in (1, 3, 16, 19, 64, 65, 100, 128):
        _run_at(lib, func, ref, n, rng)


def test_symbolic_row_is_vectorised_in_tiles(target):
    """A static trace that vectorises a whole softmax row of the bucket's length (64)
    replays on the symbolic function as a split by 64 with the inner loop vectorised
    (without the bucket's size: a plain loop), full chunks unswitched from the predicate
    (``test_partial_vector_tile_runs_in_chunks``); correct below, at and above the bucket,
    at a prime."""
    tensors, ref = _zoo("softmax_over_n")
    func = te.create_prim_func(tensors)
    base = normalize_mod(func)
    static = normalize_mod(dynamic.specialize(func, {"n": 64}))
    sch = tvm.s_tir.Schedule(static)
    norm = sch.get_sblock("T_softmax_norm")
    sch.vectorize(sch.get_loops(norm)[-1])
    trace = trace_to_json(sch.trace)
    plain = dynamic.replay_symbolic(base, trace)
    tiled = dynamic.replay_symbolic(base, trace, {"n": 64})
    assert "T.vectorized" not in plain.script()
    assert "T.vectorized(T.int64(64))" in tiled.script()
    guards = []
    tvm_ffi.structural_walk(tiled.body, [(tirx.IfThenElse, guards.append)])
    full = [g for g in guards if g.else_case is not None]  # (the rest: chunks past n)
    # per 64-chunk, per 16 lanes of the partial one, per 4 lanes of the partial 16
    assert len(full) == 3 and all(_predicated(g.then_case) == 0 for g in full)
    lib = tvm.compile(tvm.IRModule({"main": tiled.with_attr("global_symbol", "main")}),
                      target)
    rng = np.random.default_rng(4)
    for n in (1, 37, 64, 65, 200):
        _run_at(lib, func, ref, n, rng)
    assert dynamic.vector_tile(tirx.Var("n", "int64"), base["main"], {"n": 2}) is None
    assert dynamic.vector_tile(base["main"].params[0].shape[1], base["main"],
                               {"n": 300}) == 64


def test_baseline_bucket_runs_the_untuned_body(target):
    """A bucket whose best record is the untuned function serves its sizes with the
    untuned body, never with the next bucket's schedule; the largest bucket serves every
    size above it with its own kernel (the untuned body when that is its best)."""
    tensors, ref = _zoo("matmul")
    func = te.create_prim_func(tensors)
    base = normalize_mod(func)
    space = space_for_target(target)
    tuned = {b: dynamic.replay_symbolic(base, _candidates(
        space, normalize_mod(dynamic.specialize(func, {"n": b})), 7, 1)[0]) for b in (16, 64)}
    disp = dynamic.dispatch_function(base["main"], [({"n": 16}, None), ({"n": 64}, tuned[64])])
    text = disp.script()
    # 16 serves up to 32 (nearest on a log scale), 64 up to 64 and, in a copy, every size
    # above
    first, rest = text.split("if n <= T.int64(32):")[1].split("else:", 1)
    assert "T.parallel" not in first and "T.parallel" in rest  # untuned body, then tuned
    second, above = rest.split("if n <= T.int64(64):")[1].split("\n        else:", 1)
    assert "T.parallel" in second and "T.parallel" in above
    # the largest bucket's best record is the untuned function: its body above 32
    disp = dynamic.dispatch_function(base["main"], [({"n": 16}, tuned[16]), ({"n": 64}, None)])
    first, rest = disp.script().split("if n <= T.int64(32):")[1].split("else:", 1)
    assert "T.parallel" in first and "T.parallel" not in rest
    lib = tvm.compile(tvm.IRModule({"main": disp}), target)
    rng = np.random.default_rng(3)
    for n in (5, 40, 100):
        _run_at(lib, func, ref, n, rng)
    assert dynamic.upper_limit(16, [1, 16, 64]) == 32 and dynamic.upper_limit(1, [1, 16]) == 4
    assert dynamic.upper_limit(64, [16, 64]) == 64


def test_branch_intermediates_are_sized_for_their_bucket(target):
    """Each bucket's branch allocates its intermediate buffers at the largest n it serves
    (constant shapes: TVM compacts a tile of them to a constant tile), the largest bucket's
    copy for the sizes above it keeps them symbolic, and every size still computes
    softmax."""
    tensors, ref = _zoo("softmax_rows")
    func = te.create_prim_func(tensors)
    base = normalize_mod(func)
    disp = dynamic.dispatch_function(base["main"], [({"n": 16}, None), ({"n": 64}, None)])
    text = disp.script()
    first, rest = text.split("if n <= T.int64(32):")[1].split("else:", 1)
    second, above = rest.split("if n <= T.int64(64):")[1].split("else:", 1)
    allocs = [[line for line in part.splitlines() if "sblock_alloc_buffer" in line]
              for part in (first, second, above)]
    assert all(len(a) == 3 for a in allocs), allocs  # max, exp, sum
    assert all("T.int64(32)" in line and "(n" not in line for line in allocs[0])
    assert all("T.int64(64)" in line and "(n" not in line for line in allocs[1])
    assert all("(n" in line for line in allocs[2])
    lib = tvm.compile(tvm.IRModule({"main": disp}), target)
    rng = np.random.default_rng(5)
    for n in (1, 31, 32, 33, 64, 65, 100):
        _run_at(lib, func, ref, n, rng)


# ---------------------------------------------------------------------------------------
# Through the pipeline


def _run(ex, x):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["forward"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.slow  # 39-51 s on a Zen 1; the same path, cheaper: test_attention.py's dynamic
# attention through the pipeline, test_predict.py's dynamic no-measurement compile and
# test_dispatch_plan.py's measured plan
def test_pipeline_with_records_matches_untuned_at_every_size(target, tmp_path, caplog):
    """A dynamic-shape model tuned through the "relax_tune" pipeline with hints {16, 64}
    (its matmuls, one trial per task, no baseline records and no ranking against the
    untuned function, so every bucket's tuned schedule is applied, where the measured
    dispatch plan does not give a size to another bucket) runs and matches the untuned
    build at 1, 7 (below the smallest bucket), 20 (between the buckets), 64 (a bucket)
    and 65 and 100 (past the largest: its kernel)."""
    mod, params = _attention_model()
    rng = np.random.default_rng(0)
    weights = {name: rng.uniform(-1, 1, [int(d) for d in p.shape]).astype("float32")
               for name, p in params}
    work = str(tmp_path / "work")
    hints = {"n": [16, 64]}
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target, weights)
    tasks = rt.extract_tasks(lowered, target, shape_hints=hints, op_names=["matmul"])
    assert all(t.shape for t in tasks) and len(tasks) == 6
    with caplog.at_level(logging.INFO, logger="relax_tune.dynamic.apply"):
        tuned = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir=work, max_trials_global=len(tasks),
            params=weights, shape_hints=hints, op_names=["matmul"], num_trials_per_iter=1,
            measure_baseline=False, dispatch_ranking=0,
            head_to_head_rounds=0, progress_bar=False))
    untuned = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path / "empty"), max_trials_global=0,
        params=weights))
    # the pipeline's ApplyDatabase replaced every dynamic function by its dispatch (an
    # ApplyDatabase finding the hinted sizes in work/tasks.json: test_dispatch_plan.py)
    dispatched = {r.getMessage().split(":")[0] for r in caplog.records
                  if r.name == "relax_tune.dynamic.apply" and "dispatch over" in r.getMessage()}
    assert dispatched == {f for t in tasks for f in t.func_names}
    for n in (1, 7, 20, 64, 65, 100):
        x = rng.uniform(-1, 1, (1, n, 16)).astype("float32")
        np.testing.assert_allclose(_run(tuned, x), _run(untuned, x), rtol=1e-4, atol=1e-4,
                                   err_msg=f"n={n}")
    assert os.path.isfile(os.path.join(work, "tasks.json"))


def test_llama_rope_reads_only_inside_its_tensor():
    """Every load of the rotary embedding stays inside the tensor, at every position. (A
    Select of two loads evaluates both: its rotate-half read x[d - 32] for d < 32, before
    the tensor, and the Llama block crashed at n=16 once the input view sat at the start
    of a fresh page.)"""
    mod, _ = models.llama_block(dim=64, heads=4, hidden=128)
    func = mod["rope"]
    realizes = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlockRealize, realizes.append)])
    block = [r.block for r in realizes if str(r.block.name_hint) == "rope"][0]
    dom = {iv.var: tvm.sym.IntervalSet(iv.dom.min, iv.dom.min + iv.dom.extent - 1)
           for iv in block.iter_vars}
    nodes = []
    tvm_ffi.structural_walk(block.body, [(object, nodes.append)])
    loads = [x for x in nodes if type(x).__name__ in ("BufferLoad", "TensorLoad")]
    analyzer = tvm.sym.Analyzer()
    assert loads
    for load in loads:
        tensor = getattr(load, "buffer", None) or load.source
        for index, extent in zip(load.indices, tensor.shape):
            span = analyzer.int_set(index, dom)
            assert analyzer.can_prove(span.min_value >= 0), (load, index)
            assert analyzer.can_prove(span.max_value < extent), (load, index)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_block", "bert_layer"])
def test_reduced_decoder_and_encoder_through_the_pipeline(name, target, tmp_path):
    """The reduced Llama-style block and BERT-style layer tuned through the pipeline (hints
    {16, 64}, one trial per task) match TVM's untuned build at 1, 13, 64, 65 and 100."""
    from relax_tune.lowering.prepare import bind_params

    mod, params = getattr(models, name)(dim=32, heads=2, hidden=64)
    rng = np.random.default_rng(0)
    weights = {p: (rng.uniform(-1, 1, [int(d) for d in v.shape]) /
                   np.sqrt([int(d) for d in v.shape][-1])).astype("float32")
               for p, v in params}
    hints = {"n": [16, 64]}
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target, weights)
        untuned = tvm.compile(relax.get_pipeline("zero")(bind_params(mod, weights)), target)
    tasks = rt.extract_tasks(lowered, target, shape_hints=hints)
    tuned = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path / "w"),
        max_trials_global=len(tasks), params=weights, shape_hints=hints,
        num_trials_per_iter=1, progress_bar=False))
    for n in (1, 13, 64, 65, 100):
        x = rng.uniform(-1, 1, (1, n, 32)).astype("float32")
        np.testing.assert_allclose(_run(tuned, x), _run(untuned, x), rtol=1e-3, atol=1e-4,
                                   err_msg=f"{name} at n={n}")
