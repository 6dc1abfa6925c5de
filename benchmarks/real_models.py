"""The real models of the benchmarks (ResNet-18, MobileNetV2, a BERT-class encoder, a ViT) as
seeded PyTorch modules with example inputs, and the environment facts a table names."""

from __future__ import annotations

import platform
import sys
import types

MODEL_NAMES = ["resnet18", "mobilenet_v2", "bert", "vit"]
"""The benchmark's default models."""

MORE_MODEL_NAMES = ["mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0",
                    "regnet_x_400mf", "mnasnet1_0"]
"""Models a run may name besides the defaults: torchvision's MobileNetV3-Small (squeeze-and-
excite blocks, hardswish; issue 43's model that no earlier table or test used, on the Intel
Xeon) and EfficientNet-B0 (squeeze-and-excite, SiLU, 3x3 and 5x5 depthwise convolutions;
the AVX2 table's fifth model, session 13) and ShuffleNetV2 x1.0 (channel shuffles: reshape,
transpose and split between the convolutions; the Zen 3 table's fifth model, session 19)
and RegNetX-400MF (grouped 3x3 convolutions of 16-channel groups, residual stages; the
Zen 4 table's new model, session 26) and MNASNet 1.0 (3x3 and 5x5 depthwise convolutions
without squeeze-and-excite, ReLU; the Intel Xeon's new model, session 40)."""

TORCHVISION_CNNS = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
                    "shufflenet_v2_x1_0", "regnet_x_400mf", "mnasnet1_0")

NOTES: list[str] = []
"""What this process had to work around, printed under the benchmark's table."""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def set_torch_threads(torch, threads: int) -> None:
    """PyTorch on ``threads`` intra-op threads and one inter-op thread (the latter can only
    be set before PyTorch's first parallel work)."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def import_torchvision():
    """torchvision 0.28 from the index is linked against CUDA torch: with the CPU torch its
    ``_meta_registrations`` (the detection ops' meta kernels) fails to import. The
    classification models need none of it, so an empty module stands in for it."""
    name = "torchvision._meta_registrations"
    if name not in sys.modules and "torchvision" not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
        NOTES.append("torchvision imported with an empty torchvision._meta_registrations "
                     "(CUDA-built torchvision on CPU torch; classification models need no C op)")
    import torchvision

    return torchvision




# ---------------------------------------------------------------------------- models
def make_model(name: str, small: bool, size: int | None = None, **dims):
    """``(torch module in eval mode, example inputs tuple, description)``; seeded. ``size``
    replaces the image side (the sequence length for ``bert``) and ``dims`` the
    transformers' ``d``, ``heads`` and ``ff`` (other shapes of the same models: the
    transfer library's, tools/transfer_library)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name in TORCHVISION_CNNS:
        tv = import_torchvision()
        size = size or (64 if small else 224)
        model = getattr(tv.models, name)(weights=None)
        x = torch.randn(1, 3, size, size)
        return model.eval(), (x,), f"1x3x{size}x{size}"
    if name == "bert":
        seq = size or (32 if small else 128)

        class SmallBert(nn.Module):
            def __init__(self, vocab=8192, d=256, heads=4, ff=1024, layers=4):
                super().__init__()
                self.tok = nn.Embedding(vocab, d)
                self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
                self.norm = nn.LayerNorm(d)
                self.layers = nn.ModuleList(
                    nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                               batch_first=True) for _ in range(layers))

            def forward(self, ids):
                h = self.norm(self.tok(ids) + self.pos)
                for layer in self.layers:
                    h = layer(h)
                return h

        ids = torch.randint(0, 8192, (1, seq), dtype=torch.int64)
        bert = SmallBert(**dims).eval()
        return bert, (ids,), f"seq {seq}, 4 layers d{bert.norm.normalized_shape[0]}"
    if name == "vit":
        img = size or (64 if small else 224)

        class SmallViT(nn.Module):
            def __init__(self, patch=16, d=192, heads=3, ff=768, layers=6, classes=1000):
                super().__init__()
                n = (img // patch) ** 2
                self.patch = nn.Conv2d(3, d, patch, patch)
                self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
                self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
                self.layers = nn.ModuleList(
                    nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
                    for _ in range(layers))
                self.norm = nn.LayerNorm(d)
                self.head = nn.Linear(d, classes)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
                for layer in self.layers:
                    x = layer(x)
                return self.head(self.norm(x[:, 0]))

        x = torch.randn(1, 3, img, img)
        vit = SmallViT(**dims).eval()
        return vit, (x,), f"1x3x{img}x{img}, 6 layers d{vit.norm.normalized_shape[0]}"
    raise ValueError(name)


