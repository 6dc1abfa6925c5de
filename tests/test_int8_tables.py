"""Quantized elementwise functions as table lookups (lowering/int8_tables.py) in a model:
EfficientNet's SiLU as one lookup, the lookups fused into the convolutions' kernels, and a
fused lookup vectorised no wider than a register of indices."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_tune.model_loader import load_model
from relax_tune.search import ReplaySearch
from relax_tune.space.params import target_params
from relax_tune.utils import host_target, normalize_mod

try:  # the model test needs both
    import onnxruntime as ort

    from relax_tune.testing.quantized import mbconv_model, ort_run, output_scale, save_quantized
except ImportError:
    ort = None
needs_ort = pytest.mark.skipif(ort is None, reason="needs onnx and onnxruntime")


def _calls_tir(mod: tvm.IRModule) -> list[str]:
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            names.append(expr.args[0].name_hint)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


@needs_ort
def test_silu_is_one_lookup_fused_into_the_convolution(target, tmp_path):
    """EfficientNet's block (SiLU as ``x * Sigmoid(x)``, a squeeze-and-excite gate): each
    quantized SiLU is one table lookup, fused into the kernel before it (no kernel is a
    lookup alone), no kernel moves the channels-last tensors back to NCHW and forth (only
    the model's NCHW input and output are transposed), and the model computes the QDQ
    model's meaning (ONNX Runtime, basic optimisations) within one step."""
    float_path, qdq_path = save_quantized(mbconv_model(), str(tmp_path), "mbconv")
    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    loaded = load_model(qdq_path)
    with target:
        kernels = _calls_tir(loaded.lowered(target, int8=True))
    lookups = [k for k in kernels if "take" in k]
    assert len(lookups) == 4, kernels  # three SiLUs and the gate's sigmoid
    assert not any(k.startswith("take") for k in lookups), lookups
    assert sum("conv2d" in k for k in lookups) >= 2, lookups
    moving = [i for i, k in enumerate(kernels) if "transpose" in k]
    assert moving == [0, len(kernels) - 1], kernels
    ex = tvm.compile(loaded.mod, target, relax_pipeline=loaded.compile_pipeline(
        target, str(tmp_path / "wd"), max_trials_global=0, int8=True))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    steps = np.abs(got - ort_run(qdq_path, x, basic=True)) / output_scale(qdq_path)
    assert steps.max() <= 1 + 1e-3 and np.mean(steps > 0.5) <= 0.01, steps.max()


def _vector_widths(sch) -> list[int]:
    script = sch.mod["main"].script()
    return [int(n) for n in re.findall(r"T\.vectorized\((?:T\.int64\()?(\d+)", script)]


LOOKUP = """
@T.prim_func(s_tir=True)
def main(x: T.Buffer((64, 1024), "uint8"), table: T.Buffer((256,), "uint8"),
         out: T.Buffer((64, 1024), "uint8")):
    T.func_attr({"tirx.noalias": True})
    for i, j in T.grid(64, 1024):
        with T.sblock("out"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            T.reads(table[0:256], x[v_i, v_j])
            T.writes(out[v_i, v_j])
            out[v_i, v_j] = EXPR
"""
"""A lookup as ``FuseTIR`` leaves one fused into a kernel: the table's whole range read."""


@pytest.mark.parametrize("gather", [True, False])
def test_a_lookup_is_vectorised_no_wider_than_a_register_of_indices(gather):
    """An elementwise u8 kernel with a fused table lookup: no sampled candidate vectorises
    more lanes than one register of int32 indices holds (LLVM took 2.5 s to compile a
    256-lane lookup, and a gather loads lane by lane anyway); without the lookup wider
    vectors are sampled, so the bound is the lookup's."""
    target = host_target()
    expr = ('table[T.Cast("int32", x[v_i, v_j])]' if gather
            else 'x[v_i, v_j] + table[0]')
    mod = normalize_mod(tvm.script.from_source(LOOKUP.replace("EXPR", expr)))
    widths = [w for cand in ReplaySearch(mod, target, seed=3).next_candidates(16)
              for w in _vector_widths(cand.sch)]
    lanes = target_params(target).lanes("int32")
    assert widths
    assert (max(widths) <= lanes) == gather, (widths, lanes)
