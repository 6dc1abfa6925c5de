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

from ..demo import demo_model
from ..utils import RelaxTuneError


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


def _with_upper_bound(mod: tvm.IRModule, bound: int | None) -> tvm.IRModule:
    """``mod`` whose ``forward`` says ``n <= bound`` (``tir_var_upper_bound``): TVM's
    memory planning uses it, and relax_tune's default tuned sizes stop there."""
    if not bound:
        return mod
    out = mod.clone()
    gv = out.get_global_var("forward")
    out[gv] = out["forward"].with_attr("tir_var_upper_bound", {"n": int(bound)})
    return out


def _rope_table(x, base: float = 10000.0):
    """The rotary embedding's ``cos`` and ``sin`` per position and frequency of ``x``
    (1, n, heads, head_dim): ``(n, head_dim)``, ``cos`` in the first half, ``sin`` in the
    second. Computed once per call and shared by q and k (as Llama implementations cache
    it): the angle depends on the position and the frequency only, not on the head."""
    from tvm import te, tirx

    def compute(t):
        half = int(t.shape[3]) // 2

        def fn(s, d):
            i = tirx.floormod(d, half)
            inv = tirx.exp(tirx.Cast("float32", i) * tirx.const(-2.0 * np.log(base) /
                                                                (2 * half), "float32"))
            angle = tirx.Cast("float32", s) * inv
            # one libm call per element (a Select would evaluate both)
            return tirx.if_then_else(d < half, tirx.cos(angle), tirx.sin(angle))

        return te.compute((t.shape[1], 2 * half), fn, name="rope_table")

    return op.tensor_expr_op(compute, "rope_table", [x])


def _rope(x, table):
    """Rotary position embedding of ``x`` (1, n, heads, head_dim), position = sequence
    index, the rotate-half convention (Llama, GPT-NeoX), with ``table`` from
    ``_rope_table``; one elementwise TE kernel."""
    from tvm import te, tirx

    def compute(t, tab):
        half = int(t.shape[3]) // 2

        def fn(b, s, h, d):
            i = tirx.floormod(d, half)
            # rotate half: -x[d + half] for d < half, x[d - half] above. One load at an
            # index always in range: a Select of two loads evaluates both, and read
            # x[-half..-1] before the tensor (a crash when that memory is unmapped).
            partner = t[b, s, h, tirx.floormod(d + half, 2 * half)]
            rot = tirx.Select(d < half, -partner, partner)
            return t[b, s, h, d] * tab[s, i] + rot * tab[s, i + half]

        return te.compute(t.shape, fn, name="rope")

    return op.tensor_expr_op(compute, "rope", [x, table])


def _causal_scores(scores, scale: float):
    """``scores * scale`` with future positions (key index > query index) at -inf."""
    from tvm import te, tirx

    def compute(t):
        def fn(b, h, i, j):
            return tirx.Select(j <= i, t[b, h, i, j] * tirx.const(scale, "float32"),
                               tirx.const(-3.4e38, "float32"))

        return te.compute(t.shape, fn, name="causal_scores")

    return op.tensor_expr_op(compute, "causal_scores", [scores])


def llama_block(dim: int = 512, heads: int = 8, hidden: int = 1536,
                max_seq: int | None = 1024) -> tuple[tvm.IRModule, list]:
    """A Llama-style decoder block with a dynamic sequence length ``n``: RMSNorm ->
    q/k/v projections (no bias) -> rotary embedding of q and k -> causal attention over
    the sequence -> output projection -> residual -> RMSNorm -> SwiGLU MLP
    (``down(silu(gate(h)) * up(h))``) -> residual. Input ``(1, n, dim)`` float32;
    ``max_seq`` is the bound of ``n`` (``tir_var_upper_bound``; None: unbounded). The
    default is the issue's d_model 512, 8 heads; tests use a reduced one."""
    if dim % heads or (dim // heads) % 2:
        raise RelaxTuneError(f"llama_block: dim={dim} must be heads={heads} x an even "
                             "head size")
    head_dim = dim // heads

    class Block(nn.Module):
        def __init__(self):
            self.attn_norm = nn.RMSNorm(dim, -1, bias=False)
            self.q = nn.Linear(dim, dim, bias=False)
            self.k = nn.Linear(dim, dim, bias=False)
            self.v = nn.Linear(dim, dim, bias=False)
            self.o = nn.Linear(dim, dim, bias=False)
            self.mlp_norm = nn.RMSNorm(dim, -1, bias=False)
            self.gate = nn.Linear(dim, hidden, bias=False)
            self.up = nn.Linear(dim, hidden, bias=False)
            self.down = nn.Linear(hidden, dim, bias=False)

        def forward(self, x):
            n = x.shape[1]
            h = self.attn_norm(x)
            q = op.reshape(self.q(h), (1, n, heads, head_dim))
            table = _rope_table(q)
            q = _rope(q, table)
            k = _rope(op.reshape(self.k(h), (1, n, heads, head_dim)), table)
            v = op.reshape(self.v(h), (1, n, heads, head_dim))
            q, k, v = (op.permute_dims(t, [0, 2, 1, 3]) for t in (q, k, v))
            scores = _causal_scores(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                                    1.0 / head_dim**0.5)
            att = op.matmul(op.softmax(scores, axis=-1), v)
            att = op.reshape(op.permute_dims(att, [0, 2, 1, 3]), (1, n, dim))
            x = x + self.o(att)
            h = self.mlp_norm(x)
            return x + self.down(op.silu(self.gate(h)) * self.up(h))

    spec = {"forward": {"x": nn.spec.Tensor((1, "n", dim), "float32")}}
    mod, params = Block().export_tvm(spec)
    return _with_upper_bound(mod, max_seq), params


def bert_layer(dim: int = 768, heads: int = 12, hidden: int = 3072,
               max_seq: int | None = 1024) -> tuple[tvm.IRModule, list]:
    """A BERT-style encoder layer with a dynamic sequence length ``n`` (post-norm):
    q/k/v projections -> softmax(q k^T / sqrt(d)) v over the whole sequence -> output
    projection -> residual -> LayerNorm -> Linear -> GELU -> Linear -> residual ->
    LayerNorm. Input ``(1, n, dim)`` float32; ``max_seq`` as in ``llama_block``. The
    default is BERT-base's layer; tests use a reduced one."""
    if dim % heads:
        raise RelaxTuneError(f"bert_layer: dim={dim} must be a multiple of heads={heads}")
    head_dim = dim // heads

    class Layer(nn.Module):
        def __init__(self):
            self.q = nn.Linear(dim, dim)
            self.k = nn.Linear(dim, dim)
            self.v = nn.Linear(dim, dim)
            self.o = nn.Linear(dim, dim)
            self.ln1 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)
            self.ln2 = nn.LayerNorm(dim)

        def forward(self, x):
            n = x.shape[1]

            def split(t):
                return op.permute_dims(op.reshape(t, (1, n, heads, head_dim)), [0, 2, 1, 3])

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            scores = op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])) * (1.0 / head_dim**0.5)
            att = op.matmul(op.softmax(scores, axis=-1), v)
            att = op.reshape(op.permute_dims(att, [0, 2, 1, 3]), (1, n, dim))
            x = self.ln1(x + self.o(att))
            return self.ln2(x + self.fc2(op.gelu(self.fc1(x))))

    spec = {"forward": {"x": nn.spec.Tensor((1, "n", dim), "float32")}}
    mod, params = Layer().export_tvm(spec)
    return _with_upper_bound(mod, max_seq), params


MODELS: dict[str, Callable[[], tuple[tvm.IRModule, list]]] = {
    "mlp": demo_model,
    "conv_net": conv_net,
    "transformer_block": transformer_block,
}
"""The small static-shape models by name."""

DYNAMIC_MODELS: dict[str, Callable[[], tuple[tvm.IRModule, list]]] = {
    "llama_block": llama_block,
    "bert_layer": bert_layer,
}
"""Models with a dynamic sequence length ``n`` by name (full size by default)."""


def get_model(name: str) -> tuple[tvm.IRModule, list]:
    """``(mod, params)`` of a model by name: one of ``MODELS`` (mlp, conv_net,
    transformer_block) or ``DYNAMIC_MODELS`` (llama_block, bert_layer)."""
    table = {**MODELS, **DYNAMIC_MODELS}
    if name not in table:
        raise RelaxTuneError(f"unknown model {name!r}; choose one of {', '.join(table)}")
    return table[name]()


def input_shapes(mod: tvm.IRModule, func_name: str = "forward",
                 sizes: dict[str, int] | None = None) -> list[tuple[int, ...]]:
    """Shapes of every parameter of ``mod[func_name]`` (inputs, then weights); a symbolic
    dimension takes its value from ``sizes`` (``{"n": 16}``), else RelaxTuneError."""
    shapes = []
    for p in mod[func_name].params:
        dims = []
        for d in p.ty.shape:
            if isinstance(d, tvm.tirx.IntImm):
                dims.append(int(d))
            elif sizes and str(d) in sizes:
                dims.append(int(sizes[str(d)]))
            else:
                raise RelaxTuneError(f"parameter {p.name!r} has the symbolic dimension {d}: "
                                     f"give its size, e.g. sizes={{'{d}': 16}}")
        shapes.append(tuple(dims))
    return shapes


def model_inputs(mod: tvm.IRModule, seed: int = 0, func_name: str = "forward",
                 sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    """Seeded float32 arrays in [-1, 1) for every parameter of ``mod[func_name]``
    (inputs first, then the weights), in parameter order; ``sizes`` gives symbolic
    dimensions their values."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in input_shapes(mod, func_name, sizes):
        out.append(rng.uniform(-1, 1, shape).astype("float32"))
    return out


def split_inputs(mod: tvm.IRModule, arrays: list[np.ndarray],
                 func_name: str = "forward") -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Split ``model_inputs`` into the runtime inputs and a ``{param name: array}`` dict of
    the weights, using the function's ``num_input`` attribute (export_tvm sets it)."""
    func = mod[func_name]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs \
        else len(func.params)
    names = [p.name for p in func.params]
    return arrays[:num_input], dict(zip(names[num_input:], arrays[num_input:]))
