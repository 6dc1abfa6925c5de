"""Intel AMX int8 tiles (``tdpbusd``) as TensorIR tensor intrinsics, used where the target
has the ``amx-tile`` and ``amx-int8`` features (read through LLVM, never from a CPU name).

One intrinsic computes ``C[rows, 16 * vectors] += A[rows, 64 * steps] (u8) x B (s8)`` in
int32, ``B`` packed as the VNNI kernels pack it (``[.., o/16, r/4, 16, 4]``: a tile row is
16 output channels x 4 reduction bytes, so 16 consecutive rows are one 1 KiB tile of
``B``). Tiles 0-2 hold up to three accumulators of ``rows`` x 16 int32, tile 4 a ``rows`` x
64 byte slice of ``A``, tiles 5-7 the weight tiles; the accumulators are loaded from ``C``
once, run over ``steps`` reductions of 64 bytes, and stored once. A ``tdpbusd`` does
``rows`` x 16 x 64 multiply-adds, 16x what one 512-bit ``vpdpbusd`` does.

Two things an AMX program needs besides the instructions, both done by the intrinsic
itself so that a built kernel runs in any process (the tuner's workers, the user's
program without relax_tune imported):

- the tile configuration (``ldtilecfg``: each tile's rows and bytes per row) is per thread
  and costs about 140 ns to load (measured on the Xeon this was written on; a 16 x 16 x 64
  step is 16 cycles), so each call reads the thread's configuration (``sttilecfg``, about
  60 ns) and loads its own only when it differs;
- Linux hands out the tile registers only to processes that ask
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): asked, through libc's
  ``syscall``, before that first load (asking again is harmless).
"""

from __future__ import annotations

import ctypes
import re
import struct

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

FEATURES = ("amx-tile", "amx-int8")
"""The LLVM target features an AMX int8 kernel needs."""
MNEMONIC = "tdpbusd"
"""The instruction in the built library's assembly."""
MAX_VECTORS = 3
"""Accumulator tiles an intrinsic uses at most (3 + 1 for ``A`` + 3 for ``B`` of 8)."""

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
_NAME = re.compile(r"^relax_tune\.amx_(\d+)x(\d+)x(\d+)_u8s8i32$")


def amx_name(rows: int, vectors: int, steps: int) -> str:
    """The registered name of the intrinsic over ``rows`` x ``16 * vectors`` outputs and
    ``64 * steps`` reduction bytes."""
    return f"relax_tune.amx_{rows}x{16 * vectors}x{64 * steps}_u8s8i32"


def parse_name(name: str) -> tuple[int, int, int] | None:
    """``(rows, vectors, steps)`` of an ``amx_name``, None for another name."""
    match = _NAME.match(name)
    if match is None:
        return None
    rows, cols, depth = (int(g) for g in match.groups())
    return rows, cols // 16, depth // 64


def tile_config(rows: int) -> list[int]:
    """The 64-byte tile configuration as 8 little-endian words: palette 1, every tile 64
    bytes a row, tiles 0-4 (accumulators, ``A``) ``rows`` rows, tiles 5-7 (``B``) 16."""
    raw = bytearray(64)
    raw[0] = 1
    for tile in range(8):
        raw[16 + 2 * tile] = 64
        raw[48 + tile] = rows if tile <= 4 else 16
    return list(struct.unpack("<8Q", bytes(raw)))


def _description(rows: int, vectors: int, steps: int):
    """``c[i, j] += int32(a[i, k]) * int32(b[j // 16, k // 4, j % 16, k % 4])`` with the
    loops the sketch leaves: ``j`` split into its tiles and their 16 lanes (one loop when
    there is one tile: the split by 1 is not made)."""
    cols, depth = 16 * vectors, 64 * steps

    @T.prim_func(s_tir=True)
    def one(a: T.Buffer((rows, depth), "uint8", offset_factor=1),
            b: T.Buffer((1, depth // 4, 16, 4), "int8", offset_factor=1),
            c: T.Buffer((rows, 16), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:rows, 0:16], a[0:rows, 0:depth], b[0:1, 0:depth // 4, 0:16, 0:4])
            T.writes(c[0:rows, 0:16])
            for i, j, k in T.grid(rows, 16, depth):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c[vi, vj] = c[vi, vj] + T.cast(a[vi, vk], "int32") * T.cast(
                        b[0, vk // 4, vj, vk % 4], "int32")

    @T.prim_func(s_tir=True)
    def several(a: T.Buffer((rows, depth), "uint8", offset_factor=1),
                b: T.Buffer((vectors, depth // 4, 16, 4), "int8", offset_factor=1),
                c: T.Buffer((rows, cols), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:rows, 0:cols], a[0:rows, 0:depth],
                    b[0:vectors, 0:depth // 4, 0:16, 0:4])
            T.writes(c[0:rows, 0:cols])
            for i, j0, j1, k in T.grid(rows, vectors, 16, depth):
                with T.sblock("update"):
                    vi = T.axis.spatial(rows, i)
                    vj = T.axis.spatial(cols, j0 * 16 + j1)
                    vk = T.axis.reduce(depth, k)
                    c[vi, vj] = c[vi, vj] + T.cast(a[vi, vk], "int32") * T.cast(
                        b[vj // 16, vk // 4, vj % 16, vk % 4], "int32")

    return one if vectors == 1 else several


def _implementation(rows: int, vectors: int, steps: int):
    cols, depth = 16 * vectors, 64 * steps
    w = tile_config(rows)

    @T.prim_func(s_tir=True)
    def impl(a_handle: T.handle, b_handle: T.handle, c_handle: T.handle) -> None:
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        a = T.match_buffer(a_handle, (rows, depth), "uint8", strides=[sa, 1],
                           offset_factor=1)
        b = T.match_buffer(b_handle, (vectors, depth // 4, 16, 4), "int8",
                           strides=[sb, 64, 4, 1], offset_factor=1)
        c = T.match_buffer(c_handle, (rows, cols), "int32", strides=[sc, 1],
                           offset_factor=1)
        with T.sblock("root"):
            T.reads(c[0:rows, 0:cols], a[0:rows, 0:depth],
                    b[0:vectors, 0:depth // 4, 0:16, 0:4])
            T.writes(c[0:rows, 0:cols])
            cfg = T.alloc_buffer((8,), "uint64", scope="local")
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", T.address_of(cfg[0])))
            if cfg[0] != T.uint64(w[0]) or cfg[2] != T.uint64(w[2]) \
                    or cfg[3] != T.uint64(w[3]) or cfg[6] != T.uint64(w[6]):
                T.evaluate(T.call_extern("int64", "syscall", T.int64(_SYS_ARCH_PRCTL),
                                         T.int64(_ARCH_REQ_XCOMP_PERM),
                                         T.int64(_XFEATURE_XTILEDATA)))
                for word in T.unroll(8):
                    cfg[word] = T.uint64(0)
                cfg[0] = T.uint64(w[0])
                cfg[2] = T.uint64(w[2])
                cfg[3] = T.uint64(w[3])
                cfg[6] = T.uint64(w[6])
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg",
                                              T.address_of(cfg[0])))
            for v in T.unroll(vectors):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(v),
                                              c.access_ptr("r", offset=16 * v),
                                              T.int64(sc * 4)))
            for s in range(steps):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(4),
                                              a.access_ptr("r", offset=64 * s),
                                              T.int64(sa)))
                for v in T.unroll(vectors):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(5 + v),
                        b.access_ptr("r", offset=v * sb + 1024 * s), T.int64(64)))
                for v in T.unroll(vectors):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.uint8(v),
                                                  T.uint8(4), T.uint8(5 + v)))
            for v in T.unroll(vectors):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(v),
                                              c.access_ptr("w", offset=16 * v),
                                              T.int64(sc * 4)))

    return impl


def register(name: str) -> None:
    """Register the AMX intrinsic ``name`` (an ``amx_name``) with TVM, once."""
    shape = parse_name(name)
    if shape is None:
        raise KeyError(f"no AMX intrinsic named {name!r}")
    try:
        TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet
        TensorIntrin.register(name, _description(*shape), _implementation(*shape))


def register_named(names: list[str]) -> None:
    """Register the AMX intrinsics among ``names`` (a trace's ``Tensorize`` names)."""
    for name in names:
        if parse_name(name) is not None:
            register(name)


_HOST_GRANTS: bool | None = None


def _host_grants_tiles() -> bool:
    """Whether Linux gives this process the tile registers (asked once)."""
    global _HOST_GRANTS
    if _HOST_GRANTS is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _HOST_GRANTS = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM,
                                        _XFEATURE_XTILEDATA) == 0
        except (OSError, AttributeError):
            _HOST_GRANTS = False
    return _HOST_GRANTS


def has_amx(target: tvm.target.Target | None) -> bool:
    """Whether ``target`` (an LLVM x86 target) has AMX int8 tiles its kernels may use: the
    features from its mcpu/mattr, and, when this host has them too (so kernels are timed
    and run here), Linux granting the tile registers to this process."""
    if target is None or target.kind.name != "llvm":
        return False
    try:
        if not all(codegen.target_has_features(f, target) for f in FEATURES):
            return False
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe
        return False
    from ...utils import host_target

    try:
        host_has = all(codegen.target_has_features(f, host_target()) for f in FEATURES)
    except Exception:  # noqa: BLE001 - not an x86 host
        host_has = False
    return _host_grants_tiles() if host_has else True
