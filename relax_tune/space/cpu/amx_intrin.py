"""Intel AMX int8 tiles (``tdpbusd``) as TensorIR tensor intrinsics, used where the target
has the ``amx-tile`` and ``amx-int8`` features (read through LLVM, never from a CPU name).

One intrinsic computes ``C[rows, 16 * vectors] += A[rows, 64 * steps] (u8) x B (s8)`` in
int32, ``B`` packed as the VNNI kernels pack it (``[.., o/16, r/4, 16, 4]``: a tile row is
16 output channels x 4 reduction bytes, so 16 consecutive rows are one 1 KiB tile of
``B``). Tiles 0-2 hold up to three accumulators of ``rows`` x 16 int32, tile 4 a ``rows`` x
64 byte slice of ``A``, tiles 5-7 the weight tiles; the accumulators are loaded from ``C``
once, run over ``steps`` reductions of 64 bytes, and stored once. A ``tdpbusd`` does
``rows`` x 16 x 64 multiply-adds, 16x what one 512-bit ``vpdpbusd`` does. A convolution's
intrinsic also runs over its kernel window (``AmxTile.window``): the input tile of a
position is the same rows shifted by whole pixels and image rows, so the accumulators stay
in the tiles for the whole window instead of a load and a store per position.

Two things an AMX program needs besides the instructions, both done by the intrinsic
itself so that a built kernel runs in any process (the tuner's workers, the user's
program without relax_tune imported):

- the tile configuration (``ldtilecfg``: each tile's rows and bytes per row) is per thread
  and costs about 140 ns to load (measured on the Xeon this was written on; a 16 x 16 x 64
  step is 16 cycles), so each call reads the thread's configuration (``sttilecfg``, about
  60 ns) and loads its own only when it differs;
- another library in the process may keep its own configuration loaded on a thread and
  not load it again, so a call that found a configuration not of ours live loads it back
  when done (it then pays the check and two loads each call). Ours are told by tile 3
  of 1 row of 4 bytes (``tile_config``: unused in every configuration of ours but the
  all-16 x 64 one of 2 x 2 tiles); a configuration of ours, or the all-16 x 64 one, is
  not given back: kernels of ours with different tiles run one after another in a model,
  and giving back each other's made every call of the later ones pay a syscall and two
  loads (a 56x56x64 int8 convolution timed right after another of ours with other tiles
  ran 436-443 us with the give-back, 126-129 us without; Xeon, 2 threads). ONNX Runtime's
  MLAS, the library known to keep its configuration (16 x 64 everywhere), reloads when
  the thread's differs from its own in both rows and row bytes for some tile, which the
  4-byte tile of ours does. Without that odd tile, or with neither rule, ONNX Runtime's
  next int8 kernel on that thread died of an illegal instruction;
- Linux hands out the tile registers only to processes that ask
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): asked, through libc's
  ``syscall``, before a load on a thread with no configuration (one with a configuration
  proves that the process has them).
"""

from __future__ import annotations

import ctypes
import functools
import re
import struct
from dataclasses import dataclass

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

from .script_cache import parse_script

FEATURES = ("amx-tile", "amx-int8")
"""The LLVM target features an AMX int8 kernel needs."""
MNEMONIC = "tdpbusd"
"""The instruction in the built library's assembly."""
MAX_TILES = 4
"""Accumulator tiles an intrinsic uses at most (tiles 0-3), with one ``A`` tile a row tile
and one ``B`` tile a channel tile after them (``fits``)."""

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
_NAME = re.compile(r"^relax_tune\.amx(?:_w(\d+)x(\d+))?(?:_s(\d+))?(?:_t(\d+))?"
                   r"_(\d+)x(\d+)x(\d+)_u8s8i32$")


@dataclass(frozen=True)
class AmxTile:
    """What one AMX intrinsic computes: ``row_tiles * rows`` x ``16 * vectors`` int32
    outputs over ``64 * steps`` contiguous reduction bytes, output row ``i`` reading input
    row ``i * stride``; with a ``window`` (a convolution's kernel height and width) over
    every position of it, the input slice of a position starting ``kh`` image rows and
    ``kw`` pixels further."""

    rows: int
    vectors: int
    steps: int
    window: tuple[int, int] | None = None
    stride: int = 1
    row_tiles: int = 1

    @property
    def name(self) -> str:
        """The registered intrinsic's name."""
        win = "" if self.window is None else f"_w{self.window[0]}x{self.window[1]}"
        stride = "" if self.stride == 1 else f"_s{self.stride}"
        tiles = "" if self.row_tiles == 1 else f"_t{self.row_tiles}"
        return (f"relax_tune.amx{win}{stride}{tiles}_{self.rows}x{16 * self.vectors}x"
                f"{64 * self.steps}_u8s8i32")


def fits(row_tiles: int, vectors: int, rows: int) -> bool:
    """Whether ``row_tiles`` x ``vectors`` accumulators and their operands fit 8 tiles:
    all 8 only with 16 rows (see ``tile_config`` for why a shorter tile leaves one
    unused)."""
    used = row_tiles * vectors + row_tiles + vectors
    return row_tiles * vectors <= MAX_TILES and used <= (8 if rows == 16 else 7)


def parse_name(name: str) -> AmxTile | None:
    """The ``AmxTile`` an ``AmxTile.name`` names, None for another name."""
    match = _NAME.match(name)
    if match is None:
        return None
    kh, kw, stride, tiles, rows, cols, depth = match.groups()
    return AmxTile(int(rows), int(cols) // 16, int(depth) // 64,
                   None if kh is None else (int(kh), int(kw)),
                   1 if stride is None else int(stride), 1 if tiles is None else int(tiles))


def tile_config(rows: int, row_tiles: int = 1, vectors: int = 1) -> list[int]:
    """The 64-byte tile configuration as 8 little-endian words: palette 1; the accumulators
    (tiles ``0 .. row_tiles * vectors - 1``) and the ``A`` tiles (``4 .. 3 + row_tiles``)
    ``rows`` rows of 64 bytes, the ``B`` tiles (``4 + row_tiles ..``) 16 rows of 64 bytes;
    a tile the call does not use 1 row of 4 bytes.

    The unused tiles' odd shape is for libraries that keep their own configuration loaded
    on a thread and reload it only when both the rows and the row bytes of the thread's
    current one differ from theirs (ONNX Runtime's MLAS and ggml test
    ``colsb differ && rows differ``): a configuration of ours with shorter tiles but every
    tile 64 bytes wide would pass for theirs, and their next instruction would fault.
    With 16-row tiles and all 8 in use ours equals theirs (16 x 64 everywhere).

    Tile 3, the fourth accumulator, is used by 2 x 2 tiles only (``fits``), so its 4 bytes
    a row tell every other configuration of ours from another library's."""
    used = set(range(row_tiles * vectors)) | set(range(4, 4 + row_tiles + vectors))
    raw = bytearray(64)
    raw[0] = 1
    for tile in range(8):
        raw[16 + 2 * tile] = 64 if tile in used else 4
        raw[48 + tile] = (rows if tile < 4 + row_tiles else 16) if tile in used else 1
    return list(struct.unpack("<8Q", bytes(raw)))


def _slices(shape: tuple) -> str:
    return ", ".join(f"0:{n}" for n in shape)


def _source(t: AmxTile) -> tuple[str, str]:
    """TVMScript of the description and the implementation of ``t``. Written as text: the
    loops and buffers differ in number between a matmul and a window, one tile and several
    (the description's loops must be the sketch's, and a split by 1 is not made), and the
    implementation unrolls tile numbers, which the instructions take as immediates."""
    rows, vectors, cols, depth = t.rows, t.vectors, 16 * t.vectors, 64 * t.steps
    kh, kw = t.window or (1, 1)
    win, tiles, stride = t.window is not None, t.row_tiles, t.stride
    span = (tiles * rows - 1) * stride + (kw if win else 1)
    a_shape = (kh, span, depth) if win else (span, depth)
    b_shape = ((kh, kw) if win else ()) + (vectors, depth // 4, 16, 4)
    c_shape = (tiles * rows, cols)
    several = vectors > 1
    loops = (["kh", "kw"] if win else []) + (["mt"] if tiles > 1 else []) + ["i"] + \
        (["j0", "j1"] if several else ["j"]) + ["k"]
    extents = ([kh, kw] if win else []) + ([tiles] if tiles > 1 else []) + [rows] + \
        ([vectors, 16] if several else [16]) + [depth]
    axes = [f"vi = T.axis.spatial({tiles * rows}, {f'mt * {rows} + i' if tiles > 1 else 'i'})",
            f"vj = T.axis.spatial({cols}, {'j0 * 16 + j1' if several else 'j'})"]
    axes += [f"vkh = T.axis.reduce({kh}, kh)", f"vkw = T.axis.reduce({kw}, kw)"] if win else []
    axes += [f"vk = T.axis.reduce({depth}, k)"]
    row = f"vi * {stride}" if stride != 1 else "vi"
    a_index = f"vkh, {row} + vkw, vk" if win else f"{row}, vk"
    b_index = ("vkh, vkw, " if win else "") + \
        ("vj // 16, vk // 4, vj % 16, vk % 4" if several else "0, vk // 4, vj, vk % 4")
    regions = f"c[{_slices(c_shape)}], a[{_slices(a_shape)}], b[{_slices(b_shape)}]"
    body = "\n".join(" " * 16 + line for line in axes)
    a_strides = "[sa0, sa1, 1]" if win else "[sa1, 1]"
    b_strides = ("[sb0, sb1, " if win else "[") + "sb2, 64, 4, 1]"
    w = tile_config(rows, tiles, vectors)
    check = " or ".join(f"cfg[{i}] != T.uint64({w[i]})" for i in (0, 2, 3, 6))
    fill = "\n".join(" " * 12 + f"mine[{i}] = T.uint64({w[i]})" for i in range(8))
    full = tile_config(16, 2, 2)
    # a configuration another kernel of ours loaded (tile 3 four bytes wide: the row
    # bytes of tiles 0-3 are cfg[2]'s four 16-bit fields), or the all-16 x 64 one (ours
    # with 2 x 2 tiles, MLAS's): not given back (see the module docstring)
    shared = f"cfg[2] // T.uint64({1 << 48}) == T.uint64(4) or (" + " and ".join(
        f"cfg[{i}] == T.uint64({full[i]})" for i in (0, 2, 3, 6)) + ")"
    # tiles: accumulators 0 .. tiles * vectors - 1, A 4 .. 3 + tiles, B 4 + tiles ..
    position = "kh * sa0 + kw * sa1 + " if win else ""
    a_off = f"{position}r * {rows * stride} * sa1 + 64 * s"
    b_off = ("kh * sb0 + kw * sb1 + " if win else "") + "v * sb2 + 1024 * s"
    inner = [f"for s in range({t.steps}):",
             f"    for r in T.unroll({tiles}):",
             f"        T.evaluate(T.call_llvm_intrin(\"void\", \"llvm.x86.tileloadd64\", "
             f"T.uint8(4 + r), a.access_ptr(\"r\", offset={a_off}), T.int64(sa1 * {stride})))",
             f"    for v in T.unroll({vectors}):",
             f"        T.evaluate(T.call_llvm_intrin(\"void\", \"llvm.x86.tileloadd64\", "
             f"T.uint8({4 + tiles} + v), b.access_ptr(\"r\", offset={b_off}), T.int64(64)))",
             f"    for r in T.unroll({tiles}):",
             f"        for v in T.unroll({vectors}):",
             f"            T.evaluate(T.call_llvm_intrin(\"void\", \"llvm.x86.tdpbusd\", "
             f"T.uint8(r * {vectors} + v), T.uint8(4 + r), T.uint8({4 + tiles} + v)))"]
    for var, extent in reversed([("kh", kh), ("kw", kw)] if win else []):
        inner = [f"for {var} in range({extent}):"] + ["    " + line for line in inner]
    inner_text = "\n".join(" " * 8 + line for line in inner)
    c_off = f"r * {rows} * sc + 16 * v"
    desc = f"""
@T.prim_func(s_tir=True)
def desc(a: T.Buffer({a_shape}, "uint8", offset_factor=1),
         b: T.Buffer({b_shape}, "int8", offset_factor=1),
         c: T.Buffer({c_shape}, "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads({regions})
        T.writes(c[{_slices(c_shape)}])
        for {", ".join(loops)} in T.grid({", ".join(map(str, extents))}):
            with T.sblock("update"):
{body}
                c[vi, vj] = c[vi, vj] + T.cast(a[{a_index}], "int32") * T.cast(b[{b_index}], "int32")
"""
    impl = f"""
@T.prim_func(s_tir=True)
def impl(a_handle: T.handle, b_handle: T.handle, c_handle: T.handle) -> None:
    sa0 = T.int32()
    sa1 = T.int32()
    sb0 = T.int32()
    sb1 = T.int32()
    sb2 = T.int32()
    sc = T.int32()
    a = T.match_buffer(a_handle, {a_shape}, "uint8", strides={a_strides}, offset_factor=1)
    b = T.match_buffer(b_handle, {b_shape}, "int8", strides={b_strides}, offset_factor=1)
    c = T.match_buffer(c_handle, {c_shape}, "int32", strides=[sc, 1], offset_factor=1)
    with T.sblock("root"):
        T.reads({regions})
        T.writes(c[{_slices(c_shape)}])
        cfg = T.alloc_buffer((8,), "uint64", scope="local")
        mine = T.alloc_buffer((8,), "uint64", scope="local")
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", T.address_of(cfg[0])))
        if {check}:
            if cfg[0] % T.uint64(256) == T.uint64(0):
                T.evaluate(T.call_extern("int64", "syscall", T.int64({_SYS_ARCH_PRCTL}),
                                         T.int64({_ARCH_REQ_XCOMP_PERM}),
                                         T.int64({_XFEATURE_XTILEDATA})))
{fill}
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(mine[0])))
        for r in T.unroll({tiles}):
            for v in T.unroll({vectors}):
                T.evaluate(T.call_llvm_intrin(
                    "void", "llvm.x86.tileloadd64", T.uint8(r * {vectors} + v),
                    c.access_ptr("r", offset={c_off}), T.int64(sc * 4)))
{inner_text}
        for r in T.unroll({tiles}):
            for v in T.unroll({vectors}):
                T.evaluate(T.call_llvm_intrin(
                    "void", "llvm.x86.tilestored64", T.uint8(r * {vectors} + v),
                    c.access_ptr("w", offset={c_off}), T.int64(sc * 4)))
        if cfg[0] % T.uint64(256) != T.uint64(0) and ({check}) and not ({shared}):
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))
"""
    return desc, impl


def register(name: str) -> None:
    """Register the AMX intrinsic ``name`` (an ``AmxTile.name``) with TVM, once."""
    tile = parse_name(name)
    if tile is None:
        raise KeyError(f"no AMX intrinsic named {name!r}")
    try:
        TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet
        desc, impl = (parse_script(text, {"T": T}) for text in _source(tile))
        TensorIntrin.register(name, desc, impl)


def register_named(names: list[str]) -> None:
    """Register the AMX intrinsics among ``names`` (a trace's ``Tensorize`` names)."""
    for name in names:
        if parse_name(name) is not None:
            register(name)


@functools.cache
def _host_grants_tiles() -> bool:
    """Whether Linux gives this process the tile registers (asked once)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


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
    try:
        from ...host_cpu import host_target_config

        host = tvm.target.Target(host_target_config())
        host_has = all(codegen.target_has_features(f, host) for f in FEATURES)
    except Exception:  # noqa: BLE001 - not an x86 host
        host_has = False
    return _host_grants_tiles() if host_has else True
