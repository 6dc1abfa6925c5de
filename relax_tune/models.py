"""Small models for tests and benchmarks, exported like the demo MLP: ``(mod, params)``.

``params`` is ``export_tvm``'s list of ``(name, nn.Parameter)``; the Relax function
``forward`` takes the input first, then the weights in that order (``num_input`` = 1).
``model_inputs`` draws seeded arrays for all of them. Shapes are small so that compiling,
tuning and running them stays quick on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .demo import demo_model
from .utils import RelaxTuneError


def conv_net(batch: int = 1, channels: int = 16, size: int = 16) -> tuple[tvm.IRModule, list]:
    """conv3x3(3->c) -> ReLU -> conv3x3(c->2c, stride 2) -> ReLU -> global average pool ->
    Linear(2c, 10); input ``(batch, 3, size, size)`` float32, NCHW."""

    out_size = (size + 1) // 2

    class ConvNet(nn.Module):
        def __init__(self):
            self.conv1 = nn.Conv2D(3, channels, 3, padding=1)
            self.conv2 = nn.Conv2D(channels, 2 * channels, 3, stride=2, padding=1)
            self.fc = nn.Linear(2 * channels, 10)

        def forward(self, x):
            y = op.relu(self.conv1(x))
            y = op.relu(self.conv2(y))
            pooled = op.sum(y, axis=[2, 3]) * (1.0 / (out_size * out_size))
            return self.fc(pooled)

    spec = {"forward": {"x": nn.spec.Tensor((batch, 3, size, size), "float32")}}
    return ConvNet().export_tvm(spec)


def transformer_block(seq: int = 16, dim: int = 64, heads: int = 4,
                      hidden: int = 128) -> tuple[tvm.IRModule, list]:
    """A pre-norm transformer encoder block: layer_norm -> q/k/v projections -> per-head
    softmax(q k^T / sqrt(d)) v -> output projection -> residual -> layer_norm ->
    Linear -> GELU -> Linear -> residual. Input ``(1, seq, dim)`` float32."""
    if dim % heads:
        raise RelaxTuneError(f"transformer_block: dim={dim} must be a multiple of heads={heads}")
    head_dim = dim // heads

    class Block(nn.Module):
        def __init__(self):
            self.ln1 = nn.LayerNorm(dim)
            self.q = nn.Linear(dim, dim)
            self.k = nn.Linear(dim, dim)
            self.v = nn.Linear(dim, dim)
            self.o = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)

        def _heads(self, t):
            return op.permute_dims(op.reshape(t, (1, seq, heads, head_dim)), [0, 2, 1, 3])

        def forward(self, x):
            h = self.ln1(x)
            q, k, v = self._heads(self.q(h)), self._heads(self.k(h)), self._heads(self.v(h))
            scores = op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])) * (1.0 / head_dim**0.5)
            att = op.matmul(op.softmax(scores, axis=-1), v)
            att = op.reshape(op.permute_dims(att, [0, 2, 1, 3]), (1, seq, dim))
            x = x + self.o(att)
            return x + self.fc2(op.gelu(self.fc1(self.ln2(x))))

    spec = {"forward": {"x": nn.spec.Tensor((1, seq, dim), "float32")}}
    return Block().export_tvm(spec)


MODELS: dict[str, Callable[[], tuple[tvm.IRModule, list]]] = {
    "mlp": demo_model,
    "conv_net": conv_net,
    "transformer_block": transformer_block,
}


def get_model(name: str) -> tuple[tvm.IRModule, list]:
    """``(mod, params)`` of a model by name: one of ``MODELS`` (mlp, conv_net,
    transformer_block)."""
    if name not in MODELS:
        raise RelaxTuneError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]()


def input_shapes(mod: tvm.IRModule, func_name: str = "forward") -> list[tuple[int, ...]]:
    """Static shapes of every parameter of ``mod[func_name]`` (inputs, then weights)."""
    shapes = []
    for p in mod[func_name].params:
        shapes.append(tuple(int(d) for d in p.ty.shape))
    return shapes


def model_inputs(mod: tvm.IRModule, seed: int = 0,
                 func_name: str = "forward") -> list[np.ndarray]:
    """Seeded float32 arrays in [-1, 1) for every parameter of ``mod[func_name]``
    (inputs first, then the weights), in parameter order."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype("float32") for s in input_shapes(mod, func_name)]


def split_inputs(mod: tvm.IRModule, arrays: list[np.ndarray],
                 func_name: str = "forward") -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Split ``model_inputs`` into the runtime inputs and a ``{param name: array}`` dict of
    the weights, using the function's ``num_input`` attribute (export_tvm sets it)."""
    func = mod[func_name]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs \
        else len(func.params)
    names = [p.name for p in func.params]
    return arrays[:num_input], dict(zip(names[num_input:], arrays[num_input:]))
