"""PyTorch models through ``load_model``: a ``(torch.nn.Module, example_inputs)`` function, a
function returning a ``torch.export.ExportedProgram``, and a ``.pt2`` archive, each tuned by
the "relax_tune" pipeline (and the command line) and checked against PyTorch's own output.
The models are small ones built here: no downloads, no torchvision."""

import sys

import numpy as np
import pytest
import tvm
from tvm import relax

torch = pytest.importorskip("torch")

import relax_tune as rt  # noqa: E402
from relax_tune.cli import commands as cli  # noqa: E402
from relax_tune.model_loader import load_model  # noqa: E402
from relax_tune.utils import RelaxTuneError  # noqa: E402

TRIALS = 2
SMALL = {"num_trials_per_iter": 2}


class SmallCNN(torch.nn.Module):
    """torchvision-style: conv+BN+ReLU stem, depthwise and grouped convs, a residual add,
    adaptive average pooling, a linear classifier."""

    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False),
            torch.nn.BatchNorm2d(channels), torch.nn.ReLU())
        self.depthwise = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.grouped = torch.nn.Conv2d(channels, channels, 1, groups=2)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.grouped(torch.relu(self.depthwise(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def small_cnn():
    """``(module, example_inputs)``, as a user's ``file.py:function`` returns them."""
    torch.manual_seed(0)
    model = SmallCNN()
    with torch.no_grad():  # non-trivial batch-norm statistics
        model.stem[1].running_mean.uniform_(-0.5, 0.5)
        model.stem[1].running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(1, 3, 32, 32),)


def transformer():
    """A tiny encoder layer and its input."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64,
                                             batch_first=True)
    return layer.eval(), (torch.randn(1, 8, 32),)


def transformer_program():
    """A ``torch.export.ExportedProgram``, the other thing a function may return."""
    layer, inputs = transformer()
    return torch.export.export(layer, inputs)


def not_a_model():
    return {"weights": 1}


def module_without_inputs():
    return torch.nn.Linear(2, 2), None


def _reference(make) -> tuple[np.ndarray, np.ndarray]:
    model, inputs = make()
    with torch.no_grad():
        return inputs[0].numpy(), model.eval()(*inputs).numpy()


def _pipeline(model, target, work_dir, op_names=None):
    return relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                              max_trials_global=TRIALS, params=model.params,
                              op_names=op_names, **SMALL)


def _run(lib, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _trials(work_dir: str) -> tuple[int, int]:
    """``(trials, valid trials)`` of ``work_dir``: its records less the untuned baselines
    (a failed candidate is recorded too, timed at 1e10 s)."""
    trials = [r for r in rt.JSONDatabase(work_dir=work_dir).get_all_tuning_records()
              if not rt.database.is_baseline(r)]
    return len(trials), sum(r.is_valid for r in trials)


@pytest.mark.parametrize("func, op_names", [
    ("small_cnn", ["conv2d"]),  # (nn.Module, example inputs); depthwise and grouped convs
    ("transformer_program", ["matmul"]),  # an ExportedProgram
])
def test_python_function_torch_model_tuned_matches_pytorch(func, op_names, target, tmp_path):
    model = load_model(f"{__file__}:{func}")
    assert [gv.name_hint for gv in model.mod.functions] == ["main"]
    assert model.params and all(isinstance(a, np.ndarray) for a in model.params.values())
    x, expected = _reference(small_cnn if func == "small_cnn" else transformer)
    wd = str(tmp_path / "w")
    got = _run(tvm.compile(model.mod, target,
                           relax_pipeline=_pipeline(model, target, wd, op_names)), x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    trials, valid = _trials(wd)
    assert trials == TRIALS and valid >= 1  # it did tune, and what it tuned ran


def test_batch_norm_folds_into_the_convolution(target):
    """With the weights bound, the stem's batch norm becomes the convolution's weight and a
    bias add: its kernel does no batch-norm arithmetic per output (graph.FoldBatchNormIntoConv)."""
    names = [t.task_name for t in rt.extract_tasks(load_model(f"{__file__}:small_cnn")
                                                   .lowered(target), target)]
    stem = [n for n in names if n.startswith("fused_conv2d") and "relu" in n]
    assert stem and not any(op in n for n in names for op in ("divide", "sqrt", "subtract"))


def test_cpu_convolutions_are_channels_last(target):
    """On CPU every convolution (plain, depthwise, grouped) runs in NHWC/OHWI, the layout
    whose kernels vectorise along the channels (graph.ChannelsLastConvolutions)."""
    model = load_model(f"{__file__}:small_cnn")
    with target:
        mod = tvm.transform.Sequential(rt.lowering.prepare.graph_passes(target))(
            rt.lowering.prepare.bind_params(model.mod, model.params))
    layouts = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            layouts.append((str(expr.attrs.data_layout), str(expr.attrs.kernel_layout)))

    relax.analysis.post_order_visit(mod["main"], visit)
    assert layouts and set(layouts) == {("NHWC", "OHWI")}, layouts


def mobilenet_block():
    """MobileNet-style: convolutions with ReLU6 (exported as ``clip``, which TVM's
    ConvertLayout does not know) between them."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU6(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU6(),
        torch.nn.Conv2d(16, 8, 1), torch.nn.Hardtanh(-1.0, 1.0))
    return block.eval(), (torch.randn(1, 3, 16, 16),)


def test_channels_last_keeps_no_transposes_around_relu6(target, tmp_path):
    """After the layout change, a ReLU6 between two NHWC convolutions runs in NHWC: the only
    transposes left are the model's input and output (MobileNetV2 had 17 transpose pairs
    around its ReLU6, 2.3 of its 5.1 ms), and the pipeline's output matches PyTorch."""
    model = load_model(f"{__file__}:mobilenet_block")
    with target:
        mod = tvm.transform.Sequential(rt.lowering.prepare.graph_passes(target))(
            rt.lowering.prepare.bind_params(model.mod, model.params))
    ops = []

    def visit(expr):
        if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
            ops.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    assert ops.count("relax.clip") == 3 and ops.count("relax.permute_dims") == 2, ops
    ex = tvm.compile(model.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
        params=model.params))
    block, (x,) = mobilenet_block()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        expected = block(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


class PatchEmbed(torch.nn.Module):
    """A ViT's patch embedding: a convolution with stride = kernel, then tokens."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 8, 4, 4)
        self.strided = torch.nn.Conv2d(8, 8, 3, 2)  # stride != kernel: stays a convolution

    def forward(self, x):
        return self.patch(x).flatten(2).transpose(1, 2), self.strided(self.patch(x))


def patch_embed():
    torch.manual_seed(0)
    return PatchEmbed().eval(), (torch.randn(1, 3, 16, 12),)


def test_patch_convolution_becomes_a_matmul(target, tmp_path):
    """The patch convolution becomes a GEMM over the patches (graph.PatchConvToMatmul), a
    3x3/2 one stays a convolution, and the pipeline's outputs match PyTorch."""
    model = load_model(f"{__file__}:patch_embed")
    names = [t.task_name for t in rt.extract_tasks(model.lowered(target), target)]
    assert sum(n.startswith("fused_conv2d") or n.startswith("conv2d") for n in names) == 1
    assert any("matmul" in n for n in names), names
    ex = tvm.compile(model.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
        params=model.params))
    module, (x,) = patch_embed()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    with torch.no_grad():
        expected = module(x)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


def pointwise_convs():
    """1x1 convolutions to 12 channels (no whole number of SIMD registers on any CPU this
    runs on) and to 16 (a whole number on all), after a 3x3 stem."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 12, 1), torch.nn.ReLU(), torch.nn.Conv2d(12, 16, 1))
    return block.eval(), (torch.randn(1, 3, 14, 14),)


def test_pointwise_convolution_of_odd_channels_becomes_a_matmul(target, tmp_path):
    """The 1x1 convolution to 12 channels becomes a matmul (graph.PointwiseConvToMatmul),
    whose design space pads its vector axis to whole registers; the one to 16 stays a
    convolution; the pipeline's output matches PyTorch."""
    model = load_model(f"{__file__}:pointwise_convs")
    names = [t.task_name for t in rt.extract_tasks(model.lowered(target), target)]
    assert sum("conv2d" in n for n in names) == 2, names
    assert sum("matmul" in n for n in names) == 1, names
    ex = tvm.compile(model.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
        params=model.params))
    module, (x,) = pointwise_convs()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def encoder_layer(tokens: int = 16):
    """A tiny post-norm ``nn.TransformerEncoderLayer`` (d 32, 2 heads) on ``tokens`` tokens: its
    attention comes out of ``torch.export`` decomposed (3-d matmuls, a guarded softmax)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    return layer.eval(), (torch.randn(1, tokens, 32),)


def encoder_layer_17():
    """``encoder_layer`` on 17 tokens (a ViT's class token and 16 patches): no multiple of
    16 keys, fused on operands padded to 32."""
    return encoder_layer(17)


@pytest.mark.parametrize("func", ["encoder_layer", "encoder_layer_17"])
def test_exported_attention_becomes_one_kernel(func, target, tmp_path):
    """PyTorch's decomposed attention is fused into one ``attention`` kernel (no softmax
    kernel left), tuned by its rule (2 trials), and the outputs match PyTorch."""
    model = load_model(f"{__file__}:{func}")
    names = [t.task_name for t in rt.extract_tasks(model.lowered(target), target)]
    assert any(n.startswith("attention") for n in names), names
    assert not any("softmax" in n for n in names), names
    ex = tvm.compile(model.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=2,
        op_names=["attention"], params=model.params, **SMALL))
    module, (x,) = globals()[func]()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = got if hasattr(got, "numpy") else got[0]  # a tuple of one output
    with torch.no_grad():
        expected = module(x)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)


class PositionEncoder(torch.nn.Module):
    """BERT-style: token embeddings plus a learnt position table sliced to the sequence
    length (``pos[:, :n]``), then a post-norm encoder layer (d 32, 2 heads)."""

    def __init__(self, max_len: int = 64):
        super().__init__()
        self.tok = torch.nn.Embedding(100, 32)
        self.pos = torch.nn.Parameter(torch.randn(1, max_len, 32) * 0.1)
        self.layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)

    def forward(self, ids):
        return self.layer(self.tok(ids) + self.pos[:, : ids.shape[1]])


def dynamic_encoder():
    """The encoder exported with a dynamic sequence length of at most 64."""
    torch.manual_seed(0)
    model = PositionEncoder().eval()
    seq = torch.export.Dim("seq", min=1, max=64)
    ids = torch.randint(0, 100, (1, 16), dtype=torch.int64)
    return torch.export.export(model, (ids,), dynamic_shapes={"ids": {1: seq}})


def test_dynamic_sequence_export_compiles_and_matches_pytorch(target, tmp_path):
    """A ``torch.export`` with a dynamic sequence length compiles through the pipeline (the
    sliced position table has shape ``min(n, 64)`` until ``SimplifyBoundedShapes``), its
    attention is one kernel with a task per hinted size, and lengths from 1 to the bound
    match PyTorch; a hint naming no variable of the model is an error naming it."""
    program = dynamic_encoder()
    model = rt.model_loader.from_torch(program, "dynamic_encoder")
    var = str(model.mod["main"].params[0].ty.shape[1])
    lowered = model.lowered(target)
    tasks = [t.task_name for t in rt.extract_tasks(lowered, target, shape_hints={var: [8, 32]})]
    assert f"attention[{var}=32]" in {n.replace("attention1", "attention") for n in tasks}, tasks
    with pytest.raises(RelaxTuneError, match=f"names no symbolic variable.*{var}"):
        rt.extract_tasks(lowered, target, shape_hints={"seq": [8]})
    # compiled without trials (a tuned dynamic attention: test_attention.py)
    ex = tvm.compile(model.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), max_trials_global=0,
        params=model.params, shape_hints={var: [8, 32]}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    module = program.module()
    for n in (1, 7, 33, 64):
        ids = torch.randint(0, 100, (1, n), dtype=torch.int64)
        with torch.no_grad():
            expected = module(ids).numpy()
        got = vm["main"](tvm.runtime.tensor(ids.numpy())).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"n={n}")


def test_pt2_archive_through_cli_and_pipeline(target, tmp_path, capsys):
    """``relax-tune tune/compile model.pt2``; the library matches PyTorch, and the pipeline on
    ``load_model(model.pt2)`` finds the CLI's tasks all tuned (nothing new to measure)."""
    module, inputs = small_cnn()
    path = str(tmp_path / "cnn.pt2")
    torch.export.save(torch.export.export(module.eval(), inputs), path)
    x, expected = _reference(small_cnn)
    wd, lib = str(tmp_path / "w"), str(tmp_path / "out" / "cnn.so")
    assert cli.main(["tune", path, "--work-dir", wd, "--trials", str(TRIALS),
                     "--trials-per-iter", "2", "--op-names", "matmul"]) == 0
    assert f"{TRIALS} new trials" in capsys.readouterr().out
    assert cli.main(["compile", path, "--work-dir", wd, "-o", lib]) == 0
    assert "tuned schedules for" in capsys.readouterr().out
    np.testing.assert_allclose(_run(tvm.runtime.load_module(lib), x), expected,
                               rtol=1e-4, atol=1e-4)

    model = load_model(path)
    assert model.source == path and "p_fc_weight" in model.params
    n_records = len(rt.JSONDatabase(work_dir=wd))
    got = _run(tvm.compile(model.mod, target,
                           relax_pipeline=_pipeline(model, target, wd, ["matmul"])), x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert len(rt.JSONDatabase(work_dir=wd)) == n_records
    trials, valid = _trials(wd)
    assert trials == TRIALS and valid >= 1


def test_bad_torch_models_are_clear_errors(tmp_path, monkeypatch):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip archive")
    with pytest.raises(RelaxTuneError, match="bad.pt2.*is not a torch.export archive"):
        load_model(str(bad))
    with pytest.raises(RelaxTuneError, match="missing.pt2.*does not exist"):
        load_model(str(tmp_path / "missing.pt2"))
    with pytest.raises(RelaxTuneError, match="not_a_model gave a dict; return a tvm.IRModule"
                                             ".*ExportedProgram.*nn.Module, example_inputs"):
        load_model(f"{__file__}:not_a_model")
    with pytest.raises(RelaxTuneError, match="module_without_inputs: a torch.nn.Module needs "
                                             "example inputs"):
        load_model(f"{__file__}:module_without_inputs")
    user_file = tmp_path / "user_model.py"
    user_file.write_text("import torch\n\ndef model():\n    return None\n")
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    for spec in (str(bad), f"{user_file}:model"):
        with pytest.raises(RelaxTuneError, match=r"pip install 'relax_tune\[torch\]'"):
            load_model(spec)
