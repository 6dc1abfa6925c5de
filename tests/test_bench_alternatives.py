"""The real-model benchmark's alternatives (``benchmarks.alternatives``): the fastest of them is
every row's reference, a contender that cannot compile is a row with its error, and OpenVINO
(where installed: it is in the ``bench`` extra, not ``test``) computes what PyTorch does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.alternatives import (CompileTimeout, best_alternative, onnxruntime_row,
                                     openvino_precisions, openvino_row, ratios_to_best,
                                     time_limit, torch_compile_row)
from benchmarks.contenders import Row, fresh_work_dir, interleave, numpy_output


def _timed(contender: str, samples: list[float]) -> Row:
    return Row(contender, "-", lambda: None, samples=list(samples))


def test_the_fastest_alternative_is_the_reference():
    """The reference is the alternative of lowest median (OpenVINO here, though ONNX Runtime
    has the single fastest round); ratios are per round against it; TVM rows and untimed
    rows are never the reference."""
    rows = [_timed("pytorch", [4.0, 4.0, 4.0]), _timed("onnxruntime", [1.0, 3.0, 3.0]),
            _timed("openvino", [2.0, 2.0, 2.0]), _timed("relax_tune", [1.0, 4.0, 2.0]),
            _timed("tvm-untuned", [0.5, 0.5, 0.5]),
            Row("torch.compile", "-", None, error="CompileTimeout: ...")]
    best = ratios_to_best(rows)
    assert best is rows[2] and best_alternative(rows) is rows[2]
    assert rows[3].ratio_best == [2.0, 0.5, 1.0]
    assert rows[2].ratio_best == [1.0, 1.0, 1.0]
    assert rows[5].ratio_best == []
    assert ratios_to_best([_timed("relax_tune", [1.0])]) is None


def test_a_fresh_row_does_not_resume_an_earlier_runs_work_dir(tmp_path):
    """A time-budget row's work_dir left by an earlier run under the same work root is
    emptied, not resumed with its records (rows said "fresh work_dir" and resumed)."""
    wd = tmp_path / "resnet18-rt-60s"
    wd.mkdir()
    (wd / "database_tuning_record.json").write_text("{}\n")
    assert fresh_work_dir(str(wd)) == str(wd)
    assert not wd.exists()
    assert fresh_work_dir(str(tmp_path / "never-made")) == str(tmp_path / "never-made")


def test_a_slow_row_is_timed_in_the_first_round_only():
    """An untuned model's call of a quarter second or more is timed once, in the first round,
    and compared with that round's reference; the other rows every round."""
    calls = {"onnxruntime": 0, "tvm-untuned": 0}
    rows = [Row(name, "-", lambda name=name: calls.__setitem__(name, calls[name] + 1))
            for name in calls]
    rows[1].warm = False  # what calibrate decides for a call of 0.25 s or more
    interleave(rows, rounds=3, pause=0.0)
    # ONNX Runtime before and after the untuned row in round 0, once in rounds 1 and 2
    assert [len(r.samples) for r in rows] == [4, 1]
    assert len(rows[1].ratio_ort) == 1 and rows[0].ratio_ort == [1.0, 1.0, 1.0]
    assert calls == {"onnxruntime": 8, "tvm-untuned": 1}  # warm-up + timed call per timing
    ratios_to_best(rows)
    assert len(rows[1].ratio_best) == 1


def test_onnx_runtime_brackets_every_row(monkeypatch):
    """Each row's ratio is taken against the ONNX Runtime times just before and after it:
    on a machine slowing down steadily (every timing 10% slower than the one before) a row
    twice as fast as ONNX Runtime reads 2.0 in every round, wherever the rotation puts it;
    ratios to the best alternative come from both rows' ratios of the same round."""
    import benchmarks.contenders as contenders

    base = {"onnxruntime": 1.0, "relax_tune": 0.5, "openvino": 0.8, "pytorch": 4.0}
    step = iter(range(1000))
    monkeypatch.setattr(contenders, "time_once",
                        lambda row: base[row.contender] * (1 + 0.1 * next(step)))
    rows = [Row(name, "-", lambda: None) for name in base]
    interleave(rows, rounds=4, pause=0.0)
    assert rows[1].ratio_ort == pytest.approx([2.0] * 4)
    assert rows[2].ratio_ort == pytest.approx([1.25] * 4)
    assert len(rows[0].samples) == 4 * 4 and len(rows[3].ratio_torch) == 4
    best = ratios_to_best(rows)
    assert best is rows[2] and rows[1].ratio_best == pytest.approx([1.6] * 4)
    assert rows[0].ratio_best == pytest.approx([0.8] * 4)


@pytest.mark.slow  # failed once in a fresh CI venv (the compile finished under a 1 ms alarm):
# out of the CI run until that is understood (issue 43's note)
def test_torch_compile_past_its_time_limit_is_an_error_row():
    """A torch.compile that outlasts --torch-compile-timeout gives a row with the error (and
    the time it took), no exception; the alarm is off afterwards."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    row = torch_compile_row(model, (torch.randn(2, 8),), timeout=1e-3)
    assert row.call is None and row.contender == "torch.compile"
    assert "longer than" in row.error and row.tune_secs is not None
    with pytest.raises(CompileTimeout), time_limit(0.05):
        while True:
            pass
    with time_limit(None):
        pass


def test_openvino_computes_what_pytorch_does():
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4)).eval()
    x = torch.randn(3, 16)
    row = openvino_row(model, [x.numpy()], threads=1, example_input=(x,))
    with torch.inference_mode():
        ref = model(x).numpy()
    np.testing.assert_allclose(numpy_output(row.call()), ref, rtol=1e-5, atol=1e-5)
    assert row.tune_secs > 0 and row.error is None


def test_openvino_runs_a_qdq_file_in_int8(tmp_path):
    """The ``--int8`` benchmark's OpenVINO row: the QDQ file with no precision hint runs its
    convolutions and Gemm in u8/i8 and gives ONNX Runtime int8's output within one output
    quantisation step (measured: equal up to float rounding)."""
    pytest.importorskip("openvino")
    pytest.importorskip("onnxruntime")
    from benchmarks.int8 import output_scale
    from relax_tune.testing.quantized import cnn_model, save_quantized

    _, qdq_path = save_quantized(cnn_model(), str(tmp_path), "cnn")
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    row = openvino_row(qdq_path, [x], threads=1, precision=None)
    precisions = openvino_precisions(row)
    assert precisions["Convolution"] <= {"u8", "i8"} and precisions["FullyConnected"] & {"u8"}
    got = numpy_output(row.call())
    ref = numpy_output(onnxruntime_row(qdq_path, [x], 1).call())
    assert np.abs(got - ref).max() <= output_scale(qdq_path) + 1e-6
