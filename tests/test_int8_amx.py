"""Int8 kernels on Intel AMX tiles (issue 45): ``tdpbusd`` sketches offered where the target
has ``amx-tile`` and ``amx-int8``, read from its features.

The target is cross-compiled (``mcpu=sapphirerapids``) on any x86 host, so the assembly
checks run everywhere; the kernels run where this host has AMX (and Linux grants the tile
registers), where they must give the untuned function's integers, also in a process that
never imported relax_tune nor asked for the tiles itself (the kernel asks).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import relax_tune as rt
from relax_tune.space import generate_design_space, space_for_target, without_decisions
from relax_tune.space.cpu.amx_intrin import (MNEMONIC, AmxTile, fits, has_amx, parse_name,
                                              tile_config)
from relax_tune.testing.int8_kernels import (integer_kernel, kernel_args, kernel_asm,
                                             run_kernel)
from relax_tune.utils import host_target, schedule_from_json, trace_to_json

AMX = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
@T.prim_func(s_tir=True)
def _RELEASE():
    """What a library that releases the tiles when done leaves: their initial state."""
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))



@tvm.script.ir_module
class _TileConfig:
    """The thread's tile configuration read (``sttilecfg``) and loaded (``ldtilecfg``)."""

    @T.prim_func(s_tir=True)
    def store(out: T.Buffer((8,), "uint64")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", T.address_of(out[0])))

    @T.prim_func(s_tir=True)
    def load(cfg: T.Buffer((8,), "uint64")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))


SHAPES = {"matmul": {"rows": 32, "reduce": 128, "channels": 32},
          "conv2d": {"reduce": 64, "channels": 32, "size": 10, "zero_point": 5}}
"""Small layers the AMX sketch tiles: 16 of 32 rows, 10 of 10 output pixels (a 3x3
convolution of a 10x10 input padded by 1)."""


def _host_runs_amx() -> bool:
    return has_amx(host_target()) and has_amx(AMX)


def _amx_names(trace) -> list[str]:
    return [str(inst.attrs[0]) for inst in trace.insts if inst.kind.name == "Tensorize"
            and parse_name(str(inst.attrs[0])) is not None]


def _export_amx_kernel(mod: tvm.IRModule, folder, name: str = "amx") -> int:
    """``mod`` on its first AMX sketch, built to ``folder/<name>.so``, its ``kernel_args``
    saved as ``folder/<name>_arg<i>.npy`` (``arg<i>.npy`` for ``amx``): how many."""
    (sketch,) = [s for s in generate_design_space(mod, AMX) if _amx_names(s)][:1]
    scheduled = space_for_target(AMX).replay(mod, without_decisions(sketch), seed=1).sch.mod
    tvm.compile(scheduled, target=AMX).export_library(str(folder / f"{name}.so"))
    args = kernel_args(mod)
    prefix = "" if name == "amx" else f"{name}_"
    for i, arg in enumerate(args):
        np.save(folder / f"{prefix}arg{i}.npy", arg.numpy())
    return len(args)


def test_amx_is_read_from_target_features():
    assert has_amx(AMX)
    for mcpu in ("cascadelake", "znver4", "znver3", "alderlake"):  # VNNI / AVX2, no tiles
        assert not has_amx(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    assert has_amx(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512",
                                      "mattr": ["+amx-tile", "+amx-int8"]}))
    assert not has_amx(tvm.target.Target("cuda"))


def test_tile_configuration_sets_rows_and_row_bytes():
    def fields(words):
        raw = b"".join(w.to_bytes(8, "little") for w in words)
        return raw[0], [int.from_bytes(raw[16 + 2 * t:18 + 2 * t], "little")
                        for t in range(8)], list(raw[48:56])

    # 1 x 3: accumulators 0-2, A 4, B 5-7 (64-byte rows; A and C 14 rows, B 16); tile 3
    # unused: 1 row of 4 bytes, so the configuration is never taken for a 16 x 64 one
    assert fields(tile_config(14, 1, 3)) == (1, [64, 64, 64, 4, 64, 64, 64, 64],
                                             [14, 14, 14, 1, 14, 16, 16, 16])
    assert fields(tile_config(16, 2, 2)) == (1, [64] * 8, [16] * 8)  # all 8 in use
    assert fits(2, 2, 16) and not fits(2, 2, 14) and fits(1, 3, 14) and not fits(2, 3, 16)
    # tile 3 (4 bytes a row) marks every configuration of ours but the 2 x 2 one
    for t, v, rows in [(t, v, r) for t in (1, 2) for v in (1, 2, 3) for r in (7, 14, 16)]:
        if fits(t, v, rows):
            assert (fields(tile_config(rows, t, v))[1][3] == 4) == ((t, v) != (2, 2))


def test_intrinsic_names_round_trip():
    for tile in (AmxTile(16, 2, 4), AmxTile(14, 1, 2, (3, 3)), AmxTile(7, 2, 8, (3, 3), 2),
                 AmxTile(14, 2, 1, None, 2, 2)):
        assert parse_name(tile.name) == tile
    assert parse_name("relax_tune.dot_16x4_u8s8i32_vnni") is None


@pytest.mark.parametrize("kind", ["matmul", "conv2d"])
def test_amx_sketches_use_tdpbusd_and_give_the_same_integers(kind):
    mod = integer_kernel(kind, AMX, **SHAPES[kind])
    sketches = generate_design_space(mod, AMX)
    amx = [s for s in sketches if _amx_names(s)]
    assert amx and len(amx) < len(sketches)  # beside the vpdpbusd sketch
    tiles = [parse_name(_amx_names(s)[0]) for s in amx]
    assert {t.rows for t in tiles} == {16 if kind == "matmul" else 10}
    # a convolution's call covers its whole 3x3 window (its accumulators stay in the tiles)
    assert {t.window for t in tiles} == {None if kind == "matmul" else (3, 3)}
    # two row tiles a call where the rows hold two (32 of the matmul, not 10 pixels)
    assert {t.row_tiles for t in tiles} == ({1, 2} if kind == "matmul" else {1})
    space = space_for_target(AMX)
    for sketch in amx:
        candidate = space.replay(mod, without_decisions(sketch), seed=3)
        assert candidate.error is None, candidate.error
        asm = kernel_asm(candidate.sch.mod, AMX)
        for instruction in (MNEMONIC, "ldtilecfg", "sttilecfg", "tileloadd", "tilestored"):
            assert instruction in asm
        replayed = schedule_from_json(mod, trace_to_json(candidate.sch.trace))
        tvm.ir.assert_structural_equal(replayed.mod, candidate.sch.mod)
        if _host_runs_amx():
            np.testing.assert_array_equal(run_kernel(candidate.sch.mod, AMX),
                                          run_kernel(mod, AMX))


def test_layers_amx_does_not_tile_keep_the_other_sketches():
    """Output rows that leave most of a tile idle (3 pixels) and reductions that are not
    a multiple of 64 bytes get no AMX sketch."""
    for mod in (integer_kernel("conv2d", AMX, reduce=64, channels=32, size=5),
                integer_kernel("matmul", AMX, rows=32, reduce=96, channels=32)):
        sketches = generate_design_space(mod, AMX)
        assert sketches and not any(_amx_names(s) for s in sketches)


@pytest.mark.skipif(not _host_runs_amx(), reason="this CPU has no AMX tiles Linux grants")
def test_an_amx_kernel_asks_for_the_tiles_itself(tmp_path):
    """A built AMX kernel runs in a fresh process that imports only TVM: Linux gives a
    process the tile registers only when asked, and the kernel asks."""
    mod = integer_kernel("matmul", AMX, **SHAPES["matmul"])
    count = _export_amx_kernel(mod, tmp_path)
    script = (
        "import sys, numpy as np, tvm\n"
        "d = sys.argv[1]\n"
        f"args = [tvm.runtime.tensor(np.load(f'{{d}}/arg{{i}}.npy')) for i in range({count})]\n"
        "tvm.runtime.load_module(d + '/amx.so')['main'](*args)\n"
        "np.save(d + '/out.npy', args[-1].numpy())\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "relax_tune" not in done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), run_kernel(mod, AMX))


@pytest.mark.skipif(not _host_runs_amx(), reason="this CPU has no AMX tiles Linux grants")
def test_tuning_measures_amx_kernels(tmp_path):
    """The tuner builds, times and checks AMX candidates in its workers, and the applied
    best gives the untuned function's integers."""
    host = host_target()
    mod = integer_kernel("matmul", host, rows=64, reduce=256, channels=64)
    db = rt.tune_tir(mod, host, work_dir=str(tmp_path), max_trials_global=8,
                     num_trials_per_iter=8)
    records = [r for r in db.get_all_tuning_records() if "relax_tune.amx_" in str(r.trace)]
    assert records and all(r.run_secs[0] < 1 for r in records)
    with host:
        applied = rt.ApplyDatabase(work_dir=str(tmp_path))(mod)
    np.testing.assert_array_equal(run_kernel(applied, host), run_kernel(mod, host))


@pytest.mark.skipif(not _host_runs_amx(), reason="this CPU has no AMX tiles Linux grants")
def test_an_amx_kernel_gives_back_another_librarys_tile_configuration(tmp_path):
    """ONNX Runtime's int8 kernels (MLAS) keep their tile configuration loaded on a thread
    and reload it only when the thread's differs in both rows and row bytes: an AMX kernel
    of ours run between two of its calls on the same thread must give its configuration
    back, and when the tiles were released in between (OpenVINO's kernels release them)
    ours must not pass for theirs (before the fixes ONNX Runtime's next call died of an
    illegal instruction). Run in a fresh process, so such a death fails this test alone."""
    pytest.importorskip("onnxruntime")
    from relax_tune.testing.quantized import block_model, save_quantized

    model = block_model()
    _, qdq_path = save_quantized(model, str(tmp_path), "block")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    np.save(tmp_path / "x.npy", np.random.default_rng(7).standard_normal(shape)
            .astype(np.float32))
    # 14-row tiles: a configuration MLAS's kernels cannot run with (16-row ones they can)
    mod = integer_kernel("matmul", AMX, rows=28, reduce=128, channels=32)
    assert {parse_name(_amx_names(s)[0]).rows for s in generate_design_space(mod, AMX)
            if _amx_names(s)} == {14}
    count = _export_amx_kernel(mod, tmp_path)
    script = (
        "import sys, numpy as np, tvm, onnxruntime as ort\n"
        "d, qdq = sys.argv[1], sys.argv[2]\n"
        "so = ort.SessionOptions(); so.intra_op_num_threads = 1\n"
        "s = ort.InferenceSession(qdq, so, providers=['CPUExecutionProvider'])\n"
        "feed = {s.get_inputs()[0].name: np.load(d + '/x.npy')}\n"
        "ref = s.run(None, feed)[0]\n"
        f"args = [tvm.runtime.tensor(np.load(f'{{d}}/arg{{i}}.npy')) for i in range({count})]\n"
        "kernel = tvm.runtime.load_module(d + '/amx.so')['main']\n"
        "release = tvm.runtime.load_module(d + '/release.so')['main']\n"
        "for _ in range(3):\n"
        "    kernel(*args)\n"
        "    assert np.array_equal(s.run(None, feed)[0], ref)\n"
        "    release()\n"  # the tiles left in their initial state, then ours again
        "    kernel(*args)\n"
        "    assert np.array_equal(s.run(None, feed)[0], ref)\n"
        "np.save(d + '/out.npy', args[-1].numpy())\n")
    release = tvm.compile(_RELEASE, target=AMX)
    release.export_library(str(tmp_path / "release.so"))
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), qdq_path],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TVM_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), run_kernel(mod, AMX))


@pytest.mark.skipif(not _host_runs_amx(), reason="this CPU has no AMX tiles Linux grants")
def test_an_amx_kernel_keeps_the_configuration_it_loaded_unless_another_library_left_one(
        tmp_path):
    """After an AMX kernel of ours the thread holds its own tile configuration when it found
    one of ours (other tiles) or the all-16 x 64 one loaded; another library's is given back
    (loaded again). Giving back each other's made every call of a model's later AMX kernels
    pay two configuration loads and a syscall."""
    kernels = {"a": integer_kernel("matmul", AMX, rows=28, reduce=128, channels=32),
               "b": integer_kernel("matmul", AMX, rows=32, reduce=128, channels=32)}
    counts = {name: _export_amx_kernel(mod, tmp_path, name) for name, mod in kernels.items()}
    tvm.compile(_TileConfig, target=AMX).export_library(str(tmp_path / "cfg.so"))
    foreign = tile_config(16, 2, 2)
    foreign[6] = int.from_bytes(bytes([8] * 8), "little")  # 8 rows x 64 bytes each
    script = (
        "import sys, numpy as np, tvm\n"
        "d = sys.argv[1]\n"
        "cfg = tvm.runtime.load_module(d + '/cfg.so')\n"
        "def run(name, n):\n"
        "    args = [tvm.runtime.tensor(np.load(f'{d}/{name}_arg{i}.npy')) for i in range(n)]\n"
        "    tvm.runtime.load_module(f'{d}/{name}.so')['main'](*args)\n"
        "def held():\n"
        "    out = tvm.runtime.tensor(np.zeros(8, 'uint64'))\n"
        "    cfg['store'](out)\n"
        "    return [int(w) for w in out.numpy()]\n"
        "def load(words):\n"
        "    cfg['load'](tvm.runtime.tensor(np.array(words, 'uint64')))\n"
        f"run('a', {counts['a']}); after_a = held()\n"
        f"run('b', {counts['b']}); after_b = held()\n"
        f"load({foreign}); run('b', {counts['b']}); after_foreign = held()\n"
        f"load({tile_config(16, 2, 2)}); run('b', {counts['b']}); after_full = held()\n"
        "print(after_a, after_b, after_foreign, after_full)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TVM_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    after_a, after_b, after_foreign, after_full = eval(done.stdout.strip().replace("] [", "],["))

    def config(mod):
        (sketch,) = [s for s in generate_design_space(mod, AMX) if _amx_names(s)][:1]
        t = parse_name(_amx_names(sketch)[0])
        return tile_config(t.rows, t.row_tiles, t.vectors)

    assert config(kernels["a"]) != config(kernels["b"])
    assert after_a == config(kernels["a"])
    assert after_b == config(kernels["b"])  # another kernel's of ours not given back
    assert after_foreign == foreign  # another library's given back
    assert after_full == config(kernels["b"])

def test_the_first_batch_leads_with_one_candidate_of_each_tensorizing_sketch():
    """The cost model cannot rank the VNNI and AMX sketches against each other before it has
    seen them timed: each one's best-ranked candidate leads the first batch."""
    from collections import namedtuple

    from relax_tune.search.sketch_leads import tensorized_leads

    sketches = generate_design_space(integer_kernel("matmul", AMX, **SHAPES["matmul"]), AMX)
    tensorizing = [i for i, s in enumerate(sketches) if any(
        inst.kind.name == "Tensorize" for inst in s.insts)]
    assert len(tensorizing) >= 3  # vpdpbusd and AMX ones
    entry = namedtuple("Entry", "sketch rank")
    ranked = [entry(tensorizing[0], r) for r in range(5)] + \
        [entry(i, 10 + i) for i in reversed(tensorizing)]
    leads = tensorized_leads(ranked, sketches)
    assert [e.sketch for e in leads] == [tensorizing[0], *reversed(tensorizing[1:])]
    assert leads[0].rank == 0  # each sketch's best-ranked one


def test_parsed_scripts_are_kept_on_disk_and_a_bad_entry_is_parsed_again(tmp_path, monkeypatch):
    """``script_cache.parse_script``: the second parse of a text loads the first one's JSON
    (the same function); a damaged entry is parsed again and rewritten; a cache folder that
    cannot be made leaves the parse as it was."""
    import tvm_ffi

    from relax_tune.space.cpu import script_cache

    text = ("@T.prim_func\ndef f(a: T.Buffer((4,), \"float32\"), b: T.Buffer((4,), \"float32\")):\n"
            "    for i in range(4):\n        b[i] = a[i] * T.float32(2)\n")
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", str(tmp_path / "cache"))
    first = script_cache.parse_script(text, {"T": T})
    [entry] = (tmp_path / "cache" / "scripts").iterdir()
    again = script_cache.parse_script(text, {"T": T})
    assert tvm_ffi.structural_equal(first, again)
    entry.write_text("{not json")
    assert tvm_ffi.structural_equal(script_cache.parse_script(text, {"T": T}), first)
    assert entry.read_text().startswith("{") and "not json" not in entry.read_text()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", str(tmp_path / "file"))  # not a folder
    assert tvm_ffi.structural_equal(script_cache.parse_script(text, {"T": T}), first)
