"""Generate (or extend) a corpus of measured candidates for the pre-trained cost model.

    python -m tools.prior.make_corpus --out /work/corpus --time-limit 3000   # on an idle machine
    python -m tools.prior.make_corpus --out /work/corpus --list        # the workloads
    python -m tools.prior.make_corpus --out /work/corpus --only 'matmul_.*' --trials 128
    python -m tools.prior.make_corpus --out /work/corpus --time-limit 2400 \
        --table tools/prior/corpus_tables/<cpu>_<mcpu>-c2_<date>_zoo.npz   # ... kept as a table

Every workload of ``WORKLOADS`` (the correctness zoo's operators at several shapes, the
tasks of ``relax_tune.testing.models``, GEMM / convolution / attention shapes of common networks;
with ``--real-models resnet18 mobilenet_v2 bert vit`` the tasks of the PyTorch models of
``benchmarks/bench_real_models.py`` too, each task once) is
tuned in its own work_dir, ``OUT/work/<workload>@<target tag>``: its first ``--random-trials``
candidates by random sampling of the design space (replay search), the rest by the
evolutionary search with a fresh XGBoost model, so the corpus holds both typical and good
candidates. Then every measured candidate is written, with the target, its trace and its
raw features, to ``OUT/records/<workload>@<tag>.jsonl`` (format: ``tools/prior/corpus.py``).

Resumable: a work_dir keeps its records, so a second run continues where the first stopped
(or extends a workload to a larger ``--trials``); ``--time-limit`` stops after the batch in
flight and still writes what was measured. Workloads marked ``heldout`` (other shapes, and
whole operators never trained on) get ``--heldout-trials`` and are kept out of training by
``train_prior.py``. Held-out workloads run first in each pass, so a short run still yields an
evaluation set. The corpus stays out of the package and the repository.

Measurement: 2 repeats of at least 5 ms, no correctness screen and no head-to-head (only
ranks within a task matter, and they are what the model learns). Run it on an idle machine:
under load the ranks are noise too (a corpus measured at load 8-10 trained a model with
held-out Kendall tau 0.05; the same code on an idle AMD EPYC Zen 4, 0.30). About 0.2-0.3 s
per candidate there: 46 workloads at up to 128 candidates and 4 held-out ones at 256
in about 35 minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Callable

import tvm
import tvm_ffi
from tvm import te, topi
from tvm.s_tir import SBlock

import relax_tune as rt
from relax_tune.cost_model import FEATURE_VERSION, XGBModel, extract_features
from relax_tune.cost_model.transfer import target_facts
from relax_tune.database import JSONDatabase
from relax_tune.database.records import is_baseline
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import LocalRunner
from relax_tune.database import candidate_key
from relax_tune.tuning.tune import tune_tasks
from relax_tune.utils import FAILED_RUN_SECS, normalize_mod, schedule_from_json

from benchmarks.real_models import cpu_model
from tools.prior.corpus import FORMAT_VERSION, load_corpus, read_records, write_table

logger = logging.getLogger("make_corpus")


# ------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Workload:
    """One corpus workload: a name, its operator family, train or held-out, and a builder
    returning its normalised single-function module."""

    name: str
    op: str
    split: str
    build: Callable[[], tvm.IRModule]


def _ph(shape, name):
    return te.placeholder(shape, "float32", name=name)


def _mod(*tensors) -> tvm.IRModule:
    return normalize_mod(te.create_prim_func(list(tensors)))


def matmul(m, k, n):
    a, b = _ph((m, k), "A"), _ph((k, n), "B")
    return lambda: _mod(a, b, topi.matmul(a, b))


def dense(m, k, n):
    x, w = _ph((m, k), "X"), _ph((n, k), "W")
    return lambda: _mod(x, w, topi.nn.dense(x, w))


def dense_bias_relu(m, k, n):
    x, w, b = _ph((m, k), "X"), _ph((n, k), "W"), _ph((n,), "Bias")
    return lambda: _mod(x, w, b, topi.nn.relu(topi.add(topi.nn.dense(x, w), b)))


def batch_matmul(bt, m, n, k):
    a, b = _ph((bt, m, k), "A"), _ph((bt, n, k), "B")
    return lambda: _mod(a, b, topi.nn.batch_matmul(a, b))


def conv2d_nchw(c, h, f, ks, stride):
    x, w = _ph((1, c, h, h), "X"), _ph((f, c, ks, ks), "W")
    return lambda: _mod(x, w, topi.nn.conv2d_nchw(x, w, stride, ks // 2, 1))


def conv2d_nhwc(c, h, f, ks, stride):
    x, w = _ph((1, h, h, c), "X"), _ph((ks, ks, c, f), "W")
    return lambda: _mod(x, w, topi.nn.conv2d_nhwc(x, w, stride, ks // 2, 1))


def conv2d_bias_relu(c, h, f, ks):
    x, w, b = _ph((1, c, h, h), "X"), _ph((f, c, ks, ks), "W"), _ph((1, f, 1, 1), "Bias")
    return lambda: _mod(x, w, b, topi.nn.relu(topi.add(topi.nn.conv2d_nchw(x, w, 1, ks // 2, 1),
                                                         b)))


def depthwise(c, h, stride):
    x, w = _ph((1, c, h, h), "X"), _ph((c, 1, 3, 3), "W")
    return lambda: _mod(x, w, topi.nn.depthwise_conv2d_nchw(x, w, stride, 1, 1))


def pool(kind, c, h):
    x = _ph((1, c, h, h), "X")
    return lambda: _mod(x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind,
                                          layout="NCHW"))


def softmax(m, n):
    x = _ph((m, n), "X")
    return lambda: _mod(x, topi.nn.softmax(x, axis=-1))


def layer_norm(m, n):
    x, g, b = _ph((m, n), "X"), _ph((n,), "G"), _ph((n,), "Bt")
    return lambda: _mod(x, g, b, topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5))


def row_sum(m, n):
    x = _ph((m, n), "X")
    return lambda: _mod(x, topi.sum(x, axis=1))


def elementwise(m, n):
    x, y = _ph((m, n), "X"), _ph((m, n), "Y")
    return lambda: _mod(x, y, topi.nn.relu(topi.add(topi.multiply(x, y), x)))


def transpose(m, n):
    x = _ph((m, n), "X")
    return lambda: _mod(x, topi.transpose(x, (1, 0)))


def _model_tasks(model: str) -> list[tuple[str, tvm.IRModule]]:
    """The tasks of a ``relax_tune.testing.models`` model as the "relax_tune" pipeline tunes them."""
    from relax_tune.testing.models import get_model, model_inputs, split_inputs
    from relax_tune.lowering.prepare import lower_for_tuning

    mod, _ = get_model(model)
    _, params = split_inputs(mod, model_inputs(mod))
    target = rt.host_target()
    lowered = lower_for_tuning(mod, target, params)
    return [(t.task_name, t.mod) for t in extract_tasks(lowered, target)]


def _real_model_tasks(model: str, target) -> list[tuple[str, tvm.IRModule]]:
    """The tasks of a real model of ``bench_real_models.py`` (PyTorch, imported by
    ``relax_tune.model_loader.from_torch``) as the "relax_tune" pipeline tunes them."""
    from benchmarks.real_models import make_model

    from relax_tune.model_loader import from_torch

    torch_model, inputs, _ = make_model(model, small=False)
    loaded = from_torch(torch_model, model, inputs)
    return [(t.task_name, t.mod) for t in extract_tasks(loaded.lowered(target), target)]


def _w(name, op, build, split="train"):
    return Workload(name, op, split, build)


WORKLOADS: list[Workload] = [
    # held out of training: other shapes of trained operators, and whole operators
    _w("matmul_256", "matmul", matmul(256, 256, 256), "heldout"),
    _w("conv2d_nchw_c96_h20", "conv2d_nchw", conv2d_nchw(96, 20, 96, 3, 1), "heldout"),
    _w("batch_matmul_8x96x96x48", "batch_matmul", batch_matmul(8, 96, 96, 48), "heldout"),
    _w("depthwise_c128_h28", "depthwise", depthwise(128, 28, 1), "heldout"),
    _w("layer_norm_128x384", "layer_norm", layer_norm(128, 384), "heldout"),
    # GEMMs: square, skinny, BERT / ViT / MLP shapes
    _w("matmul_64", "matmul", matmul(64, 64, 64)),
    _w("matmul_128", "matmul", matmul(128, 128, 128)),
    _w("matmul_512", "matmul", matmul(512, 512, 512)),
    _w("matmul_1x784x256", "matmul", matmul(1, 784, 256)),
    _w("matmul_128x768x768", "matmul", matmul(128, 768, 768)),
    _w("matmul_197x384x384", "matmul", matmul(197, 384, 384)),
    _w("dense_16x64x32", "dense", dense(16, 64, 32)),
    _w("dense_128x768x3072", "dense", dense(128, 768, 3072)),
    _w("dense_1x512x1000", "dense", dense(1, 512, 1000)),
    _w("dense_bias_relu_64x256x512", "dense", dense_bias_relu(64, 256, 512)),
    _w("dense_16x768x768", "dense", dense(16, 768, 768)),
    _w("dense_197x768x768", "dense", dense(197, 768, 768)),
    _w("dense_128x3072x768", "dense", dense(128, 3072, 768)),
    _w("dense_32x2048x2048", "dense", dense(32, 2048, 2048)),
    _w("dense_1x2048x1000", "dense", dense(1, 2048, 1000)),
    _w("dense_1x1280x1000", "dense", dense(1, 1280, 1000)),
    # attention
    _w("batch_matmul_12x128x128x64", "batch_matmul", batch_matmul(12, 128, 128, 64)),
    _w("batch_matmul_12x128x64x128", "batch_matmul", batch_matmul(12, 128, 64, 128)),
    _w("batch_matmul_2x16x24x32", "batch_matmul", batch_matmul(2, 16, 24, 32)),
    _w("batch_matmul_3x197x197x64", "batch_matmul", batch_matmul(3, 197, 197, 64)),
    # convolutions (ResNet / MobileNet shapes, small zoo shapes)
    _w("conv2d_nchw_c64_h56", "conv2d_nchw", conv2d_nchw(64, 56, 64, 3, 1)),
    _w("conv2d_nchw_c128_h28_s2", "conv2d_nchw", conv2d_nchw(128, 28, 256, 3, 2)),
    _w("conv2d_nchw_c256_h14_1x1", "conv2d_nchw", conv2d_nchw(256, 14, 512, 1, 1)),
    _w("conv2d_nchw_c256_h14", "conv2d_nchw", conv2d_nchw(256, 14, 256, 3, 1)),
    _w("conv2d_nchw_c512_h7", "conv2d_nchw", conv2d_nchw(512, 7, 512, 3, 1)),
    _w("conv2d_nchw_c64_h56_1x1", "conv2d_nchw", conv2d_nchw(64, 56, 256, 1, 1)),
    _w("conv2d_nchw_c8_h14", "conv2d_nchw", conv2d_nchw(8, 14, 16, 3, 1)),
    _w("conv2d_nhwc_c64_h28", "conv2d_nhwc", conv2d_nhwc(64, 28, 64, 3, 1)),
    _w("conv2d_nhwc_c8_h14", "conv2d_nhwc", conv2d_nhwc(8, 14, 16, 3, 1)),
    _w("conv2d_bias_relu_c32_h28", "conv2d_nchw", conv2d_bias_relu(32, 28, 64, 3)),
    # memory-bound operators
    _w("max_pool_c64_h56", "pool", pool("max", 64, 56)),
    _w("avg_pool_c32_h28", "pool", pool("avg", 32, 28)),
    _w("softmax_128x128", "softmax", softmax(128, 128)),
    _w("softmax_1536x197", "softmax", softmax(1536, 197)),
    _w("row_sum_256x1024", "reduce", row_sum(256, 1024)),
    _w("elementwise_512x512", "elementwise", elementwise(512, 512)),
    _w("transpose_256x768", "transpose", transpose(256, 768)),
]

MODEL_NAMES = ("mlp", "conv_net", "transformer_block")
HELDOUT_OPS = ("depthwise", "layer_norm")
"""Operators held out of training whole (model tasks computing them are held out too)."""


def _task_op(task_name: str, mod: tvm.IRModule) -> str:
    """A model task's operator: its name without numbers, "depthwise" for a grouped
    convolution (MobileNetV2's depthwise layers lower to a ``group_conv`` block, not to the
    ``depthwise`` operator held out of training)."""
    blocks: list[str] = []
    tvm_ffi.structural_walk(mod, [(SBlock, lambda b: blocks.append(str(b.name_hint)))])
    if any(b.startswith(("group_conv", "DepthwiseConv")) for b in blocks):
        return "depthwise"
    return re.sub(r"\d+", "", task_name)


REAL_MODEL_NAMES = ("resnet18", "mobilenet_v2", "bert", "vit")
"""``bench_real_models.py``'s models (``--real-models``; PyTorch needed)."""


def all_workloads(with_models: bool = True, real_models: tuple[str, ...] = (),
                  target=None) -> list[Workload]:
    """``WORKLOADS`` plus the tasks of ``relax_tune.testing.models`` and of the ``real_models``
    (``REAL_MODEL_NAMES``) for ``target``, each task once (models share layers) and held
    out when it computes a ``HELDOUT_OPS`` operator."""
    out = list(WORKLOADS)
    models = [(m, lambda m=m: _model_tasks(m)) for m in (MODEL_NAMES if with_models else ())]
    models += [(m, lambda m=m: _real_model_tasks(m, target or rt.host_target()))
               for m in real_models]
    seen: set[int] = set()
    for model, tasks in models:
        try:
            for task_name, mod in tasks():
                shash = int(rt.utils.structural_hash(mod))
                if shash in seen:
                    continue
                seen.add(shash)
                op = _task_op(task_name, mod)
                split = "heldout" if any(h in op for h in HELDOUT_OPS) else "train"
                out.append(Workload(f"{model}.{task_name}", op, split, lambda m=mod: m))
        except Exception as err:  # an optional part of the corpus must not stop it
            logger.warning("model %s skipped: %s: %s", model, type(err).__name__, err)
    return out


# ------------------------------------------------------------------------------------------
# Generation


def target_tag(target: tvm.target.Target) -> str:
    """A file-name-safe tag of the target (mcpu and cores)."""
    mcpu = str(target.attrs.get("mcpu", "generic"))
    cores = int(target.attrs.get("num-cores", 0) or 0)
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{target.kind.name}-{mcpu}-c{cores}")


def export_records(wl: Workload, mod: tvm.IRModule, target, work_dir: str, path: str,
                   random_trials: int, load: float | None = None) -> int:
    """Write every measured candidate of ``work_dir`` to ``path`` (JSON lines, replacing the
    file atomically); returns how many."""
    db = JSONDatabase(work_dir=work_dir)
    records = db.get_all_tuning_records()
    baseline = next((r.mean_run_secs for r in records
                     if is_baseline(r.trace_json) and r.is_valid), None)
    facts = target_facts(target)
    shash = str(rt.utils.structural_hash(mod))
    host = cpu_model()
    tmp = path + ".tmp"
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        order = 0
        for rec in records:
            if is_baseline(rec.trace_json):
                continue
            try:
                feats = extract_features(schedule_from_json(mod, rec.trace_json))
            except Exception as err:  # a record of an older space: left out
                logger.debug("%s: record not replayable: %s", wl.name, err)
                continue
            secs = rec.mean_run_secs if rec.is_valid else FAILED_RUN_SECS
            line = {"v": FORMAT_VERSION, "workload": wl.name, "op": wl.op, "split": wl.split,
                    "shash": shash, "target": str(target), "host": host, "facts": facts,
                    "order": order, "phase": "random" if order < random_trials else
                    "evolutionary", "key": candidate_key(rec.trace_json),
                    "trace": rec.trace_json, "secs": secs, "baseline_secs": baseline,
                    "load": load,
                    "feature_version": FEATURE_VERSION,
                    "features": [round(float(x), 5) for x in feats]}
            f.write(json.dumps(line) + "\n")
            order += 1
            count += 1
    os.replace(tmp, path)
    return count


def measured_trials(work_dir: str) -> int:
    """Candidates (baseline left out) already measured in ``work_dir``."""
    if not os.path.exists(os.path.join(work_dir, "database_tuning_record.json")):
        return 0
    return sum(1 for r in JSONDatabase(work_dir=work_dir).get_all_tuning_records()
               if not is_baseline(r.trace_json))


def run_workload(wl: Workload, target, out: str, trials: int, random_trials: int,
                 deadline: float, seed: int) -> int:
    """Tune ``wl`` to ``trials`` measured candidates (resuming), export its records; returns
    the number of records written (0 when skipped)."""
    tag = target_tag(target)
    work_dir = os.path.join(out, "work", f"{wl.name}@{tag}")
    rec_path = os.path.join(out, "records", f"{wl.name}@{tag}.jsonl")
    os.makedirs(os.path.dirname(rec_path), exist_ok=True)
    done = measured_trials(work_dir)
    if done >= trials and os.path.exists(rec_path) and len(read_records(rec_path)) >= done:
        return 0
    mod = wl.build()
    tasks = extract_tasks(mod, target)
    if len(tasks) != 1:
        logger.warning("%s: %d tasks, expected 1; skipped", wl.name, len(tasks))
        return 0
    random_trials = min(random_trials, trials)
    load = round(os.getloadavg()[0], 2)  # other work on the machine skews parallel kernels
    runner = LocalRunner(timeout_sec=20.0, repeat=2)
    common = dict(num_trials_per_iter=16, convergence_window=0, check_correctness=False,
                  head_to_head_rounds=0, progress_bar=False, seed=seed, min_task_share=0.0,
                  runner=runner)
    try:
        for strategy, budget, model in (("replay", random_trials, "none"),
                                        ("evolutionary", trials, XGBModel(seed=seed))):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if measured_trials(work_dir) >= budget:
                continue
            tune_tasks(tasks, work_dir, max_trials_global=budget, strategy=strategy,
                       cost_model=model, max_time=left, **common)
    finally:
        runner.shutdown()
    n = export_records(wl, tasks[0].mod, target, work_dir, rec_path, random_trials, load)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/work/corpus", help="corpus directory")
    parser.add_argument("--time-limit", type=float, default=3000.0, help="seconds in all")
    parser.add_argument("--trials", type=int, default=64, help="candidates per train workload")
    parser.add_argument("--heldout-trials", type=int, default=256,
                        help="candidates per held-out workload")
    parser.add_argument("--first-pass", type=int, default=48,
                        help="a first pass brings every workload to this many candidates "
                             "(held-out ones to --trials) before any gets more")
    parser.add_argument("--random-trials", type=int, default=24,
                        help="a workload's first candidates sampled at random (replay search)")
    parser.add_argument("--target", default=None, help="target JSON (default: the host)")
    parser.add_argument("--only", default=None, help="regex on workload names")
    parser.add_argument("--no-models", action="store_true",
                        help="leave out the tasks of relax_tune.testing.models")
    parser.add_argument("--real-models", nargs="*", default=[], choices=REAL_MODEL_NAMES,
                        metavar="MODEL", help="also the tasks of these real models of "
                        f"bench_real_models.py ({', '.join(REAL_MODEL_NAMES)}; needs PyTorch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--table", default=None, metavar="NPZ",
                        help="when the run ends (done or out of time), also write the whole "
                             "corpus directory as a table (corpus.py --table): what outlives "
                             "this machine, e.g. into tools/prior/corpus_tables/")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("relax_tune", "tvm"):
        logging.getLogger(name).setLevel(logging.WARNING)
    rt.utils.ensure_tvm_threads()
    target = rt.utils.parse_target(json.loads(args.target)) if args.target else rt.host_target()
    workloads = all_workloads(with_models=not args.no_models,
                              real_models=tuple(args.real_models), target=target)
    if args.only:
        workloads = [w for w in workloads if re.fullmatch(args.only, w.name)]
    if args.list:
        for w in workloads:
            print(f"{w.name:40s} {w.op:20s} {w.split}")
        return
    measure_passes(workloads, target, args)
    if args.table:
        tasks = load_corpus([args.out], FEATURE_VERSION)
        write_table(tasks, args.table, FEATURE_VERSION)
        logger.info("wrote %s: %d tasks, %d candidates", args.table, len(tasks),
                    sum(len(t.secs) for t in tasks))


def measure_passes(workloads: list, target, args) -> None:
    """The two passes over ``workloads`` (module docstring), until done or out of time."""
    deadline = time.monotonic() + args.time_limit
    passes = [{"train": args.first_pass, "heldout": args.trials},
              {"train": args.trials, "heldout": args.heldout_trials}]
    logger.info("target %s, %d workloads, corpus %s", target, len(workloads), args.out)
    for budgets in passes:
        for wl in sorted(workloads, key=lambda w: w.split != "heldout"):
            if time.monotonic() >= deadline:
                logger.info("time limit reached")
                return
            start = time.monotonic()
            try:
                n = run_workload(wl, target, args.out, budgets[wl.split], args.random_trials,
                                 deadline, args.seed)
            except Exception as err:  # one broken workload must not end the corpus run
                logger.warning("%s failed: %s: %s", wl.name, type(err).__name__, err)
                continue
            if n:
                logger.info("%s: %d records (%.0f s)", wl.name, n, time.monotonic() - start)


if __name__ == "__main__":
    main()
