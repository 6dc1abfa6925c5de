"""The correctness zoo: for every common operator, sampled candidates of the CPU design space
build and compute what numpy computes (float32, rtol 1e-4). A candidate that fails to build
or run is a failure here, never a skip."""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx, topi

from relax_tune.search import ReplaySearch
from relax_tune.space import check_schedule, space_for_target
from relax_tune.space.generator import without_decisions
from relax_tune.utils import normalize_mod, schedule_from_json

N_CANDIDATES = 8
"""Candidates checked per workload (and for the fused Relax kernel)."""
MORE_CANDIDATES = 32
"""Candidates per workload of the slow run's longer check (test_more_zoo_candidates_...)."""

Zoo = tuple[tvm.IRModule, Callable[..., np.ndarray]]


def _mod(*tensors) -> tvm.IRModule:
    return normalize_mod(te.create_prim_func(list(tensors)))


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


# ---------------------------------------------------------------------------------------
# Workloads (small shapes) and their numpy references


def matmul_square() -> Zoo:
    a, b = _ph((64, 64), "A"), _ph((64, 64), "B")
    return _mod(a, b, topi.matmul(a, b)), lambda x, y: x @ y


def matmul_skinny() -> Zoo:
    a, b = _ph((1, 784), "A"), _ph((784, 256), "B")
    return _mod(a, b, topi.matmul(a, b)), lambda x, y: x @ y


def classifier_1000() -> Zoo:
    """A classifier's 1000 classes: 125 vectors of 8 lanes (5 x 5 x 5), so the sampled
    register tile is one vector; the register check once asked for more, rejecting every
    candidate (MobileNetV2's classifier stayed untuned on AVX2)."""
    a, b = _ph((1, 64), "A"), _ph((64, 1000), "B")
    return _mod(a, b, topi.matmul(a, b)), lambda x, y: x @ y


def dense() -> Zoo:
    x, w = _ph((16, 64), "X"), _ph((32, 64), "W")
    return _mod(x, w, topi.nn.dense(x, w)), lambda u, v: u @ v.T


def batch_matmul() -> Zoo:
    a, b = _ph((2, 16, 32), "A"), _ph((2, 24, 32), "B")
    return _mod(a, b, topi.nn.batch_matmul(a, b)), lambda x, y: x @ y.transpose(0, 2, 1)


def batch_matmul_prime() -> Zoo:
    """Attention scores of a ViT: a token count that is prime and over the innermost tile
    bound (197 there), so no perfect tile reaches the register minimum."""
    a, b = _ph((2, 67, 16), "A"), _ph((2, 67, 16), "B")
    return _mod(a, b, topi.nn.batch_matmul(a, b)), lambda x, y: x @ y.transpose(0, 2, 1)


def _conv_ref_nchw(x, w, pad):
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return np.einsum("ncyxij,fcij->nfyx", win, w)


def conv2d_nchw() -> Zoo:
    x, w = _ph((1, 8, 14, 14), "X"), _ph((16, 8, 3, 3), "W")
    return _mod(x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)), lambda u, v: _conv_ref_nchw(u, v, 1)


def conv2d_nhwc() -> Zoo:
    x, w = _ph((1, 14, 14, 8), "X"), _ph((3, 3, 8, 16), "W")

    def ref(u, v):
        out = _conv_ref_nchw(u.transpose(0, 3, 1, 2), v.transpose(3, 2, 0, 1), 1)
        return out.transpose(0, 2, 3, 1)

    return _mod(x, w, topi.nn.conv2d_nhwc(x, w, 1, 1, 1)), ref


def depthwise_conv2d() -> Zoo:
    x, w = _ph((1, 8, 14, 14), "X"), _ph((8, 1, 3, 3), "W")

    def ref(u, v):
        xp = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
        return np.einsum("ncyxij,cij->ncyx", win, v[:, 0])

    return _mod(x, w, topi.nn.depthwise_conv2d_nchw(x, w, 1, 1, 1)), ref


def conv2d_bias_relu() -> Zoo:
    x, w, b = _ph((1, 8, 14, 14), "X"), _ph((16, 8, 3, 3), "W"), _ph((1, 16, 1, 1), "Bias")
    y = topi.nn.relu(topi.add(topi.nn.conv2d_nchw(x, w, 1, 1, 1), b))
    return _mod(x, w, b, y), lambda u, v, c: np.maximum(_conv_ref_nchw(u, v, 1) + c, 0)


def max_pool2d() -> Zoo:
    x = _ph((1, 8, 14, 14), "X")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW")

    def ref(u):
        xp = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
        return win.max(axis=(-2, -1))

    return _mod(x, y), ref


def avg_pool2d() -> Zoo:
    x = _ph((1, 8, 14, 14), "X")
    y = topi.nn.pool2d(x, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "avg", layout="NCHW")

    def ref(u):
        win = np.lib.stride_tricks.sliding_window_view(u, (2, 2), axis=(2, 3))[:, :, ::2, ::2]
        return win.mean(axis=(-2, -1))

    return _mod(x, y), ref


def softmax() -> Zoo:
    x = _ph((16, 64), "X")

    def ref(u):
        e = np.exp(u - u.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return _mod(x, topi.nn.softmax(x, axis=-1)), ref


def layer_norm() -> Zoo:
    x, g, b = _ph((16, 64), "X"), _ph((64,), "G"), _ph((64,), "Bt")
    y = topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)

    def ref(u, gv, bv):
        mu, var = u.mean(-1, keepdims=True), u.var(-1, keepdims=True)
        return (u - mu) / np.sqrt(var + 1e-5) * gv + bv

    return _mod(x, g, b, y), ref


def row_sum() -> Zoo:
    x = _ph((32, 256), "X")
    return _mod(x, topi.sum(x, axis=1)), lambda u: u.sum(axis=1)


def full_sum() -> Zoo:
    x = _ph((64, 128), "X")
    return _mod(x, topi.sum(x, axis=(0, 1), keepdims=True)), lambda u: u.sum(keepdims=True)


def col_max() -> Zoo:
    x = _ph((128, 24), "X")
    return _mod(x, topi.max(x, axis=0)), lambda u: u.max(axis=0)


def elementwise_chain() -> Zoo:
    x, y = _ph((32, 48), "X"), _ph((32, 48), "Y")
    a = te.compute((32, 48), lambda i, j: x[i, j] + y[i, j], name="add")
    b = te.compute((32, 48), lambda i, j: a[i, j] * 2.0, name="mul")
    c = te.compute((32, 48), lambda i, j: te.max(b[i, j], 0.0), name="relu")
    d = te.compute((32, 48), lambda i, j: te.sigmoid(c[i, j]), name="sigmoid")
    return _mod(x, y, d), lambda u, v: 1 / (1 + np.exp(-np.maximum((u + v) * 2, 0)))


def transpose() -> Zoo:
    x = _ph((48, 64), "X")
    return _mod(x, topi.transpose(x, (1, 0))), lambda u: u.T


def concatenate() -> Zoo:
    a, b = _ph((16, 24), "A"), _ph((16, 40), "B")
    return _mod(a, b, topi.concatenate([a, b], axis=1)), lambda u, v: np.concatenate([u, v], 1)


ZOO: dict[str, Callable[[], Zoo]] = {f.__name__: f for f in (
    matmul_square, matmul_skinny, classifier_1000, dense, batch_matmul, batch_matmul_prime, conv2d_nchw, conv2d_nhwc,
    depthwise_conv2d, conv2d_bias_relu, max_pool2d, avg_pool2d, softmax, layer_norm, row_sum,
    full_sum, col_max, elementwise_chain, transpose, concatenate)}

SMALL_SPACES = {"elementwise_chain", "transpose", "concatenate"}
"""Spatial-only workloads: their spaces (sampled parallel job counts) hold a handful of
distinct programs, maybe fewer than the candidates asked for: then every one is checked."""


# ---------------------------------------------------------------------------------------
# Checking


def _inputs(mod: tvm.IRModule, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = list(mod["main"].params)
    ins = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(str(p.dtype))
           for p in params[:-1]]
    out = params[-1]
    return ins, ([int(d) for d in out.shape], str(out.dtype))


def _run(mod: tvm.IRModule, target, ins, out_spec) -> np.ndarray:
    lib = tvm.compile(mod, target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in ins]
    args.append(tvm.runtime.empty(out_spec[0], out_spec[1], dev))
    lib.mod["main"](*args)
    return args[-1].numpy()


def check_zoo(mod: tvm.IRModule, ref, target, name: str, count: int = N_CANDIDATES) -> int:
    """Draw up to ``count`` distinct candidates; every one must replay from JSON, pass the
    checks, build and match numpy. Returns how many were checked."""
    ins, out_spec = _inputs(mod)
    expected = ref(*ins)
    search = ReplaySearch(mod, target, seed=zlib.crc32(name.encode()) % 1000 + 1)
    cands = search.next_candidates(count)
    for cand in cands:
        again = schedule_from_json(mod, cand.trace_json)
        assert tvm_ffi.structural_equal(again.mod, cand.sch.mod)
        assert check_schedule(cand.sch, target) is None
        got = _run(cand.sch.mod, target, ins, out_spec)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name}:\n{cand.sch.trace}")
    return len(cands)


def _check_workload(name: str, target, count: int) -> None:
    mod, ref = ZOO[name]()
    checked = check_zoo(mod, ref, target, name, count)
    assert checked == (min(count, len(_distinct_programs(mod, target)))
                       if name in SMALL_SPACES else count)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_candidates_match_numpy(name, target):
    _check_workload(name, target, N_CANDIDATES)


@pytest.mark.slow  # test_zoo_candidates_match_numpy, four times the candidates
@pytest.mark.parametrize("name", list(ZOO))
def test_more_zoo_candidates_match_numpy(name, target):
    _check_workload(name, target, MORE_CANDIDATES)


def _distinct_programs(mod: tvm.IRModule, target, draws: int = 64) -> set[int]:
    """Structural hashes of the programs ``draws`` replay-search samples produce (traces
    only: nothing is compiled, so any x86 target can be asked on any host)."""
    search = ReplaySearch(mod, target, seed=7)
    return {tvm_ffi.structural_hash(c.sch.mod) for c in search.next_candidates(draws)}


@pytest.mark.parametrize("mcpu", ["znver3", "rocketlake"])
@pytest.mark.parametrize("name", sorted(SMALL_SPACES))
def test_spatial_spaces_offer_choices_on_avx2_and_avx512(name, mcpu):
    """A spatial-only workload's space holds real choices (vector width, parallel grain) on
    an AVX2 target and on an AVX-512 one alike, whatever this host is."""
    mod, _ = ZOO[name]()
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert len(_distinct_programs(mod, target)) >= 2


def test_relax_fused_matmul_add_relu(target, demo):
    """The Relax-lowered ``fused_matmul_add_relu`` of the demo MLP (zero pipeline)."""
    lowered, _ = demo
    funcs = {gv.name_hint: f for gv, f in lowered.functions.items()
             if isinstance(f, tirx.PrimFunc)}
    mod = normalize_mod(funcs["fused_matmul_add_relu"])
    assert check_zoo(mod, lambda x, w, b: np.maximum(x @ w + b, 0), target,
                     "fused_matmul_add_relu") == N_CANDIDATES


@pytest.mark.parametrize("name", ["matmul_square", "dense", "batch_matmul"])
def test_in_kernel_operand_packing(name, target):
    """Candidates whose sketch chose to pack the reused input in the kernel (B of A @ B, W
    of dense, B of batch_matmul) copy it into a packed buffer at the start of the call and
    still match numpy; A (read along the rows) is never packed. (topi marks dense's W
    layout-free; here it is an input like any other.)"""
    mod, ref = ZOO[name]()
    mod = normalize_mod(mod["main"].without_attr("layout_free_buffers"))
    space = space_for_target(target)
    # a padded sketch (pad_einsum: the 24-wide output of batch_matmul is not a whole number
    # of AVX-512 vectors) reads a padded copy, not the input: nothing left to pack
    sketches = [s for s in space.generate_design_space(mod) if "pad_einsum" not in str(s)]
    assert sketches and all("relax_tune.pack_operands" in str(s) for s in sketches)
    ins, out_spec = _inputs(mod)
    expected = ref(*ins)
    packed = 0
    for seed in range(1, 80):
        replayed = space.replay(mod, without_decisions(sketches[seed % len(sketches)]),
                                seed=seed)
        if not replayed.ok:
            continue
        names = [b.name_hint for b in _blocks(replayed.sch.mod["main"])]
        copies = [n for n in names if n.endswith("_global") and n[0] in "BW"]
        assert not any(n.startswith(("A_global", "X_global")) for n in names), names
        if not copies:
            continue
        got = _run(replayed.sch.mod, target, ins, out_spec)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5,
                                   err_msg=str(replayed.sch.trace))
        packed += 1
        if packed == 6:
            break
    assert packed == 6


def test_packing_skips_convolutions_skinny_gemms_and_constant_weights(target):
    """Convolution inputs are indexed by sums (h + kh) and a 1-row GEMM reads each weight
    once: no packing choice. A weight marked layout-free is packed once at compile time
    instead, so it gets no in-kernel choice either."""
    space = space_for_target(target)
    for name in ("conv2d_nchw", "matmul_skinny"):
        mod, _ = ZOO[name]()
        assert not any("relax_tune.pack_operands" in str(s)
                       for s in space.generate_design_space(mod)), name
    mod, _ = ZOO["matmul_square"]()
    weights = normalize_mod(mod["main"].with_attr("layout_free_buffers", [1]))
    assert not any("relax_tune.pack_operands" in str(s)
                   for s in space.generate_design_space(weights))


def _blocks(func: tirx.PrimFunc) -> list:
    found: list = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, found.append)])
    return [b for b in found if b.name_hint != "root"]


def test_awkward_extents_get_a_padded_sketch(target):
    """A GEMM over a ViT's 197 tokens (prime): no perfect tile gives the rows a register
    tile, so the space also offers the block padded to 200 rows (``pad_einsum``); its
    candidates build and match numpy. Extents that tile well get no padded sketch."""
    x, w = _ph((197, 64), "X"), _ph((64, 96), "W")
    mod = _mod(x, w, topi.matmul(x, w))
    space = space_for_target(target)
    padded = [s for s in space.generate_design_space(mod) if "pad_einsum" in str(s)]
    assert padded
    ins, out_spec = _inputs(mod)
    expected = ins[0] @ ins[1]
    built = 0
    for seed in range(1, 40):
        replayed = space.replay(mod, without_decisions(padded[seed % len(padded)]), seed=seed)
        if not replayed.ok:
            continue
        assert check_schedule(replayed.sch, target) is None
        names = [b.name_hint for b in _blocks(replayed.sch.mod["main"])]
        assert "X_pad" in names, names
        got = _run(replayed.sch.mod, target, ins, out_spec)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5,
                                   err_msg=str(replayed.sch.trace))
        built += 1
        if built == 4:
            break
    assert built == 4
    square, _ = ZOO["matmul_square"]()
    assert not any("pad_einsum" in str(s) for s in space.generate_design_space(square))
