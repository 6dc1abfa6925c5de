"""The x86 int8 dot-product instructions as TensorIR tensor intrinsics, chosen from the
target's features (never from a CPU name).

One intrinsic computes ``C[16] += sum_k A[4] (u8) * B[16, 4] (s8)`` in int32, the shape of
AVX-512 VNNI's ``vpdpbusd``: 16 output channels times 4 reduction elements a step, with
the 4 bytes of ``A`` broadcast to all 16 lanes. TVM 0.27 registers the same description
as ``dot_16x4_vnni``, but its implementation passes the operands as ``<16 x i32>``, which
the LLVM it ships (22) rejects (the intrinsic takes ``<64 x i8>`` since LLVM 20); the one
here passes bytes. Registered once, on import, under ``relax_tune.``-prefixed names. The
description is written out here rather than imported from ``tvm.s_tir.tensor_intrin.x86``:
importing that package parses every intrinsic TVM ships (CUDA's MMA ones too), which made
``import relax_tune`` take over a minute on this 2-core machine under load.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

VNNI_16X4 = "relax_tune.dot_16x4_u8s8i32_vnni"
"""``vpdpbusd`` (AVX512-VNNI), 16 x 4 bytes a step."""

LANES, DEPTH = 16, 4
"""Output channels and reduction elements one instruction step covers."""


@T.prim_func(s_tir=True)
def _desc(a: T.Buffer((4,), "uint8", offset_factor=1),
          b: T.Buffer((16, 4), "int8", offset_factor=1),
          c: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _vnni(a: T.Buffer((4,), "uint8", offset_factor=1),
          b: T.Buffer((16, 4), "int8", offset_factor=1),
          c: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        a_word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
        c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            c.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(a_word, 16), dtype="int8x64"),
            b.vload([0, 0], dtype="int8x64"),
            dtype="int32x16")


def _register() -> None:
    try:
        TensorIntrin.get(VNNI_16X4, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet (TVM raises a ValueError/TVMError)
        TensorIntrin.register(VNNI_16X4, _desc, _vnni)


_register()


def int8_dot_intrinsic(target: tvm.target.Target | None) -> str | None:
    """The name of the int8 dot-product intrinsic ``target`` has (u8 x s8 -> i32, 16 x 4),
    or None: AVX512-VNNI's ``vpdpbusd`` on x86 targets with the ``avx512vnni`` feature
    (read from the target's mcpu/mattr through LLVM) and an LLVM that takes its byte
    operands (20 and later)."""
    if target is None or target.kind.name != "llvm" or codegen.llvm_version_major() < 20:
        return None
    try:
        has = codegen.target_has_features("avx512vnni", target)
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe: no int8 instruction
        return None
    return VNNI_16X4 if has else None
