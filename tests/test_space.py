"""The CPU design space: every sampled candidate builds and computes what numpy computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.s_tir import Schedule, Trace
from tvm.script import tirx as T

from relax_tune.search import ReplaySearch
from relax_tune.space import (check_schedule, empty_trace, generate_design_space,
                              space_for_target, target_params, without_decisions)
from relax_tune.utils import UncheckedSchedule, normalize_mod, schedule_from_json

# ---------------------------------------------------------------------------------------
# Workloads (small shapes) and their numpy references


def matmul(n: int = 64, m: int | None = None, k: int | None = None):
    m, k = m or n, k or n
    a = te.placeholder((n, k), "float32", name="A")
    b = te.placeholder((k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return normalize_mod(te.create_prim_func([a, b, c])), lambda x, y: x @ y


def conv2d_nchw(n=1, c=8, h=14, w=14, f=16, kh=3, kw=3, pad=1):
    x = te.placeholder((n, c, h, w), "float32", name="X")
    wt = te.placeholder((f, c, kh, kw), "float32", name="W")
    y = topi.nn.conv2d_nchw(x, wt, 1, pad, 1)

    def ref(xv, wv):
        xp = np.pad(xv, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
        return np.einsum("ncyxij,fcij->nfyx", win, wv)

    return normalize_mod(te.create_prim_func([x, wt, y])), ref


def group_conv2d_nhwc(h=8, w=8, c=64, group=16, k=3):
    """A 3x3 convolution of ``group``-channel groups over NHWC (RegNet's): TOPI reads the
    input at ``ff // group * group + rc``, not linear in the output channel ``ff``."""
    x = te.placeholder((1, h, w, c), "float32", name="X")
    wt = te.placeholder((k, k, group, c), "float32", name="W")
    y = topi.nn.group_conv2d_nhwc(x, wt, 1, k // 2, 1, c // group)

    def ref(xv, wv):
        xp = np.pad(xv, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))
        win = win.reshape(1, h, w, c // group, group, k, k)  # n y x g rc i j
        wg = wv.reshape(k, k, group, c // group, group)  # i j rc g f
        return np.einsum("nyxgcij,ijcgf->nyxgf", win, wg).reshape(1, h, w, c)

    return normalize_mod(te.create_prim_func([x, wt, y])), ref


def softmax(n=16, m=64):
    x = te.placeholder((n, m), "float32", name="X")
    y = topi.nn.softmax(x, axis=-1)

    def ref(xv):
        e = np.exp(xv - xv.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return normalize_mod(te.create_prim_func([x, y])), ref


def layer_norm(n=16, m=64):
    x = te.placeholder((n, m), "float32", name="X")
    g = te.placeholder((m,), "float32", name="G")
    b = te.placeholder((m,), "float32", name="Bt")
    y = topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)

    def ref(xv, gv, bv):
        mu, var = xv.mean(-1, keepdims=True), xv.var(-1, keepdims=True)
        return (xv - mu) / np.sqrt(var + 1e-5) * gv + bv

    return normalize_mod(te.create_prim_func([x, g, b, y])), ref


def elementwise_chain(n=32, m=48):
    x = te.placeholder((n, m), "float32", name="X")
    y = te.placeholder((n, m), "float32", name="Y")
    a = te.compute((n, m), lambda i, j: x[i, j] + y[i, j], name="add")
    b = te.compute((n, m), lambda i, j: a[i, j] * 2.0, name="mul")
    c = te.compute((n, m), lambda i, j: te.max(b[i, j], 0.0), name="relu")
    return normalize_mod(te.create_prim_func([x, y, c])), lambda u, v: np.maximum((u + v) * 2, 0)


@pytest.fixture(scope="module")
def demo_tasks(target):
    """The demo MLP's PrimFuncs after ``relax.get_pipeline("zero")``, normalised."""
    from relax_tune.demo import demo_model

    mod, _ = demo_model()
    with target:
        low = relax.get_pipeline("zero")(mod)
    return {gv.name_hint: normalize_mod(f) for gv, f in low.functions.items()
            if isinstance(f, tirx.PrimFunc)}


DEMO_REFS = {
    "fused_matmul_add_relu": lambda x, w, b: np.maximum(x @ w + b, 0),
    "transpose": lambda a: a.T,
    "matmul1": lambda x, w: x @ w,
}

TE_WORKLOADS = {
    "matmul64": lambda: matmul(64),
    "matmul_odd": lambda: matmul(48, 40, 56),
    "conv2d_nchw_pad": conv2d_nchw,
    "group_conv2d_nhwc": group_conv2d_nhwc,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "elementwise_chain": elementwise_chain,
    "column_sum": lambda: column_sum(),
}


def random_inputs(mod: tvm.IRModule, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = list(mod["main"].params)
    ins = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(str(p.dtype)) for p in params[:-1]]
    out = params[-1]
    return ins, ([int(d) for d in out.shape], str(out.dtype))


def run(mod: tvm.IRModule, target, ins, out_spec) -> np.ndarray:
    ex = tvm.compile(mod, target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in ins]
    args.append(tvm.runtime.empty(out_spec[0], out_spec[1], dev))
    ex.mod["main"](*args)
    return args[-1].numpy()


def check_candidates(mod, ref, target, n: int, seed: int = 7) -> int:
    """Sample up to ``n`` candidates, build and run each, compare with numpy; returns the
    number checked. Every candidate must build, replay from JSON, and be right."""
    ins, out_spec = random_inputs(mod)
    expected = ref(*ins)
    cands = ReplaySearch(mod, target, seed=seed).next_candidates(n)
    assert cands, "the space gave no candidate"
    for cand in cands:
        again = schedule_from_json(mod, cand.trace_json)
        assert tvm_ffi.structural_equal(again.mod, cand.sch.mod)
        assert check_schedule(cand.sch, target) is None
        got = run(cand.sch.mod, target, ins, out_spec)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4,
                                   err_msg=str(cand.sch.trace))
    return len(cands)


# ---------------------------------------------------------------------------------------
# Correctness of sampled candidates


@pytest.mark.parametrize("name", sorted(TE_WORKLOADS))
def test_te_workload_candidates_match_numpy(name, target):
    mod, ref = TE_WORKLOADS[name]()
    got = check_candidates(mod, ref, target, n=12)
    if name.startswith(("matmul", "conv")):
        assert got == 12  # tiled spaces are large


@pytest.mark.parametrize("name", sorted(DEMO_REFS))
def test_demo_mlp_candidates_match_numpy(name, target, demo_tasks):
    got = check_candidates(demo_tasks[name], DEMO_REFS[name], target, n=12)
    if "matmul" in name:
        assert got == 12


def test_plain_llvm_target_works():
    target = tvm.target.Target("llvm")
    mod, ref = matmul(32)
    assert check_candidates(mod, ref, target, n=4) == 4


def test_fused_epilogue_and_inlining(target, demo_tasks):
    """The bias add is inlined into the ReLU, and some sketch fuses the ReLU into the
    matmul's tile loops (no separate output loop nest)."""
    mod = demo_tasks["fused_matmul_add_relu"]
    sketches = generate_design_space(mod, target)
    assert len(sketches) >= 2
    texts = [str(s) for s in sketches]
    assert all("compute_inline" in t for t in texts)
    assert any("reverse_compute_at" in t for t in texts)
    cands = ReplaySearch(mod, target, seed=3).next_candidates(6)
    names = [{b.name_hint for b in _blocks(c.sch.mod["main"])} for c in cands]
    assert all("T_add" not in n for n in names)


def test_an_expensive_value_is_not_inlined_where_it_is_broadcast(target):
    """A per-channel value of a long expression (a polynomial, as TVM's fast sigmoid is)
    that scales a whole map stays its own block, computed once per channel; the cheap add
    before it is still inlined into it."""
    f = te.placeholder((64, 32), "float32", name="F")
    k = te.reduce_axis((0, 64), name="k")
    total = te.compute((32,), lambda c: te.sum(f[k, c], axis=k), name="Total")
    q = te.compute((32,), lambda c: total[c] + 1.0, name="Q")

    def poly(v):
        out = v
        for coef in (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125):
            out = out * v + coef
        return out

    p = te.compute((32,), lambda c: poly(q[c]), name="P")
    out = te.compute((64, 32), lambda h, c: p[c] * f[h, c], name="Out")
    mod = normalize_mod(te.create_prim_func([f, out]))
    for sketch in generate_design_space(mod, target):
        sch = space_for_target(target).replay(mod, without_decisions(sketch), seed=1).sch
        names = {b.name_hint for b in _blocks(sch.mod["main"])}
        assert "P" in names and "Q" not in names, names


def _blocks(func):
    out = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, out.append)])
    return out


def test_matmul_space_is_tiled_parallel_vectorized(target):
    mod, _ = matmul(256)
    cand = ReplaySearch(mod, target, seed=5).next_candidates(1)[0]
    kinds = []

    def on_for(loop):
        kinds.append(int(loop.kind))

    tvm_ffi.structural_walk(cand.sch.mod["main"].body, [(tirx.For, on_for)])
    assert 1 in kinds and 2 in kinds  # parallel and vectorized loops
    text = str(cand.sch.trace)
    assert "sample_perfect_tile" in text and "decompose_reduction" in text
    assert "pragma_auto_unroll_max_step" in text or "decision=0" in text


def test_tile_of_vector_axis_is_multiple_of_lanes(target):
    """The innermost tile of the vectorised axis is a whole number of vector registers."""
    mod, _ = matmul(128)
    lanes = target_params(target).lanes("float32")
    for cand in ReplaySearch(mod, target, seed=11).next_candidates(10):
        widths = []

        def on_for(loop):
            if int(loop.kind) == 2:
                widths.append(int(loop.extent.value))

        tvm_ffi.structural_walk(cand.sch.mod["main"].body, [(tirx.For, on_for)])
        assert widths and all(w % lanes == 0 for w in widths), widths


# ---------------------------------------------------------------------------------------
# Functions the space cannot schedule


@T.prim_func(s_tir=True)
def _opaque(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("opaque"):
            T.reads(A[0:16])
            T.writes(B[i])
            B[i] = A[15 - i] * T.float32(2)


@T.prim_func
def _no_blocks(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
    for i in range(4):
        B[i] = A[i] + T.float32(1)


@T.prim_func(s_tir=True)
def _dynamic(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, 16), "float32")
    B = T.match_buffer(b, (n, 16), "float32")
    for i, j in T.grid(n, 16):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] + T.float32(1)


@pytest.mark.parametrize("func", [_no_blocks, _opaque, _dynamic], ids=["no_blocks", "opaque",
                                                                       "dynamic"])
def test_unschedulable_functions_give_a_usable_trace(func, target):
    mod = normalize_mod(func)
    sketches = generate_design_space(mod, target)
    assert len(sketches) >= 1
    out = space_for_target(target).replay(mod, without_decisions(sketches[0]), seed=5)
    assert out.ok, out.error
    tvm.compile(out.sch.mod, target)
    cands = ReplaySearch(mod, target).next_candidates(4)
    if func is not _opaque:
        assert len(sketches[0].insts) == 0  # the empty trace: the function as it is
        assert len(cands) == 1 and cands[0].trace_json == [[], []]  # one program, once
    else:
        assert 1 <= len(cands) <= 4


def test_unknown_target_kind_gives_empty_trace():
    mod, _ = matmul(16)
    sketches = generate_design_space(mod, tvm.target.Target("c"))
    assert [len(s.insts) for s in sketches] == [0]
    assert len(empty_trace().insts) == 0


# ---------------------------------------------------------------------------------------
# check_schedule


def test_check_schedule_accepts_unscheduled_and_rejects_wide_vector(target):
    mod, _ = matmul(64)
    assert check_schedule(Schedule(mod), target) is None
    sch = Schedule(mod)
    i, j, _k = sch.get_loops(sch.get_sblock("C"))
    sch.reorder(_k, i, j)
    sch.vectorize(sch.fuse(i, j))  # 4096 lanes
    reason = check_schedule(sch, target)
    assert reason is not None and "vectorised" in reason


def test_check_schedule_rejects_nested_parallel_and_parallel_reduction(target):
    @T.prim_func(s_tir=True)
    def nested(A: T.Buffer((8, 8), "float32"), B: T.Buffer((8, 8), "float32")):
        for i in T.parallel(8):
            for j in T.parallel(8):
                with T.sblock("B"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    B[vi, vj] = A[vi, vj]

    @T.prim_func(s_tir=True)
    def racy(A: T.Buffer((8, 8), "float32"), B: T.Buffer((8,), "float32")):
        for i in range(8):
            for k in T.parallel(8):
                with T.sblock("B"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    with T.init():
                        B[vi] = T.float32(0)
                    B[vi] = B[vi] + A[vi, vk]

    assert "nested" in check_schedule(Schedule(normalize_mod(nested)), target)
    assert "reduction" in check_schedule(Schedule(normalize_mod(racy)), target)


def test_check_schedule_rejects_a_sketch_without_postprocessing(target):
    mod, _ = matmul(64)
    sketch = generate_design_space(mod, target)[0]
    sch = Schedule(mod)
    sketch.apply_to_schedule(sch, remove_postproc=True)
    reason = check_schedule(sch, target)
    assert reason is not None and "postprocessing" in reason


def test_target_params_read_from_target():
    p = target_params(tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 3}))
    assert (p.vector_bytes, p.num_cores, p.lanes("float32")) == (64, 3, 16)
    assert target_params(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
                         ).vector_bytes == 64
    assert target_params(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})).vector_bytes == 32
    assert target_params(tvm.target.Target({"kind": "llvm", "mcpu": "znver4",
                                            "mattr": ["-avx512f"]})).vector_bytes == 32
    assert target_params(tvm.target.Target("llvm")).vector_bytes == 16
    assert target_params(tvm.target.Target("llvm")).num_cores >= 1


@pytest.mark.parametrize("mcpu, rows", [("haswell", 7), ("skylake-avx512", 7)])
def test_a_register_tile_fills_the_registers_but_what_its_operands_need(mcpu, rows):
    """Rows of two vectors a tile, on a 49-row matmul (a 7x7 map's 1x1 convolution, whose
    rows divide only by 7): on AVX2's 16 registers 7 rows (14 accumulators) replay and
    leave two for the broadcast and the weight vector; on AVX-512's 32, 7 rows of 4 (28).
    One row more per tile than that (a 56-row matmul, 8 rows) is past the budget."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    params = target_params(target)
    width = 2 if params.vector_registers == 16 else 4  # vectors a tile
    space = space_for_target(target)
    for m, tile, ok in ((49, rows, True), (56, rows + 1, False)):
        mod, _ = matmul(m, 64, 64)
        sketch = space.generate_design_space(mod)[0]
        tiles = [i for i in sketch.insts if i.kind.name == "SamplePerfectTile"]
        vectors = 64 * 4 // params.vector_bytes
        trace = sketch.with_decision(tiles[0], [m // tile, 1, 1, tile], True)
        trace = trace.with_decision(tiles[1], [vectors // width, 1, 1, width], True)
        out = space.replay(mod, trace)
        assert out.ok == ok, (m, tile, out.error)
        if not ok:
            assert "LimitRegisterTile" in out.error, out.error


def test_sketches_replay_fresh_decisions(target):
    """Replaying a sketch without decisions draws new ones (different seeds, different
    programs), and the sketch traces are over Schedule(mod)."""
    mod, _ = matmul(256)
    sketch = generate_design_space(mod, target)[0]
    assert isinstance(sketch, Trace)
    space = space_for_target(target)
    progs, replayed = set(), 0
    for seed in (11, 2**20 + 7, 2**30 + 3, 123456789, 977, 2**25 + 1, 31337, 2**31 - 2):
        out = space.replay(mod, without_decisions(sketch), seed=seed)
        if not out.ok:  # register tiles out of bounds are redrawn by the search
            assert "LimitRegisterTile" in out.error, out.error
            continue
        replayed += 1
        progs.add(tvm_ffi.structural_hash(out.sch.mod))
    assert len(progs) == replayed >= 2  # every seed that replayed drew its own program


# ---------------------------------------------------------------------------------------
# rfactor, random compute location, sampled parallel budget


def full_sum(n=64, m=128):
    x = te.placeholder((n, m), "float32", name="X")
    return normalize_mod(te.create_prim_func([x, topi.sum(x, axis=(0, 1))])), lambda u: u.sum()


def test_rfactor_sketches_parallelise_a_full_reduction(target):
    """A full sum has no spatial work: some sketch rfactors it, and its candidates run the
    partial sums on a parallel loop and still compute the sum."""
    mod, ref = full_sum()
    sketches = generate_design_space(mod, target)
    rf = [s for s in sketches if any(i.kind.name == "RFactor" for i in s.insts)]
    assert rf and len(rf) < len(sketches)  # the unchanged block stays in the space
    ins, out_spec = random_inputs(mod)
    space = space_for_target(target)
    parallel = 0
    for seed in (3, 2**20 + 1, 2**29 + 5):
        out = space.replay(mod, without_decisions(rf[0]), seed=seed)
        assert out.ok, out.error
        kinds = []
        tvm_ffi.structural_walk(out.sch.mod["main"].body,
                                [(tirx.For, lambda lp: kinds.append(int(lp.kind)))])
        parallel += 1 in kinds
        np.testing.assert_allclose(run(out.sch.mod, target, ins, out_spec), ref(*ins),
                                   rtol=1e-4, atol=1e-4)
    assert parallel == 3  # every draw runs its partial sums in parallel


def column_sum(h=28, w=28, c=48):
    """A global sum pool over an NHWC tensor: the reduction runs across the rows."""
    x = te.placeholder((1, h, w, c), "float32", name="X")
    y = topi.sum(x, axis=(1, 2), keepdims=True)
    return normalize_mod(te.create_prim_func([x, y])), lambda u: u.sum(axis=(1, 2), keepdims=True)


def test_a_reduction_across_rows_sums_contiguous_rows_in_parallel(target):
    """A sum over the height and width of an NHWC tensor: the space is the column sketch
    (parts of the rows summed apart, then added) and the channel sketch (chunks of
    channels); every draw of either runs a parallel loop and a vector loop, and computes
    the sum."""
    mod, ref = column_sum()
    sketches = generate_design_space(mod, target)
    assert len(sketches) == 2
    assert sum(any(i.kind.name == "RFactor" for i in s.insts) for s in sketches) == 1
    ins, out_spec = random_inputs(mod)
    space = space_for_target(target)
    for sketch in sketches:
        for seed in (3, 2**20 + 1, 2**29 + 5):
            out = space.replay(mod, without_decisions(sketch), seed=seed)
            assert out.ok, out.error
            kinds = []
            tvm_ffi.structural_walk(out.sch.mod["main"].body,
                                    [(tirx.For, lambda lp: kinds.append(int(lp.kind)))])
            assert 1 in kinds and 2 in kinds  # a parallel loop and a vector loop
            np.testing.assert_allclose(run(out.sch.mod, target, ins, out_spec), ref(*ins),
                                       rtol=1e-4, atol=1e-3)


def test_a_grouped_convolution_vectorises_its_output_channels(target):
    """The group axis of a grouped convolution becomes an iter of its own in every sketch,
    so a group's output channels are linear in the input's index: every candidate runs
    the tiled compute in a vector loop (their results: ``TE_WORKLOADS``)."""
    from relax_tune.tuning.predict import vectorises_the_compute

    mod, _ = group_conv2d_nhwc()
    sketches = generate_design_space(mod, target)
    assert all(any(i.kind.name == "TransformBlockLayout" for i in s.insts) for s in sketches)
    vector_bytes = target_params(target).vector_bytes
    cands = ReplaySearch(mod, target, seed=5).next_candidates(6)
    assert len(cands) == 6
    for cand in cands:
        assert vectorises_the_compute(cand.sch.mod["main"], vector_bytes, 64 * 4, full=False), \
            str(cand.sch.trace)


def test_random_compute_location_moves_the_pad_block(target):
    """A pad block cannot be inlined (it branches); its location is sampled instead, and
    every sketch replays with fresh decisions (no getter whose outputs depend on them)."""
    mod, _ = conv2d_nchw()
    sketches = generate_design_space(mod, target)
    assert all("sample_compute_location" in str(s) for s in sketches)
    space = space_for_target(target)
    locations = set()
    rng = np.random.default_rng(1)
    for i in range(24):
        out = space.replay(mod, without_decisions(sketches[i % len(sketches)]),
                           seed=int(rng.integers(1, 2**31 - 1)))
        assert out.error is None or "replay failed" not in out.error, out.error
        if out.ok:
            locations.update(int(out.sch.trace.get_decision(inst)) for inst in out.sch.trace.insts
                             if inst.kind.name == "SampleComputeLocation")
    assert len(locations) >= 2


def test_a_tiled_blocks_pad_is_never_left_at_the_root(target):
    """``PadInsideTiles``: draws that leave the convolution's pad in a pass of its own at the
    root (the check finds them among the draws before postprocessing) are rejected and
    redrawn; the candidates that remain compute the pad inside the convolution's loops,
    and compute what the convolution computes."""
    from relax_tune.space.compute_location import root_pads_of_tiled_blocks

    mod, ref = conv2d_nchw()
    space = space_for_target(target)
    sketches = [without_decisions(s) for s in generate_design_space(mod, target)]
    raw = [space.replay(mod, sketches[i % len(sketches)], seed=i + 1, postprocs=False,
                        check=False).sch for i in range(40)]
    assert sum(bool(sch is not None and root_pads_of_tiled_blocks(sch.mod["main"]))
               for sch in raw) >= 2
    outs = [space.replay(mod, sketches[i % len(sketches)], seed=i + 1) for i in range(40)]
    assert any("PadInsideTiles" in str(o.error) for o in outs)
    valid = [o.sch for o in outs if o.ok]
    assert len(valid) >= 5
    assert not any(root_pads_of_tiled_blocks(sch.mod["main"]) for sch in valid)
    ins, out_spec = random_inputs(mod)
    np.testing.assert_allclose(run(valid[0].mod, target, ins, out_spec), ref(*ins),
                               rtol=1e-4, atol=1e-3)


def test_a_pad_placed_at_the_root_on_purpose_stays(target):
    """``PadInsideTiles`` judges only pads whose location the trace samples: a tiled block's
    pad left at the root while another block's location is sampled (as a padded sketch's
    zero-padded copies are) is accepted; sampled and left at the root, it is not."""
    from relax_tune.space.compute_location import PadInsideTiles
    from relax_tune.space.params import ANN_TILED

    mod, _ = conv2d_nchw()

    def placed(sampled: str) -> Schedule:
        sch = Schedule(mod)
        conv = sch.get_sblock("conv2d_nchw")
        sch.annotate(conv, ANN_TILED, 1)
        block = sch.cache_read(conv, 1, "global") if sampled == "copy" else \
            sch.get_sblock("pad_temp")
        sch.compute_at(block, sch.sample_compute_location(block, decision=-1),
                       preserve_unit_loops=True)  # -1: the root
        return sch

    check = PadInsideTiles()
    assert check.apply(placed("copy"))
    assert not check.apply(placed("pad"))


def test_softmax_sketches_always_replay(target):
    """rfactor and compute-location sketches of softmax: fresh decisions never break a replay."""
    mod, _ = softmax()
    space = space_for_target(target)
    sketches = generate_design_space(mod, target)
    assert len(sketches) > 1
    rng = np.random.default_rng(2)
    for i in range(40):
        out = space.replay(mod, without_decisions(sketches[i % len(sketches)]),
                           seed=int(rng.integers(1, 2**31 - 1)))
        assert out.error is None or "replay failed" not in out.error, out.error


def test_parallel_budget_is_sampled_from_the_core_count(target):
    p = target_params(tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 3}))
    assert p.parallel_extent_choices == [3 * c for c in sorted(set(p.jobs_per_core_choices))]
    mod, _ = elementwise_chain()
    text = str(generate_design_space(mod, target)[0])
    cores = target_params(target).num_cores
    assert "sample_categorical" in text and f"candidates=[{4 * cores}," in text


def test_unroll_never_unrolls_a_whole_nest_past_256_iterations():
    """A 512 unroll step over a nest of exactly 512 serial iterations is lowered to 256 (LLVM
    took 143 s on one such batch_matmul candidate, 0.7 s at 256); a nest too large to be
    unrolled whole, a smaller step, and a vectorised loop (not a copy) leave it as sampled."""
    from relax_tune.space.parallel_vectorize_unroll import MAX_FULL_UNROLL, _unroll_step

    def loops_of(n, k, vectorize_j=False):
        sch = Schedule(matmul(n, 16, k)[0])
        blk = sch.get_sblock("C")
        loops = list(sch.get_loops(blk))
        if vectorize_j:
            sch.vectorize(loops[1])
        return sch, loops

    sch, loops = loops_of(4, 32)                       # 16 * 32 = 512 under i
    assert _unroll_step(sch, loops, 512) == MAX_FULL_UNROLL == 256
    assert _unroll_step(sch, loops, 64) == 64
    sch, loops = loops_of(4, 64)                       # 1024: never unrolled whole
    assert _unroll_step(sch, loops, 512) == 512
    sch, loops = loops_of(4, 32, vectorize_j=True)     # 32 serial iterations
    assert _unroll_step(sch, loops, 512) == 512


def test_a_postprocessor_that_raises_drops_the_candidate_and_says_so_once(target, caplog):
    """A postprocessor rejects a candidate by returning False; one that raises has a bug:
    the candidate is dropped (tuning goes on) and one warning names it, not one per
    candidate."""
    space = space_for_target(target)

    class Broken:
        def precheck(self, sch):
            return True

        def apply(self, sch):
            raise ValueError("a bug in a postprocessor")

        def __str__(self):
            return "Broken()"

    space.postprocs = [Broken(), *space.postprocs]
    a, b = te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, topi.matmul(a, b)])})
    (sketch, *_) = space.generate_design_space(mod)
    with caplog.at_level("WARNING", logger="relax_tune.space"):
        results = [space.replay(mod, without_decisions(sketch), seed=s) for s in (1, 2, 3)]
    assert all(r.sch is None and "Broken() failed" in r.error for r in results)
    assert sum("a bug in a postprocessor" in r.getMessage() for r in caplog.records) == 1


def test_the_unchecked_schedule_replays_as_tvms_does(target):
    """``UncheckedSchedule`` (the replays' schedule, without TVM's per-call argument type
    checks) gives the same programs and traces as TVM's ``Schedule``."""
    from relax_tune.testing.workloads import matmul_mod

    assert not hasattr(UncheckedSchedule.split, "__wrapped__")
    assert hasattr(Schedule.split, "__wrapped__")  # else TVM changed and this is moot
    mod = matmul_mod(64)
    space = space_for_target(target)
    valid = 0
    for sketch in space.generate_design_space(mod):
        for seed in (1, 2, 3):
            fast = space.replay(mod, without_decisions(sketch), seed=seed)
            if fast.sch is None:
                continue
            assert isinstance(fast.sch, UncheckedSchedule)
            valid += 1
            checked = Schedule(mod, error_render_level="none")
            fast.sch.trace.apply_to_schedule(checked, remove_postproc=False)
            tvm.ir.assert_structural_equal(checked.mod, fast.sch.mod)
    assert valid
