"""``int8="auto"`` (issue 45): integer kernels where they pay on this machine, measured
once (``relax_tune.int8_choice``). The probe runs for real on this CPU, once for the
module, into a cache folder of its own."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune import int8_choice
from relax_tune.int8_choice import MIN_SPEEDUP, describe, integer_kernels_pay, resolve_int8
from relax_tune.model_loader import load_model

try:
    import onnxruntime  # noqa: F401

    from relax_tune.testing.quantized import cnn_model, ort_run, output_scale, save_quantized
except ImportError:
    onnxruntime = None
needs_ort = pytest.mark.skipif(onnxruntime is None, reason="needs onnx and onnxruntime")


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """``(cache folder, the probe's answer as cached)`` for this machine's target."""
    cache = str(tmp_path_factory.mktemp("cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELAX_TUNE_CACHE_DIR", cache)
        integer_kernels_pay(rt.host_target())
        with open(int8_choice.cache_path(rt.host_target()), encoding="utf-8") as f:
            return cache, json.load(f)


def _no_probe(*_args):
    raise AssertionError("the probe ran")


def _float_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.nn.relu(x)))
    return bb.get()


def test_the_answer_is_the_measured_speedup_against_the_threshold(probed):
    _, answer = probed
    assert answer["int8_us"] > 0 and answer["float32_us"] > 0
    speedup = answer["float32_us"] / answer["int8_us"]
    assert abs(speedup - answer["speedup"]) < 0.01
    assert answer["integer"] == (answer["speedup"] >= MIN_SPEEDUP)
    assert answer["cpu"] == int8_choice._cpu_name()


def test_the_answer_is_kept_and_read_back_without_measuring(probed, monkeypatch):
    cache, answer = probed
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", cache)
    monkeypatch.setattr(int8_choice, "probe", _no_probe)
    assert integer_kernels_pay(rt.host_target()) == answer["integer"]


def test_a_damaged_answer_is_measured_again(probed, monkeypatch, tmp_path):
    _, answer = probed
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", str(tmp_path))
    path = int8_choice.cache_path(rt.host_target())
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"integ')
    measured = (answer["int8_us"] * 1e-6, answer["float32_us"] * 1e-6)  # the probe's, again
    monkeypatch.setattr(int8_choice, "probe", lambda target: measured)
    assert integer_kernels_pay(rt.host_target()) == answer["integer"]
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["integer"] == answer["integer"]


def test_a_failed_probe_keeps_the_integer_kernels_and_is_tried_again(monkeypatch, tmp_path,
                                                                      caplog):
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", str(tmp_path))

    def broken(target):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(int8_choice, "probe", broken)
    assert integer_kernels_pay(rt.host_target()) is True
    assert "the probe failed (RuntimeError: no compiler)" in caplog.text
    assert not os.path.exists(int8_choice.cache_path(rt.host_target()))


def test_float_models_and_other_cpus_are_not_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(int8_choice, "probe", _no_probe)
    host = rt.host_target()
    assert resolve_int8("auto", _float_module(), host) is True
    other = "znver3" if str(host.attrs.get("mcpu")) != "znver3" else "znver1"
    assert resolve_int8("auto", _float_module(),
                        tvm.target.Target({"kind": "llvm", "mcpu": other})) is True
    assert integer_kernels_pay(tvm.target.Target({"kind": "llvm", "mcpu": other})) is True
    assert resolve_int8(False, _float_module(), host) is False
    assert not os.listdir(tmp_path)


@needs_ort
def test_the_choice_is_described_in_one_line(probed, monkeypatch, tmp_path):
    cache, answer = probed
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", cache)
    _, qdq_path = save_quantized(cnn_model(), str(tmp_path), "cnn")
    mod, host = load_model(qdq_path).mod, rt.host_target()
    line = describe(mod, host)
    assert line.startswith("int8: integer kernels" if answer["integer"] else
                           "int8: float arithmetic") and f"{answer['speedup']:.2f}x" in line
    assert describe(_float_module(), host) is None
    other = "znver3" if str(host.attrs.get("mcpu")) != "znver3" else "znver1"
    assert "not measured" in describe(mod, tvm.target.Target({"kind": "llvm", "mcpu": other}))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_int8_option_is_one_clear_line(value, tmp_path):
    with pytest.raises(rt.RelaxTuneError, match="int8 must be True .* or 'auto'"):
        relax.get_pipeline("relax_tune", target=rt.host_target(), work_dir=str(tmp_path),
                           int8=value)


@needs_ort
def test_auto_compiles_a_qdq_model_the_way_the_probe_said(probed, monkeypatch, tmp_path):
    cache, answer = probed
    monkeypatch.setenv("RELAX_TUNE_CACHE_DIR", cache)
    _, qdq_path = save_quantized(cnn_model(), str(tmp_path), "cnn")
    loaded, target = load_model(qdq_path), rt.host_target()
    scripts = [t.mod.script() for t in rt.extract_tasks(loaded.lowered(target), target)]
    assert any('"int8"' in s and "conv2d" in s for s in scripts) == answer["integer"]
    ex = tvm.compile(loaded.mod, target, relax_pipeline=loaded.compile_pipeline(
        target, str(tmp_path / "wd"), measure=False))
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    steps = np.abs(got - ort_run(qdq_path, x, basic=True)) / output_scale(qdq_path)
    assert steps.max() <= 1 + 1e-3 and np.mean(steps > 0.5) <= 0.01, steps.max()
