"""Whether a quantized model's convolutions and matmuls run in integers on this machine:
``int8="auto"``, the pipeline's default, answered by a measurement made once per machine.

Integer kernels pay where the CPU multiplies bytes much faster than floats: AVX512-VNNI,
AMX, and AVX2's ``vpmaddubsw`` on an AMD Zen 3 (int8 matmul 1.6x float32, the whole int8
ResNet-18 1.30x relax_tune's float32). On an AMD Zen 1, with the same features, every
256-bit instruction runs as two 128-bit halves and the one integer multiply pipe does about
as many multiply-adds a cycle as the float FMAs: the int8 matmul ran 0.93x float32, and the
int8 ResNet-18 0.71x ONNX Runtime int8 where the same QDQ file in float arithmetic ran 1.39x
(docs/design/int8.md). No feature test tells the two apart, so a probe does: the u8 x s8
matmul of ``testing.int8_kernels`` on the target's int8 instruction against the same layer
in float32, each with the schedule the pre-trained model ranks first (about 6 s on the
Zen 1), timed in interleaved rounds. The integer path is taken where it is at least
``MIN_SPEEDUP`` times faster: beside the kernels, the float path has Winograd's
convolutions and no requantisation.

The answer is kept in ``$RELAX_TUNE_CACHE_DIR/machine/`` (``machine_cache.cache_root``),
one file per target, CPU and TVM version. A target this machine cannot run (another ``mcpu`` or
triple) is not measured: it takes the integer path, as before the probe. A probe that fails
keeps the integer path too, and is tried again next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time

import tvm
from tvm import relax

from .machine_cache import cache_root
from .utils import RelaxTuneError

logger = logging.getLogger(__name__)

MIN_SPEEDUP = 1.2
"""The int8 matmul's speed over float32 from which the integer path is taken."""

PROBE_SHAPE = {"rows": 128, "reduce": 768, "channels": 768}
"""The probe's matmul: u8 (rows, reduce) x s8 (reduce, channels), a BERT-class projection."""

PROBE_VERSION = 1  # a new probe measures again
ROUNDS = 5


def check_int8(int8: object) -> None:
    """Refuse an ``int8`` option other than True, False or "auto" (one clear line)."""
    if int8 is not True and int8 is not False and int8 != "auto":
        raise RelaxTuneError(f"int8 must be True (integer kernels), False (float arithmetic) "
                             f"or 'auto' (measure once on this machine), not {int8!r}")


def resolve_int8(int8: bool | str, mod: tvm.IRModule, target: tvm.target.Target) -> bool:
    """``int8`` as the lowering takes it: True or False as given; "auto" is False only for a
    module with quantize/dequantize operators, compiled for this machine, where the probe
    finds the integer kernels not worth it (``integer_kernels_pay``)."""
    check_int8(int8)
    if int8 != "auto":
        return bool(int8)
    if target.kind.name != "llvm" or not _quantized(mod):
        return True
    return integer_kernels_pay(target)


def _quantized(mod: tvm.IRModule) -> bool:
    ops = {"relax.quantize", "relax.dequantize"}
    found = False

    def visit(expr) -> None:
        nonlocal found
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name in ops:
            found = True

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return found


def runs_here(target: tvm.target.Target) -> bool:
    """Whether ``target``'s code runs on this machine as the host CPU's own (same ``mcpu``,
    no other triple), so that timing it here says something about it."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or "")
    return (target.kind.name == "llvm"
            and str(target.attrs.get("mcpu", "")) == str(codegen.llvm_get_system_cpu())
            and (not triple or triple == str(codegen.llvm_get_system_triple())))


def cache_path(target: tvm.target.Target) -> str:
    """The file that keeps the probe's answer for ``target`` on this CPU."""
    key = "|".join([str(target), _cpu_name(), tvm.__version__, str(PROBE_VERSION)])
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
    return os.path.join(cache_root(), "machine", f"int8-{digest}.json")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
    except OSError:
        return ""


def integer_kernels_pay(target: tvm.target.Target) -> bool:
    """Whether integer kernels beat float32 by ``MIN_SPEEDUP`` on this machine for
    ``target``: the cached answer, else the probe's (then cached). True, unmeasured, for a
    target that does not run here (``runs_here``) and when the probe fails."""
    if not runs_here(target):
        return True
    path = cache_path(target)
    known = _read(path)
    if known is not None:
        return known["integer"]
    logger.info("int8: measuring once whether integer kernels pay on this CPU (kept in %s)",
                path)
    try:
        int8_secs, float_secs = probe(target)
    except Exception as err:  # noqa: BLE001 - never fail the user's compile over the probe
        logger.warning("int8: the probe failed (%s: %s); quantized models take the integer "
                       "kernels (pass int8=False for float arithmetic)",
                       type(err).__name__, err)
        return True
    speedup = float_secs / int8_secs
    answer = {"integer": speedup >= MIN_SPEEDUP, "speedup": round(speedup, 3),
              "int8_us": round(int8_secs * 1e6, 1), "float32_us": round(float_secs * 1e6, 1),
              "min_speedup": MIN_SPEEDUP, "target": str(target), "cpu": _cpu_name(),
              "tvm": tvm.__version__, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    logger.info("int8: the int8 matmul runs %.2fx float32 here: quantized models %s",
                speedup, "take integer kernels" if answer["integer"] else
                "keep float arithmetic (int8=True forces integer kernels)")
    _write(path, answer)
    return answer["integer"]


def describe(mod: tvm.IRModule, target: tvm.target.Target) -> str | None:
    """One line on how ``int8="auto"`` computes the quantized ``mod`` for ``target`` (after
    ``resolve_int8``); None for a module without quantize/dequantize."""
    if target.kind.name != "llvm" or not _quantized(mod):
        return None
    if not runs_here(target):
        return "int8: integer kernels (a target of another CPU: not measured here)"
    path = cache_path(target)
    known = _read(path)
    if known is None:
        return "int8: integer kernels (no measurement of this CPU)"
    how = "integer kernels" if known["integer"] else \
        "float arithmetic around the quantize / dequantize pairs"
    return (f"int8: {how}: the int8 matmul ran {known['speedup']:.2f}x float32 on this CPU "
            f"(integers from {MIN_SPEEDUP}x; measured once, kept in {path})")


def _read(path: str) -> dict | None:
    """The probe's answer kept in ``path``; None when there is none or it is damaged."""
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        known["integer"] = bool(known["integer"])
        return known
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a damaged answer is measured again
        logger.debug("int8 probe answer %s unreadable (%s): measuring again", path, err)
        return None


def probe(target: tvm.target.Target) -> tuple[float, float]:
    """Seconds of the int8 probe matmul and of its float32 twin on this machine, medians of
    ``ROUNDS`` interleaved rounds, each with its predicted schedule."""
    from .testing.int8_kernels import float_kernel, integer_kernel

    timers = [_timer(make("matmul", target, weights_bound=True, **PROBE_SHAPE), target)
              for make in (integer_kernel, float_kernel)]
    rounds = [[timer() for timer in timers] for _ in range(ROUNDS)]
    return (statistics.median(r[0] for r in rounds),
            statistics.median(r[1] for r in rounds))


def _timer(mod: tvm.IRModule, target: tvm.target.Target):
    """A timer of ``mod`` with the schedule the pre-trained model ranks first (nothing
    measured), its packed weight packed once."""
    from .measure.prepack import packed_kernel
    from .testing.int8_kernels import kernel_args
    from .tuning import tune_tir
    from .work_dir import WorkDir

    tuning_log = logging.getLogger("relax_tune.tuning")
    level = tuning_log.level
    tuning_log.setLevel(logging.WARNING)  # the probe's own lines say what happens
    try:
        with tempfile.TemporaryDirectory() as work_dir:
            tune_tir(mod, target, work_dir=work_dir, measure=False)
            sch = WorkDir.of(work_dir).open_predicted().query_schedule(mod, target)
    finally:
        tuning_log.setLevel(level)
    lib, args = packed_kernel(mod if sch is None else sch.mod, target, kernel_args(mod))
    lib["main"](*args)
    evaluator = lib.time_evaluator("main", tvm.cpu(), number=10, repeat=1)
    return lambda: float(evaluator(*args).mean)


def _write(path: str, answer: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(answer, f, indent=1)
        os.replace(tmp, path)  # whole or not at all
    except OSError as err:
        logger.debug("cannot keep the int8 probe's answer in %s (%s)", path, err)
