"""The CUDA design space. Without a GPU (CI): for the correctness-zoo operators, sampled
candidates are generated, pass the target-limit check, and compile with nvcc for sm_80 and
sm_90. With a GPU (``tvm.cuda(0).exist``): they also run and match numpy; only those
run-time checks skip where there is no GPU."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.s_tir import Schedule

from relax_tune.database import MemoryDatabase, TuningRecord
from relax_tune.search import ReplaySearch
from relax_tune.space import (check_schedule, generate_design_space, space_for_target,
                              without_decisions)
from relax_tune.space.gpu import (GPUParams, VerifyGPUCode, compile_cuda, cuda_source,
                                  cuda_target, default_schedule_pass, find_nvcc, gpu_params,
                                  lower_for_verification)
from relax_tune.transform import ApplyDatabase
from relax_tune.utils import RelaxTuneError, normalize_mod, schedule_from_json

N_CANDIDATES = 3
HAS_GPU = tvm.cuda(0).exist
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")

Zoo = tuple[tvm.IRModule, Callable[..., np.ndarray]]


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


def _mod(*tensors) -> tvm.IRModule:
    return normalize_mod(te.create_prim_func(list(tensors)))


def _conv_ref(x, w, pad, groups=1):
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    if groups == 1:
        return np.einsum("ncyxij,fcij->nfyx", win, w)
    return np.einsum("ncyxij,cij->ncyx", win, w[:, 0])


def matmul() -> Zoo:
    a, b = _ph((64, 64), "A"), _ph((64, 64), "B")
    return _mod(a, b, topi.matmul(a, b)), lambda x, y: x @ y


def batch_matmul() -> Zoo:
    a, b = _ph((2, 16, 32), "A"), _ph((2, 24, 32), "B")
    return _mod(a, b, topi.nn.batch_matmul(a, b)), lambda x, y: x @ y.transpose(0, 2, 1)


def conv2d_nchw() -> Zoo:
    x, w = _ph((1, 8, 14, 14), "X"), _ph((16, 8, 3, 3), "W")
    return _mod(x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)), lambda u, v: _conv_ref(u, v, 1)


def depthwise_conv2d() -> Zoo:
    x, w = _ph((1, 8, 14, 14), "X"), _ph((8, 1, 3, 3), "W")
    y = topi.nn.depthwise_conv2d_nchw(x, w, 1, 1, 1)
    return _mod(x, w, y), lambda u, v: _conv_ref(u, v, 1, groups=8)


def softmax() -> Zoo:
    x = _ph((16, 64), "X")

    def ref(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return _mod(x, topi.nn.softmax(x, axis=-1)), ref


def layer_norm() -> Zoo:
    x, g, b = _ph((16, 64), "X"), _ph((64,), "G"), _ph((64,), "Bt")

    def ref(v, gv, bv):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * gv + bv

    return _mod(x, g, b, topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)), ref


def row_sum() -> Zoo:
    x = _ph((16, 128), "X")
    return _mod(x, topi.sum(x, axis=1)), lambda v: v.sum(1)


def full_sum() -> Zoo:
    x = _ph((32, 48), "X")
    return _mod(x, topi.sum(x)), lambda v: np.array(v.sum(), "float32")


def col_max() -> Zoo:
    x = _ph((64, 24), "X")
    return _mod(x, topi.max(x, axis=0)), lambda v: v.max(0)


def elementwise_chain() -> Zoo:
    x, y = _ph((32, 48), "X"), _ph((32, 48), "Y")
    a = te.compute((32, 48), lambda i, j: x[i, j] + y[i, j], name="add")
    b = te.compute((32, 48), lambda i, j: a[i, j] * 2.0, name="mul")
    c = te.compute((32, 48), lambda i, j: te.max(b[i, j], 0.0), name="relu")
    return _mod(x, y, c), lambda u, v: np.maximum((u + v) * 2, 0)


def transpose() -> Zoo:
    x = _ph((32, 48), "X")
    return _mod(x, topi.transpose(x)), lambda v: v.T


ZOO: dict[str, Callable[[], Zoo]] = {
    "matmul": matmul, "batch_matmul": batch_matmul, "conv2d_nchw": conv2d_nchw,
    "depthwise_conv2d": depthwise_conv2d, "softmax": softmax, "layer_norm": layer_norm,
    "row_sum": row_sum, "full_sum": full_sum, "col_max": col_max,
    "elementwise_chain": elementwise_chain, "transpose": transpose,
}
TILED = {"matmul", "batch_matmul", "conv2d_nchw"}
"""Workloads whose every candidate is multi-level tiled (the demo's matrix-vector product
also has cross-thread-reduction sketches)."""
ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def sm80():
    return cuda_target("sm_80")


@pytest.fixture(scope="module")
def zoo(demo) -> dict[str, Zoo]:
    """Every zoo workload plus the demo MLP's fused_matmul_add_relu."""
    out = {name: make() for name, make in ZOO.items()}
    low, _ = demo
    fused = [f for gv, f in low.functions.items() if gv.name_hint == "fused_matmul_add_relu"]
    out["fused_matmul_add_relu"] = (normalize_mod(fused[0]),
                                    lambda x, w, b: np.maximum(x @ w + b, 0))
    return out


_CANDIDATES: dict[str, list] = {}


def candidates(name: str, zoo, target) -> list:
    """The sampled candidates of a zoo workload (sampled once per session)."""
    if name not in _CANDIDATES:
        mod, _ = zoo[name]
        _CANDIDATES[name] = ReplaySearch(mod, target, seed=7).next_candidates(N_CANDIDATES)
    return _CANDIDATES[name]


def _thread_tags(func: tirx.PrimFunc) -> set[str]:
    tags: set[str] = set()

    def on_for(loop):
        if loop.thread_binding is not None:
            tags.add(str(loop.thread_binding.thread_tag))

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_for)])
    return tags


def _scopes(func: tirx.PrimFunc) -> set[str]:
    scopes: set[str] = set()

    def on_block(blk):
        for buf in blk.alloc_buffers:
            scopes.add(str(buf.scope()))

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, on_block)])
    return scopes


# ---------------------------------------------------------------------------------------
# CI: generate, check, compile (no GPU needed)


ALL = sorted(ZOO) + ["fused_matmul_add_relu"]


@pytest.mark.parametrize("name", ALL)
def test_zoo_candidates_are_valid_gpu_kernels(name, zoo, sm80):
    """Candidates exist, replay from their JSON trace, pass the schedule and target-limit
    checks, and bind every block to GPU threads."""
    cands = candidates(name, zoo, sm80)
    assert len(cands) == N_CANDIDATES, "the CUDA space gave too few candidates"
    mod, _ = zoo[name]
    verify = VerifyGPUCode(gpu_params(sm80), sm80)
    for cand in cands:
        again = schedule_from_json(mod, cand.trace_json)
        assert tvm_ffi.structural_equal(again.mod, cand.sch.mod)
        assert check_schedule(cand.sch, sm80) is None
        assert verify.why_not(cand.sch.mod) is None
        tags = _thread_tags(cand.sch.mod["main"])
        assert "blockIdx.x" in tags, cand.sch.trace
        if name in TILED:  # SSSRRSRS: block / vthread / thread, shared inputs, local sums
            assert {"blockIdx.x", "vthread.x", "threadIdx.x"} <= tags
            assert {"shared", "local"} <= _scopes(cand.sch.mod["main"]), cand.sch.trace


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_zoo_candidates_compile_with_nvcc(arch, zoo, sm80):
    """Every zoo workload's candidates (sampled for sm_80) compile to one cubin for sm_80
    and for sm_90 (one nvcc run per architecture keeps CI fast)."""
    funcs = {}
    for name in ALL:
        for i, cand in enumerate(candidates(name, zoo, sm80)):
            funcs[f"{name}_{i}"] = cand.sch.mod["main"].with_attr("global_symbol",
                                                                  f"{name}_{i}")
    assert {symbol.rsplit("_", 1)[0] for symbol in funcs} == set(ALL)  # each has candidates
    binary = compile_cuda(tvm.IRModule(funcs), cuda_target(arch))
    for symbol in funcs:
        assert f"{symbol}_kernel".encode() in binary, symbol


@pytest.mark.parametrize("name", ["softmax", "fused_matmul_add_relu"])
def test_cross_thread_reduction_is_in_the_space(name, zoo, sm80):
    """Softmax's reductions and the demo's matrix-vector product get sketches whose
    reduction loop is bound to threadIdx.x."""
    mod, _ = zoo[name]
    sketches = generate_design_space(mod, sm80)
    assert len(sketches) >= 2
    space = space_for_target(sm80)
    found = False
    for sketch in sketches:
        outs = [space.replay(mod, without_decisions(sketch), seed=seed)
                for seed in (99, 2**20 + 3, 2**30 + 5)]
        out = next((o for o in outs if o.ok), None)
        assert out is not None, outs[0].error
        for blk in _blocks(out.sch.mod["main"]):
            if blk.init is None:
                continue
            sch = out.sch
            b = sch.get_sblock(blk.name_hint)
            for loop in sch.get_loops(b):
                stmt = sch.get(loop)
                if stmt.thread_binding is not None and \
                        str(stmt.thread_binding.thread_tag) == "threadIdx.x" and \
                        "k" in str(stmt.loop_var):
                    found = True
    assert found


def _blocks(func):
    out = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, out.append)])
    return out


def _max_threads(func: tirx.PrimFunc) -> int:
    best = 1

    def on_attr(node):
        nonlocal best
        if str(node.attr_key) == "thread_extent" and str(node.node.thread_tag).startswith(
                "threadIdx") and isinstance(node.value, tirx.IntImm):
            best = max(best, int(node.value.value))

    tvm_ffi.structural_walk(func.body, [(tirx.AttrStmt, on_attr)])
    return best


def test_target_limits_bound_the_candidates(zoo):
    """A target with at most 64 threads per block gets only candidates within it."""
    small = tvm.target.Target({"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 64,
                               "max_num_threads": 64, "thread_warp_size": 32}, host="llvm")
    assert gpu_params(small).max_threads_per_block == 64
    mod, _ = zoo["matmul"]
    cands = ReplaySearch(mod, small, seed=5).next_candidates(4)
    assert len(cands) == 4
    for cand in cands:
        lowered = lower_for_verification(cand.sch.mod, small)
        assert _max_threads(lowered["main"]) <= 64


def test_verify_rejects_too_many_threads_and_too_much_shared_memory(zoo, sm80):
    mod, _ = zoo["elementwise_chain"]
    sch = Schedule(mod)
    blk = sch.get_sblock("relu")
    i, j = sch.get_loops(blk)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")  # 48 threads: fine
    assert VerifyGPUCode(gpu_params(sm80), sm80).why_not(sch.mod) is None
    tight = dataclasses.replace(gpu_params(sm80), max_threads_per_block=32)
    reason = VerifyGPUCode(tight, sm80).why_not(sch.mod)
    assert reason is not None and "max_threads_per_block" in reason

    cands = candidates("matmul", zoo, sm80)
    no_shared = dataclasses.replace(gpu_params(sm80), max_shared_memory_per_block=16)
    assert all(VerifyGPUCode(no_shared, sm80).why_not(c.sch.mod) is not None for c in cands)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_matmul_gives_valid_candidates(dtype, sm80):
    """At 4096^3 (the GPU benchmark's shape) the capped tile levels keep samples within the
    target's limits: candidates come without a long run of rejected samples."""
    a, b = te.placeholder((4096, 4096), dtype, "A"), te.placeholder((4096, 4096), dtype, "B")
    mod = _mod(a, b, topi.matmul(a, b))
    search = ReplaySearch(mod, sm80, seed=1, max_fail_streak=8)
    cands = search.next_candidates(6)
    assert len(cands) == 6, search.errors
    verify = VerifyGPUCode(gpu_params(sm80), sm80)
    assert all(verify.why_not(c.sch.mod) is None for c in cands)


def test_gpu_params_from_target():
    a100 = gpu_params(tvm.target.Target("nvidia/nvidia-a100"))
    assert (a100.max_threads_per_block, a100.max_shared_memory_per_block,
            a100.registers_per_block, a100.warp_size) == (1024, 49152, 65536, 32)
    bare = gpu_params(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    assert bare == GPUParams()
    t = cuda_target("sm_90")
    assert str(t.attrs["arch"]) == "sm_90" and t.host is not None
    with pytest.raises(RelaxTuneError, match="compute capability"):
        cuda_target("ampere")


def test_ensure_cuda_compiler_picks_an_available_compiler(monkeypatch):
    """Without NVRTC's Python bindings, TVM is told to compile CUDA modules with nvcc."""
    from relax_tune.space.gpu import compile as gpu_compile

    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    mode = gpu_compile.ensure_cuda_compiler()
    if gpu_compile._has_nvrtc_bindings():
        assert mode == "nvrtc"
    elif find_nvcc() is not None:
        assert mode == "nvcc" and tvm.support.nvcc.find_cuda_path()
    else:
        assert mode is None  # neither compiler: nothing to choose
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "NVRTC")
    assert gpu_compile.ensure_cuda_compiler() == "nvrtc"


def test_cuda_source_needs_bound_kernels(zoo, sm80):
    """An unscheduled function is no GPU kernel: codegen refuses it with a clear error."""
    mod, _ = zoo["transpose"]
    with pytest.raises(RelaxTuneError, match="no CUDA kernel: bind its loops"):
        cuda_source(mod, sm80)


# ---------------------------------------------------------------------------------------
# Tuned where tuned, dlight elsewhere


def _record_for(mod: tvm.IRModule, cand, db: MemoryDatabase, target) -> None:
    wl = db.commit_workload(mod)
    db.commit_tuning_record(TuningRecord(cand.trace_json, wl, run_secs=[1e-5], target=target))


def test_apply_database_then_dlight_compiles_the_demo_model(sm80):
    """The demo MLP for CUDA: fused_matmul_add_relu gets its tuned GPU schedule from the
    database, every other function a dlight schedule; the whole model compiles (and, on a
    GPU, matches numpy)."""
    from relax_tune.demo import demo_model

    model, params = demo_model()
    with sm80:
        low = relax.get_pipeline("zero")(model)
    funcs = {gv.name_hint: f for gv, f in low.functions.items() if isinstance(f, tirx.PrimFunc)}
    fused = normalize_mod(funcs["fused_matmul_add_relu"])
    cand = ReplaySearch(fused, sm80, seed=11).next_candidates(1)[0]
    db = MemoryDatabase()
    _record_for(fused, cand, db, sm80)
    with sm80:
        out = tvm.transform.Sequential([ApplyDatabase(database=db),
                                        default_schedule_pass()])(low)
    got = {gv.name_hint: f for gv, f in out.functions.items() if isinstance(f, tirx.PrimFunc)}
    assert tvm_ffi.structural_equal(got["fused_matmul_add_relu"].body,
                                    cand.sch.mod["main"].body)
    for name, func in got.items():
        assert "blockIdx.x" in _thread_tags(func) or "blockIdx.x" in str(func), name
    ex = tvm.compile(out, sm80)
    if find_nvcc() is not None:
        assert b"fused_matmul_add_relu_kernel" in compile_cuda(out, sm80)
    if HAS_GPU:
        _run_demo(ex, params)


def _run_demo(ex, params) -> None:
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 784)).astype("float32")
    pn = {n: rng.uniform(-0.1, 0.1, [int(d) for d in p.shape]).astype("float32")
          for n, p in params}
    out = vm["forward"](tvm.runtime.tensor(x, dev),
                        *[tvm.runtime.tensor(pn[n], dev) for n, _ in params]).numpy()
    names = [n for n, _ in params]
    w1, b1, w2 = (pn[n] for n in names)
    np.testing.assert_allclose(out, np.maximum(x @ w1.T + b1, 0) @ w2.T, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------
# Run time (only where a GPU is present)


def _gpu_target() -> tvm.target.Target:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return cuda_target(f"sm_{major}{minor}")


@needs_gpu
@pytest.mark.parametrize("name", ALL)
def test_zoo_candidates_match_numpy_on_gpu(name, zoo):
    target = _gpu_target()
    mod, ref = zoo[name]
    rng = np.random.default_rng(0)
    params = list(mod["main"].params)
    ins = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(str(p.dtype))
           for p in params[:-1]]
    expected = ref(*ins)
    out = params[-1]
    dev = tvm.cuda(0)
    cands = ReplaySearch(mod, target, seed=7).next_candidates(N_CANDIDATES)
    assert cands
    for cand in cands:
        ex = tvm.compile(cand.sch.mod, target)
        args = [tvm.runtime.tensor(a, dev) for a in ins]
        args.append(tvm.runtime.empty([int(d) for d in out.shape], str(out.dtype), dev))
        ex.mod["main"](*args)
        dev.sync()
        np.testing.assert_allclose(args[-1].numpy(), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=str(cand.sch.trace))
