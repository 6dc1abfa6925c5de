"""Integer kernels as ``lowering.int8`` makes them, for the int8 instruction tests and the
kernel measurements of docs/design/int8.md (``benchmarks/bench_int8_kernels.py``): one
u8 x s8 -> int32 convolution or matmul with the requantisation epilogue (or the same layer
in float32), lowered for a target (LLVM cross-compiles for any x86 ``mcpu``
on any x86 host), and helpers to read the built library's assembly and run it."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


WEIGHT_BOUND = {8: 127, 7: 64}
"""The symmetric s8 weights' largest magnitude, by bits: ONNX Runtime's quantizer writes
[-127, 127], and [-64, 64] with ``reduce_range`` (every pair then within
``int8_intrin.NARROW_PAIR_LIMIT``)."""


def integer_kernel(kind: str, target: tvm.target.Target, rows: int = 16, reduce: int = 64,
                   channels: int = 32, size: int = 8, zero_point: int | None = None,
                   weights_bound: bool = False, weight_bits: int = 8,
                   padding: int = 0) -> tvm.IRModule:
    """The int8 task of a one-layer model written with the Relax ops ``IntegerQDQ`` emits,
    lowered for ``target`` (``lowering_passes``; ``weights_bound``: the weight marked
    layout-free, as a model's bound weights are, ``cpu_weight_prepack``; ``weight_bits=7``:
    weights in [-64, 64], as ONNX Runtime's ``reduce_range`` quantizes them, which AVX2's
    ``vpmaddubsw`` multiplies exactly: the task is then marked ``NARROW_PAIRS_ATTR``):

    - ``kind="matmul"``: u8 ``(rows, reduce)`` x s8 ``(reduce, channels)``;
    - ``kind="conv2d"``: u8 ``(1, reduce, size, size)`` x s8 ``(channels, reduce, 3, 3)``,
      unpadded, or with ``zero_point``: padded by 1 with it first (a separate ``pad``, as
      ``IntegerQDQ`` emits it: a kernel of its own, the task reads the padded input), or
      with ``padding``: the convolution's own zero padding (as ``IntegerQDQ`` emits it
      for a zero point of 0: the task pads inside);

    then ``uint8(clip(round(float(acc) / 4096), 0, 255))``."""
    rng = np.random.default_rng(3)

    def epilogue(acc):
        y = relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"),
                                             relax.const(np.float32(1 / 4096))))
        return relax.op.astype(relax.op.clip(y, 0, 255), "uint8")

    bound = WEIGHT_BOUND[weight_bits]
    return _layer(kind, target, rows, reduce, channels, size, "uint8",
                  lambda *shape: rng.integers(-bound, bound + 1, shape).astype("int8"),
                  None if zero_point is None else float(zero_point), "int32", epilogue,
                  weights_bound, padding)


def float_kernel(kind: str, target: tvm.target.Target, rows: int = 16, reduce: int = 64,
                 channels: int = 32, size: int = 8, pad: bool = False,
                 weights_bound: bool = False) -> tvm.IRModule:
    """``integer_kernel``'s layer in float32 (``pad``: zero-padded by 1), then a ReLU: what
    the same layer costs unquantized."""
    rng = np.random.default_rng(3)
    return _layer(kind, target, rows, reduce, channels, size, "float32",
                  lambda *shape: rng.standard_normal(shape).astype("float32"),
                  0.0 if pad else None, "float32", relax.op.nn.relu, weights_bound)


def _layer(kind, target, rows, reduce, channels, size, in_dtype, weight, pad_value,
           acc_dtype, epilogue, weights_bound, padding=0) -> tvm.IRModule:
    from ..transform import extract_tasks, lowering_passes

    if kind == "matmul":
        x = relax.Var("x", relax.TensorType((rows, reduce), in_dtype))
        acc = relax.op.matmul(x, relax.const(weight(reduce, channels)), out_dtype=acc_dtype)
    elif kind == "conv2d":
        x = relax.Var("x", relax.TensorType((1, reduce, size, size), in_dtype))
        data = x if pad_value is None else relax.op.nn.pad(
            x, [0, 0, 0, 0, 1, 1, 1, 1], pad_value=pad_value)
        acc = relax.op.nn.conv2d(data, relax.const(weight(channels, reduce, 3, 3)),
                                 padding=[padding] * 4, out_dtype=acc_dtype)
    else:
        raise ValueError(f"kind must be 'matmul' or 'conv2d', not {kind!r}")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(epilogue(acc))
        bb.emit_func_output(out)
    with target:
        lowered = tvm.transform.Sequential(lowering_passes(
            target, cpu_weight_prepack=weights_bound))(bb.get())
    (task,) = [t for t in extract_tasks(lowered, target)
               if acc_dtype in t.mod.script() and kind in t.task_name]
    return task.mod


def kernel_asm(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """The assembly of ``mod`` built for ``target`` (nothing runs)."""
    return tvm.compile(mod, target=target).mod.inspect_source("asm")


def kernel_args(mod: tvm.IRModule, seed: int = 0) -> list:
    """Seeded full-range arguments for ``mod``'s ``main``: u8 in [0, 255], s8 in
    [-127, 127] (what the quantizer writes; [-64, 64] in a function marked
    ``NARROW_PAIRS_ATTR``, the most its weights may hold), floats in [-1, 1), the output
    last."""
    from ..space.cpu.int8_intrin import NARROW_PAIR_LIMIT, marked_narrow

    rng = np.random.default_rng(seed)
    bound = NARROW_PAIR_LIMIT // 2 if marked_narrow(mod["main"]) else WEIGHT_BOUND[8]
    s8 = (-bound, bound + 1)
    args = []
    for p in mod["main"].params:
        shape, dtype = [int(d) for d in p.shape], str(p.dtype)
        if dtype.startswith("float"):
            value = rng.uniform(-1, 1, shape)
        else:
            value = rng.integers(*((0, 256) if dtype == "uint8" else s8), shape)
        args.append(tvm.runtime.tensor(value.astype(dtype)))
    return args


def run_kernel(mod: tvm.IRModule, target: tvm.target.Target) -> np.ndarray:
    """``mod`` built for ``target`` and run on this host on ``kernel_args``: its output."""
    args = kernel_args(mod)
    tvm.compile(mod, target=target)["main"](*args)
    return args[-1].numpy()
