"""The x86 int8 dot-product instructions as TensorIR tensor intrinsics, chosen from the
target's features (never from a CPU name).

Each intrinsic computes ``C[lanes] += sum_k A[depth] (u8) * B[lanes, depth]`` in int32:
``depth`` bytes of ``A`` broadcast to all lanes, ``B`` a packed weight tile. One per
instruction family, best first:

- ``vpdpbusd`` on 512 bits (AVX512-VNNI): 16 lanes x 4 bytes, s8 weights;
- ``vpdpbusd`` on 256 bits (AVX-VNNI, the VEX form on CPUs without AVX-512): 8 x 4;
- ``vpmaddwd`` (AVX2): 8 lanes x 2, the weights widened to s16 when they are packed and
  the 2 activation bytes zero-extended to s16, s16 x s16 pairs summed into int32: exact.
- ``vpmaddubsw`` (AVX2) for functions marked ``NARROW_PAIRS_ATTR`` only: 8 lanes x 4 bytes,
  s8 weights, each u8 x s8 pair summed into an s16 (then ``vpmaddwd`` by ones into int32).
  That s16 *saturates*: two products of full-range operands (255 * 127 * 2 = 64770) exceed
  32767, so it computes what the QDQ graph means only where every pair of weights it sums
  has ``|w0| + |w1| <= 128`` (255 * 128 = 32640). ``lowering.int8_pairs`` checks that on the
  constant weights at compile time and marks the function; ``utils.apply_trace_json``
  refuses a trace that names it on an unmarked function.

TVM 0.27 registers the VNNI description as ``dot_16x4_vnni``, but its implementation passes
the operands as ``<16 x i32>``, which the LLVM it ships (22) rejects (the intrinsic takes
``<64 x i8>`` since LLVM 20); the ones here pass bytes. Registered under
``relax_tune.``-prefixed names on first use (``register``: when a target's space picks one,
and ``register_named`` before a trace that names one is replayed): each parses TVMScript,
and the six of them parsed on import made ``import relax_tune`` (every measurement worker's
start-up too) take 4.2 s longer. The descriptions are written out here rather than imported
from ``tvm.s_tir.tensor_intrin.x86``: importing that package parses every intrinsic TVM
ships (CUDA's MMA ones too), which made ``import relax_tune`` take over a minute on this
2-core machine under load.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen


@dataclass(frozen=True)
class DotInstruction:
    """One int8 dot-product tensor intrinsic and the tile it covers."""

    name: str           # the registered tensor intrinsic
    feature: str        # the LLVM target feature it needs
    mnemonic: str       # the instruction in the built library's assembly
    lanes: int          # int32 output channels a step
    depth: int          # reduction elements a step
    weight_dtype: str   # the packed weight's type ("int16": widened when packed)
    registers: int      # vector registers of its ISA (the accumulator tile must fit)


VNNI_16X4 = "relax_tune.dot_16x4_u8s8i32_vnni"
"""``vpdpbusd`` (AVX512-VNNI), 16 x 4 bytes a step."""
AVXVNNI_8X4 = "relax_tune.dot_8x4_u8s8i32_avxvnni"
"""``{vex} vpdpbusd`` (AVX-VNNI, 256 bits), 8 x 4 bytes a step."""
AVX2_8X2 = "relax_tune.dot_8x2_u8s16i32_avx2"
"""``vpmaddwd`` (AVX2) on s16-widened weights, 8 lanes x 2 a step."""
AVX2_8X4_NARROW = "relax_tune.dot_8x4_u8s8i32_avx2_maddubs"
"""``vpmaddubsw`` + ``vpmaddwd`` by ones (AVX2), 8 lanes x 4 bytes a step: exact only on
weights whose summed pairs fit an s16 (``NARROW_PAIRS_ATTR``)."""

NARROW_PAIRS_ATTR = "relax_tune.s8_weight_pairs_fit_s16"
"""PrimFunc attribute: every pair of the int8 weight that a ``vpmaddubsw`` of the packed
layout sums (adjacent along the contiguous reduction axis, from an even index) has
``|w0| + |w1| <= 128``, so 255 * (|w0| + |w1|) fits an s16 and ``AVX2_8X4_NARROW`` is exact.
Set at compile time on constant weights (``lowering.int8_pairs``); part of the workload, so
marked and unmarked layers are different tasks."""
NARROW_PAIR_LIMIT = 128
"""The largest ``|w0| + |w1|`` of a pair ``vpmaddubsw`` sums exactly with u8 activations."""

INSTRUCTIONS = (
    DotInstruction(VNNI_16X4, "avx512vnni", "vpdpbusd", 16, 4, "int8", 32),
    DotInstruction(AVXVNNI_8X4, "avxvnni", "vpdpbusd", 8, 4, "int8", 16),
    DotInstruction(AVX2_8X2, "avx2", "vpmaddwd", 8, 2, "int16", 16),
)
"""In order of preference: the first whose feature the target has is used."""

NARROW_VARIANTS = {
    AVX2_8X2: DotInstruction(AVX2_8X4_NARROW, "avx2", "vpmaddubsw", 8, 4, "int8", 16),
}
"""The faster instruction an intrinsic gives way to on functions marked
``NARROW_PAIRS_ATTR``."""
HALF_WIDTH = {VNNI_16X4: next(i for i in INSTRUCTIONS if i.name == AVXVNNI_8X4)}
"""The instruction on half the lanes an intrinsic gives way to where the output channels
are no multiple of its lanes but of half of them: AVX512-VNNI's ``vpdpbusd`` on 256-bit
registers (every VNNI CPU has AVX512-VL; the LLVM intrinsic is AVX-VNNI's). MobileNetV2's
projections to 24 channels ran on the block rules otherwise: 0.31 ms against OpenVINO's
0.03 (Zen 4, 2 threads)."""
_ALL = INSTRUCTIONS + tuple(NARROW_VARIANTS.values())


def half_width(name: str) -> DotInstruction | None:
    """The ``DotInstruction`` on half the lanes that stands in for intrinsic ``name`` where
    its lanes do not tile the output channels, or None."""
    return HALF_WIDTH.get(name)


def narrow_variant(name: str) -> DotInstruction | None:
    """The ``DotInstruction`` that replaces intrinsic ``name`` on narrow weight pairs, or
    None."""
    return NARROW_VARIANTS.get(name)


def marked_narrow(func) -> bool:
    """Whether PrimFunc ``func`` carries ``NARROW_PAIRS_ATTR``."""
    return bool(func.attrs is not None and func.attrs.get(NARROW_PAIRS_ATTR, False))


def dot_instruction(name: str) -> DotInstruction:
    """The ``DotInstruction`` registered as ``name`` (a ``KeyError`` for another name)."""
    for inst in _ALL:
        if inst.name == name:
            return inst
    raise KeyError(f"no int8 dot-product intrinsic named {name!r}")


def _description(lanes: int, depth: int, weight_dtype: str):
    """``c[i] += int32(a[k]) * int32(b[i, k])``: what the schedule's block computes on a
    tile. With a widened (int16) weight the block reads ``int32(int8(b))``: the cast
    ``unsafe_set_dtype`` leaves in the consumer of the packed buffer."""

    def weight(b, vi, vk):
        return T.cast(b[vi, vk], "int32") if weight_dtype == "int8" \
            else T.cast(T.cast(b[vi, vk], "int8"), "int32")

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((depth,), "uint8", offset_factor=1),
             b: T.Buffer((lanes, depth), weight_dtype, offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:depth], b[0:lanes, 0:depth])
            T.writes(c[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        c[vi] = c[vi] + T.cast(a[vk], "int32") * weight(b, vi, vk)

    return desc


def _vpdpbusd(lanes: int, llvm_name: str):
    """``vpdpbusd`` on ``lanes`` int32 lanes: the 4 bytes of ``a`` broadcast to each lane,
    ``b``'s ``4 * lanes`` bytes, added to ``c`` by the instruction itself."""

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((4,), "uint8", offset_factor=1),
             b: T.Buffer((lanes, 4), "int8", offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:4], b[0:lanes, 0:4])
            T.writes(c[0:lanes])
            a_word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            c[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                c.vload([0], dtype=f"int32x{lanes}"),
                T.reinterpret(T.broadcast(a_word, lanes), dtype=f"int8x{4 * lanes}"),
                b.vload([0, 0], dtype=f"int8x{4 * lanes}"),
                dtype=f"int32x{lanes}")

    return impl


def _vpmaddwd():
    """``vpmaddwd`` then ``vpaddd``: the 2 bytes of ``a`` broadcast 8 times
    (``vpbroadcastw``) and zero-extended to s16 (``vpmovzxbw``), times ``b``'s 8 s16 pairs,
    each pair's sum added to ``c``. (Building the pair in scalar registers instead costs 8
    instructions a step.)"""

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((2,), "uint8", offset_factor=1),
             b: T.Buffer((8, 2), "int16", offset_factor=1),
             c: T.Buffer((8,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:8], a[0:2], b[0:8, 0:2])
            T.writes(c[0:8])
            pair = T.reinterpret(a.vload([0], "uint8x2"), dtype="uint16")
            c[T.ramp(T.int32(0), 1, 8)] = c.vload([0], dtype="int32x8") + \
                T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                    T.cast(T.reinterpret(T.broadcast(pair, 8), dtype="uint8x16"), "int16x16"),
                    b.vload([0, 0], dtype="int16x16"),
                    dtype="int32x8")

    return impl


def _vpmaddubsw():
    """``vpmaddubsw`` then ``vpmaddwd`` by ones then ``vpaddd`` (what ONNX Runtime's MLAS
    does on AVX2): the 4 bytes of ``a`` broadcast to 8 lanes (``vpbroadcastd``), times
    ``b``'s 32 s8 bytes, each pair's sum an s16 that saturates (exact on
    ``NARROW_PAIRS_ATTR`` weights), the two s16 of a lane summed into int32 and added to
    ``c``: 32 products in three instructions, where ``vpmaddwd`` on s16 makes 16 in two."""

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((4,), "uint8", offset_factor=1),
             b: T.Buffer((8, 4), "int8", offset_factor=1),
             c: T.Buffer((8,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:8], a[0:4], b[0:8, 0:4])
            T.writes(c[0:8])
            a_word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            pairs = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"),
                T.reinterpret(T.broadcast(a_word, 8), dtype="int8x32"),
                b.vload([0, 0], dtype="int8x32"),
                dtype="int16x16")
            c[T.ramp(T.int32(0), 1, 8)] = c.vload([0], dtype="int32x8") + \
                T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                    pairs, T.broadcast(T.int16(1), 16), dtype="int32x8")

    return impl


def _implementation(name: str):
    if name == VNNI_16X4:
        return _vpdpbusd(16, "llvm.x86.avx512.vpdpbusd.512")
    if name == AVXVNNI_8X4:
        return _vpdpbusd(8, "llvm.x86.avx512.vpdpbusd.256")
    if name == AVX2_8X4_NARROW:
        return _vpmaddubsw()
    return _vpmaddwd()


def register(name: str) -> None:
    """Register the tensor intrinsic ``name`` (one of ``INSTRUCTIONS``) with TVM, once."""
    inst = dot_instruction(name)
    try:
        TensorIntrin.get(inst.name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet (TVM raises a ValueError/TVMError)
        TensorIntrin.register(inst.name, _description(inst.lanes, inst.depth,
                                                      inst.weight_dtype),
                              _implementation(inst.name))


def register_named(names: list[str]) -> None:
    """Register the intrinsics of ``INSTRUCTIONS`` and ``NARROW_VARIANTS`` among ``names``
    (those a trace's ``Tensorize`` instructions name), before the trace is replayed."""
    for inst in _ALL:
        if inst.name in names:
            register(inst.name)


def int8_dot_intrinsic(target: tvm.target.Target | None) -> str | None:
    """The name of the int8 dot-product intrinsic ``target`` has (u8 x s8 -> i32), or None:
    the first of ``INSTRUCTIONS`` whose feature (``avx512vnni``, ``avxvnni``, ``avx2``) the
    target has, read from its mcpu/mattr through LLVM, on an LLVM that takes the VNNI
    intrinsics' byte operands (20 and later)."""
    if target is None or target.kind.name != "llvm" or codegen.llvm_version_major() < 20:
        return None
    for inst in INSTRUCTIONS:
        try:
            has = codegen.target_has_features(inst.feature, target)
        except Exception:  # noqa: BLE001 - a target LLVM cannot describe: no int8 instruction
            return None
        if has:
            register(inst.name)
            return inst.name
    return None
