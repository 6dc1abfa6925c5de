"""Dynamic sequence length: a Llama-style decoder block and a BERT-style encoder layer, each
compiled ONCE with a symbolic sequence length and run at several lengths, side by side:
TVM untuned, relax_tune (weights bound, tuned at the hinted sizes) and PyTorch eager.

    python -m benchmarks.bench_dynamic --models llama bert --sizes 1 16 128 512 300 \\
        --hints n=1,16,64,256,1024 --trials-per-task 8 [--max-time 1800] [--omp-passive]
    python -m benchmarks.bench_dynamic --small --trials-per-task 1 --sizes 1 7 16   # smoke

Models (``relax_tune.testing.models``, random weights scaled by 1/sqrt(fan-in), batch 1, float32):
- ``llama``: ``llama_block()``: d_model 512, 8 heads, SwiGLU 1536, RMSNorm, rotary
  embedding, causal attention (``--small``: d 64, 4 heads, 128).
- ``bert``: ``bert_layer()``: BERT-base's layer, d 768, 12 heads, FFN 3072, GELU, post-norm
  (``--small``: d 64, 4 heads, 128).
- ``bert-export``: what a user brings, a PyTorch BERT-class encoder (token embeddings plus a
  learnt position table sliced to the length, layer norm, 4 ``nn.TransformerEncoderLayer``
  d 256, 4 heads, FFN 1024, GELU; the real-model benchmark's encoder) exported with
  ``torch.export`` and a dynamic length ``Dim("seq", max=512)``, imported with
  ``relax_tune.model_loader.from_torch``; int64 token ids in. Hinted sizes past the bound
  become the bound; the hint's variable is renamed to the one TVM's importer made (``s27``).
  ONNX Runtime runs too (``torch.onnx.export`` with the same dynamic length, CPU provider,
  ``intra_op`` = the threads, ``inter_op`` 1). ``--small``: 1 layer, d 64, 2 heads, max 64.

Rows per model and sequence length:
- ``tvm-untuned``: weights bound, ``relax.get_pipeline("zero")``, ``tvm.compile``: TVM's stock
  lowering of the dynamic-shape model (after ``shape_bounds.SimplifyBoundedShapes``, without
  which ``bert-export`` does not compile).
- ``relax_tune``: ``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("relax_tune",
  params=weights, shape_hints=HINTS, max_trials_global=N))``: every function with the
  symbolic length tuned at each hinted size, one dispatching kernel per function
  (``relax_tune.dynamic``). "tune wall s" is that compilation's wall time (tuning included).
- ``pytorch``: eager, ``torch.inference_mode()``, the same weights; attention through
  ``F.scaled_dot_product_attention`` (causal for llama), ``F.rms_norm``, ``F.layer_norm``
  (``bert-export``: the module itself).
- ``onnxruntime`` (``bert-export`` only; "vs ORT" is relax_tune against it).

Timing as ``bench_real_models.py``: the same thread count for every contender
(``TVM_NUM_THREADS`` before tvm is imported, ``torch.set_num_threads``); per length, the
contenders are timed round by round (order rotating, a pause before each timing, a warm-up
call, then as many calls as fill ``--min-secs``); a row's latency is the median over rounds,
its ratios the medians of the per-round ratios. Every output is compared with PyTorch's
(``--tol`` relative to the largest reference value); a mismatch exits with status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

# the real-model benchmark's helpers: progress lines, the machine and commit, one round of calls
from benchmarks.bench_real_models import log, relax_tune_commit
from benchmarks.contenders import calibrate, time_once
from benchmarks.real_models import cpu_model, set_torch_threads


def make_model(name: str, small: bool):
    """``(mod, weights {name: array}, config)`` of a model with a symbolic length ``n``."""
    from relax_tune.testing import models

    if name == "llama":
        cfg = dict(dim=64, heads=4, hidden=128) if small else dict(dim=512, heads=8,
                                                                 hidden=1536)
        mod, params = models.llama_block(**cfg)
    else:
        cfg = dict(dim=64, heads=4, hidden=128) if small else dict(dim=768, heads=12,
                                                                 hidden=3072)
        mod, params = models.bert_layer(**cfg)
    rng = np.random.default_rng(0)
    weights = {}
    for pname, param in params:
        shape = [int(d) for d in param.shape]
        if pname.endswith("norm.weight") or (name == "bert" and pname.startswith("ln")
                                             and pname.endswith("weight")):
            weights[pname] = (1 + 0.1 * rng.uniform(-1, 1, shape)).astype("float32")
        else:
            scale = 1 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.1
            weights[pname] = (scale * rng.uniform(-1, 1, shape)).astype("float32")
    return mod, weights, cfg


def export_model(small: bool):
    """``(torch module, torch.export program with a dynamic length, config)`` of
    ``bert-export``; seeded."""
    import torch
    from torch import nn

    cfg = (dict(vocab=1000, dim=64, heads=2, hidden=128, layers=1, max_len=64) if small
           else dict(vocab=8192, dim=256, heads=4, hidden=1024, layers=4, max_len=512))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.pos = nn.Parameter(torch.randn(1, cfg["max_len"], cfg["dim"]) * 0.02)
            self.norm = nn.LayerNorm(cfg["dim"])
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(cfg["dim"], cfg["heads"], cfg["hidden"],
                                           dropout=0.0, activation="gelu", batch_first=True)
                for _ in range(cfg["layers"]))

        def forward(self, ids):
            h = self.norm(self.tok(ids) + self.pos[:, : ids.shape[1]])
            for layer in self.layers:
                h = layer(h)
            return h

    torch.manual_seed(0)
    module = Encoder().eval()
    ids = torch.randint(0, cfg["vocab"], (1, 16), dtype=torch.int64)
    seq = torch.export.Dim("seq", min=1, max=cfg["max_len"])
    program = torch.export.export(module, (ids,), dynamic_shapes={"ids": {1: seq}})
    return module, program, cfg


def onnxruntime_session(module, cfg: dict, path: str, threads: int):
    """ONNX Runtime (CPU) on ``module`` exported with the same dynamic length."""
    import onnxruntime as ort
    import torch

    ids = torch.randint(0, cfg["vocab"], (1, 16), dtype=torch.int64)
    seq = torch.export.Dim("seq", min=1, max=cfg["max_len"])
    torch.onnx.export(module, (ids,), path, input_names=["ids"],
                      dynamic_shapes={"ids": {1: seq}})
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def torch_forward(name: str, weights: dict, cfg: dict):
    """PyTorch eager version of the model with the same weights: ``f(x) -> y``."""
    import torch
    import torch.nn.functional as F

    w = {k: torch.from_numpy(v) for k, v in weights.items()}
    dim, heads = cfg["dim"], cfg["heads"]
    hd = dim // heads

    def split(t, n):
        return t.view(1, n, heads, hd).transpose(1, 2)

    if name == "llama":
        half = hd // 2
        inv = torch.exp(torch.arange(half, dtype=torch.float32) * (-2.0 * math.log(10000.0) /
                                                                   hd))

        def rope(t, n):  # t: (1, heads, n, hd)
            ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
            cos, sin = torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)
            rot = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
            return t * cos + rot * sin

        def forward(x):
            n = x.shape[1]
            h = F.rms_norm(x, (dim,), w["attn_norm.weight"], eps=1e-5)
            q = rope(split(F.linear(h, w["q.weight"]), n), n)
            k = rope(split(F.linear(h, w["k.weight"]), n), n)
            v = split(F.linear(h, w["v.weight"]), n)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(att.transpose(1, 2).reshape(1, n, dim), w["o.weight"])
            h = F.rms_norm(x, (dim,), w["mlp_norm.weight"], eps=1e-5)
            return x + F.linear(F.silu(F.linear(h, w["gate.weight"])) *
                                F.linear(h, w["up.weight"]), w["down.weight"])
    else:
        def forward(x):
            n = x.shape[1]
            q = split(F.linear(x, w["q.weight"], w["q.bias"]), n)
            k = split(F.linear(x, w["k.weight"], w["k.bias"]), n)
            v = split(F.linear(x, w["v.weight"], w["v.bias"]), n)
            att = F.scaled_dot_product_attention(q, k, v)
            x = F.layer_norm(x + F.linear(att.transpose(1, 2).reshape(1, n, dim),
                                          w["o.weight"], w["o.bias"]),
                             (dim,), w["ln1.weight"], w["ln1.bias"], eps=1e-5)
            ff = F.linear(F.gelu(F.linear(x, w["fc1.weight"], w["fc1.bias"])),
                          w["fc2.weight"], w["fc2.bias"])
            return F.layer_norm(x + ff, (dim,), w["ln2.weight"], w["ln2.bias"], eps=1e-5)
    return forward


# ---------------------------------------------------------------------------- timing
@dataclass
class _Output:
    """ONNX Runtime's numpy output, with the ``.numpy()`` the other contenders' have."""

    array: np.ndarray

    def numpy(self) -> np.ndarray:
        return self.array


@dataclass
class Row:
    contender: str
    call: object
    output: np.ndarray | None = None
    samples: list[float] = field(default_factory=list)
    vs_untuned: list[float] = field(default_factory=list)
    vs_torch: list[float] = field(default_factory=list)
    vs_ort: list[float] = field(default_factory=list)
    number: int = 1
    warm: bool = True
    max_rel: float | None = None


def interleave(rows: list[Row], rounds: int, pause: float) -> None:
    for rnd in range(rounds):
        shift = rnd % len(rows)
        this = {}
        for row in rows[shift:] + rows[:shift]:
            time.sleep(pause)
            this[row.contender] = time_once(row)
            row.samples.append(this[row.contender])
        for row in rows:
            row.vs_untuned.append(this["tvm-untuned"] / this[row.contender])
            row.vs_torch.append(this["pytorch"] / this[row.contender])
            if "onnxruntime" in this:
                row.vs_ort.append(this["onnxruntime"] / this[row.contender])


# ---------------------------------------------------------------------------- one model
def bench_model(name: str, args, target, root: str) -> tuple[list[str], bool]:
    import torch
    import tvm
    from tvm import relax

    import relax_tune as rt
    from relax_tune.dynamic import parse_shape_hints
    from relax_tune.lowering.prepare import bind_params
    from relax_tune.lowering.shape_bounds import SimplifyBoundedShapes

    hints = parse_shape_hints(args.hints)
    session = None
    if name == "bert-export":
        from relax_tune.model_loader import from_torch

        module, program, cfg = export_model(args.small)
        loaded = from_torch(program, name)
        mod, weights = loaded.mod, loaded.params
        var = str(mod["main"].params[0].ty.shape[1])  # the importer's name for the length
        hints = {var: {min(size, cfg["max_len"]): w for table in hints.values()
                       for size, w in table.items()}}
        session = onnxruntime_session(module, cfg, os.path.join(root, f"{name}.onnx"),
                                      int(os.environ["TVM_NUM_THREADS"]))
    else:
        mod, weights, cfg = make_model(name, args.small)
    with target:
        lowered = rt.transform.lower_for_tuning(mod, target, weights)
    tasks = rt.extract_tasks(lowered, target, shape_hints=hints)
    budget = args.trials if args.trials is not None else args.trials_per_task * len(tasks)
    log(f"{name}: {cfg}, {len(tasks)} tasks at {args.hints}; budget {budget} trials"
        + (f", max_time {args.max_time:.0f} s" if args.max_time else ""))

    start = time.perf_counter()
    with target:
        # SimplifyBoundedShapes: without it TVM's stock lowering fails on bert-export
        untuned_ex = tvm.compile(relax.get_pipeline("zero")(
            SimplifyBoundedShapes()(bind_params(mod, weights))), target)
    log(f"{name}: untuned build {time.perf_counter() - start:.1f} s")

    work_dir = os.path.join(root, f"{name}_work")
    options = dict(max_time=args.max_time) if args.max_time else {}
    if args.dispatch_ranking is not None:
        options["dispatch_ranking"] = args.dispatch_ranking
    if args.no_dispatch_plan:
        options["dispatch_plan"] = False
    start = time.perf_counter()
    tuned_ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=work_dir, max_trials_global=budget,
        params=weights, shape_hints=hints, progress_bar=False, **options))
    tune_secs = time.perf_counter() - start
    log(f"{name}: relax_tune compile (tuning included) {tune_secs:.1f} s")

    dev = tvm.cpu()
    vms = {"tvm-untuned": relax.VirtualMachine(untuned_ex, dev),
           "relax_tune": relax.VirtualMachine(tuned_ex, dev)}
    entry = "main" if session is not None else "forward"
    reference = module if session is not None else torch_forward(name, weights, cfg)
    lines, failed = [], False
    rng = np.random.default_rng(1)
    for n in args.sizes:
        if session is not None:
            x = rng.integers(0, cfg["vocab"], (1, n)).astype("int64")
        else:
            x = rng.uniform(-1, 1, (1, n, cfg["dim"])).astype("float32")
        xt = torch.from_numpy(x)
        xv = tvm.runtime.tensor(x, dev)

        def torch_call(xt=xt):
            with torch.inference_mode():
                return reference(xt)

        rows = [Row(c, (lambda f=vms[c][entry], xv=xv: f(xv))) for c in vms]
        rows.append(Row("pytorch", torch_call))
        if session is not None:
            rows.append(Row("onnxruntime",
                            lambda x=x: _Output(session.run(None, {"ids": x})[0])))
        expected = torch_call().numpy()
        for row in rows:
            out = row.call()
            row.output = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
            scale = max(float(np.abs(expected).max()), 1e-6)
            row.max_rel = float(np.abs(row.output - expected).max()) / scale
            calibrate(row, args.min_secs)
        interleave(rows, args.rounds, args.pause)
        for row in rows:
            ms = float(np.median(row.samples)) * 1e3
            bad = row.max_rel > args.tol
            failed |= bad
            vs_ort = f"{np.median(row.vs_ort):.2f}x" if row.vs_ort else "-"
            lines.append(
                f"| {name} | {n} | {row.contender} | {ms:.3f} | "
                f"{np.median(row.vs_untuned):.2f}x | {np.median(row.vs_torch):.2f}x | {vs_ort} | "
                f"{f'{tune_secs:.0f}' if row.contender == 'relax_tune' else '-'} | "
                f"{row.max_rel:.1e}{' MISMATCH' if bad else ''} |")
        log(f"{name}: n={n} timed")
    return lines, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama", "bert"],
                        choices=["llama", "bert", "bert-export"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 16, 128, 512, 300],
                        help="sequence lengths to time (default: 1 16 128 512 and 300, "
                             "between the buckets)")
    parser.add_argument("--hints", default="n=1,16,64,256,1024",
                        help="sizes tuned (relax-tune tune --dynamic syntax)")
    parser.add_argument("--trials-per-task", type=int, default=8,
                        help="budget = this x the number of tasks (tasks are per size)")
    parser.add_argument("--trials", type=int, default=None, help="absolute budget instead")
    parser.add_argument("--max-time", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--dispatch-ranking", type=int, default=None, metavar="N",
                        help="records per dynamic-shape bucket timed as dispatched after "
                             "the search (TuneConfig.dispatch_ranking; 0: off)")
    parser.add_argument("--no-dispatch-plan", action="store_true",
                        help="each size runs its nearest bucket's kernel: no dispatch measured "
                             "after the search (TuneConfig.dispatch_plan=False)")
    parser.add_argument("--small", action="store_true", help="reduced models (smoke run)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--min-secs", type=float, default=0.2)
    parser.add_argument("--tol", type=float, default=1e-3)
    parser.add_argument("--work-root", default=None)
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for PyTorch's OpenMP threads, as "
                             "bench_real_models.py. Only for a busy machine: on a quiet one "
                             "it slows PyTorch (Llama block n=128: 6.8 -> 12.4 ms, Zen 4)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch (its libgomp) is imported
    threads = args.threads or len(os.sched_getaffinity(0))
    import logging

    import torch

    set_torch_threads(torch, threads)
    import tvm

    import relax_tune as rt
    from relax_tune.utils import ensure_tvm_threads

    # before TVM's first parallel kernel and its workers (its pool reads them when it starts)
    ensure_tvm_threads(threads)

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    target = rt.host_target()
    print(f"CPU: {cpu_model()} ({len(os.sched_getaffinity(0))} usable cores); target: "
          f"{target}\nrelax_tune commit: {relax_tune_commit()}\nthreads: {threads} for every "
          f"contender; tvm {tvm.__version__}, torch {torch.__version__}; "
          f"{'reduced models (--small)' if args.small else 'full-size models'}; hints "
          f"{args.hints}; timing: {args.rounds} interleaved rounds; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; load at start {os.getloadavg()}",
          flush=True)
    root = args.work_root or tempfile.mkdtemp(prefix="bench_dynamic_")
    table = ["| model | n | contender | ms | vs untuned | vs PyTorch | vs ORT | tune wall s | "
             "max rel diff |", "|---|---|---|---|---|---|---|---|---|"]
    failed = False
    for name in args.models:
        lines, bad = bench_model(name, args, target, root)
        table += lines
        failed |= bad
    print("\n".join(table), flush=True)
    print(f"work dirs under {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
