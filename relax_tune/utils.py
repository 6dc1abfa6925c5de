"""Small helpers shared by every part of relax_tune: targets, workload normalisation,
structural hashing, and plain-JSON traces."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule, Trace

from .host_cpu import host_target_config

FAILED_RUN_SECS = 1e10
"""Run time recorded for a candidate that failed to build or run (MetaSchedule's kMaxMeanTime)."""


@tvm_ffi.register_error
class RelaxTuneError(ValueError):
    """A problem the user can fix (bad target, bad work_dir, unknown op name, ...).

    Registered with TVM's FFI so it keeps its type when raised inside a pass."""


def error_line(err: BaseException, with_type: bool = False) -> str:
    """The first line of an error's message (TVM's run to pages), or its type's name when it
    has none; with ``with_type``, ``"TypeName first line"``."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    if with_type:
        return f"{type(err).__name__} {first}".rstrip()
    return first or type(err).__name__


def parse_target(target: Any = None) -> tvm.target.Target:
    """Turn a Target, a target string, a JSON-dict, or None (the ``with target:`` scope)
    into a ``tvm.target.Target``; raise RelaxTuneError naming the bad value otherwise."""
    if target is None:
        current = tvm.target.Target.current(allow_none=True)
        if current is None:
            raise RelaxTuneError(
                "no target given: pass target=... (e.g. {'kind': 'llvm', 'num-cores': 2} or "
                "relax_tune.host_target()) "
                "or call inside `with tvm.target.Target(...):`"
            )
        return current
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, (str, dict)):
        if isinstance(target, dict) and target.get("kind") == "llvm":
            # before TVM makes it: for some triples making it asks LLVM, which prints errors
            check_llvm_cpu(target.get("mcpu"), target.get("mtriple"))
        try:
            parsed = tvm.target.Target(target)
        except Exception as err:  # TVM raises ValueError/TVMError with a long message
            raise RelaxTuneError(
                f"{target!r} is not a TVM target ({error_line(err)}); use e.g. "
                "'llvm' or {'kind': 'llvm', 'mcpu': 'znver3', 'num-cores': 2}"
            ) from None
        if parsed.kind.name == "llvm":
            check_llvm_cpu(parsed.attrs.get("mcpu"), parsed.attrs.get("mtriple"))
        return parsed
    raise RelaxTuneError(f"{target!r} (a {type(target).__name__}) is not a TVM target")


@functools.lru_cache(maxsize=16)
def _llvm_cpus(triple: str) -> frozenset[str]:
    """The CPU names LLVM knows for ``triple`` (empty when it has no backend for it)."""
    from tvm.target import codegen

    if triple.split("-")[0] not in set(codegen.llvm_get_targets()):
        return frozenset()  # asking LLVM about a triple it cannot build for crashes it
    target = tvm.target.Target({"kind": "llvm", "mtriple": triple})
    return frozenset(str(cpu) for cpu in codegen.llvm_get_cpu_archlist(target))


def check_llvm_cpu(mcpu: Any, mtriple: Any = None) -> None:
    """RelaxTuneError when an llvm target's ``mcpu`` is no CPU LLVM knows for its triple
    (``mtriple``, else this machine's): LLVM would print errors, compile for a generic CPU
    instead and every timing would be of code the user did not ask for."""
    cpu = str(mcpu or "")
    if not cpu or cpu == "native":
        return
    from tvm.target import codegen

    triple = str(mtriple or "") or codegen.llvm_get_system_triple()
    try:
        cpus = _llvm_cpus(str(triple))
    except Exception:  # an LLVM without these queries: nothing to check against
        return
    if cpus and cpu not in cpus:
        host = codegen.llvm_get_system_cpu()
        raise RelaxTuneError(f"target mcpu {cpu!r} is not a CPU LLVM knows for {triple}: give "
                             f"one it does (this machine: {host!r}) or leave mcpu out")


def target_config(target: tvm.target.Target) -> dict:
    """The target as a JSON dict (MetaSchedule's ``Target.ToConfig`` form)."""
    return json.loads(str(target))


_ISA_KEYS = ("kind", "mcpu", "mattr", "mtriple", "arch", "march", "device", "model")


def target_compatible(record_target: tvm.target.Target | dict | None,
                      query_target: tvm.target.Target | dict | None) -> bool:
    """True when a schedule tuned for ``record_target`` may be used for ``query_target``.

    A missing target on either side matches anything. Otherwise the kind must match, and
    every instruction-set attribute (mcpu, mtriple, arch, ...) that both name must be
    equal; so must ``mattr`` where both name the same CPU (none means the CPU's own
    features: ``znver4`` and ``znver4`` less AVX-512, as ``host_target`` gives on a guest
    that hides it, are two machines). Core counts may differ: a schedule stays valid, only
    its tuning is off.
    """
    if record_target is None or query_target is None:
        return True
    a = record_target if isinstance(record_target, dict) else target_config(record_target)
    b = query_target if isinstance(query_target, dict) else target_config(query_target)
    for key in _ISA_KEYS:
        if key in a and key in b and _isa_value(a[key]) != _isa_value(b[key]):
            return False
    if "mcpu" in a and a.get("mcpu") == b.get("mcpu") and \
            _isa_value(a.get("mattr") or []) != _isa_value(b.get("mattr") or []):
        return False
    return True


def _isa_value(value: Any) -> Any:
    """An instruction-set attribute to compare: a feature list in any order is one set."""
    return sorted(str(v) for v in value) if isinstance(value, (list, tuple)) else value


def normalize_mod(func_or_mod: tirx.PrimFunc | tvm.IRModule) -> tvm.IRModule:
    """A single-function IRModule named ``main`` exactly as MetaSchedule normalises it,
    so hashes agree with MetaSchedule's databases: ``global_symbol`` is set to ``"main"``,
    ``tirx.noalias=True`` is set, and the function is keyed ``main``.

    MetaSchedule only adds ``global_symbol`` when absent; we overwrite it as well, so the same
    computation hashes the same before and after ``AttachGlobalSymbol`` (for functions without
    a symbol, the MetaSchedule case, both agree)."""
    if isinstance(func_or_mod, tvm.IRModule):
        funcs = list(func_or_mod.functions.items())
        if len(funcs) != 1:
            raise RelaxTuneError(
                f"a workload must hold exactly one function, this module holds {len(funcs)}")
        func = funcs[0][1]
    else:
        func = func_or_mod
    if not isinstance(func, tirx.PrimFunc):
        raise RelaxTuneError(f"a workload must be a TIR PrimFunc, not {type(func).__name__}")
    func = func.with_attr("global_symbol", "main").with_attr("tirx.noalias", True)
    return tvm.IRModule({"main": func})


_TVM_VERSION = re.compile(r'"tvm_version"\s*:\s*"([^"]*)"')


def load_ir_json(text: str) -> Any:
    """``tvm.ir.load_json(text)``, without its upgrade pass for a graph this TVM wrote (its
    ``metadata.tvm_version``, the graph's last key). The upgrade parses and writes the whole
    graph again in Python whatever its version: 8x the load itself (the shipped library's
    171 workloads: 0.97 s against 0.12 s, 3.4 s beside a session's busy workers, at the
    start of every tuning session and no-measurement compile; Zen 3)."""
    match = _TVM_VERSION.search(text, max(0, len(text) - 256))
    if match is not None and match.group(1) == tvm.__version__:
        return tvm.ir.base.from_json_graph_str(text)
    return tvm.ir.load_json(text)


def structural_hash(mod: tvm.IRModule, ignore_tensor: bool = False) -> int:
    """TVM's structural hash of a workload module (what the JSON database stores)."""
    return int(tvm_ffi.structural_hash(mod, map_free_vars=False, skip_tensor_content=ignore_tensor))


def dynamic_shape_vars(func: tirx.PrimFunc) -> list[str]:
    """Names of the symbolic variables in the parameter shapes (empty for static shapes)."""
    names = []
    for param in func.params:
        for dim in getattr(param, "shape", None) or []:
            if not isinstance(dim, tirx.IntImm) and str(dim) not in names:
                names.append(str(dim))
    return names


def to_plain(obj: Any) -> Any:
    """``Trace.as_json()`` output as plain Python JSON (it holds IntImm/FloatImm objects)."""
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, tirx.IntImm):
        return bool(obj.value) if str(obj.ty) == "bool" else int(obj.value)
    if isinstance(obj, tirx.FloatImm):
        return float(obj.value)
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return [to_plain(x) for x in obj]


def trace_to_json(trace: Trace) -> list:
    """A trace (with its decisions and postprocessing) as plain JSON ``[insts, decisions]``."""
    return to_plain(trace.as_json(remove_postproc=False))


class UncheckedSchedule(Schedule):
    """TVM's traced ``Schedule`` without the Python check of every primitive call's argument
    types (TVM's ``type_checked``: ``inspect.Signature.bind`` and a walk of each argument):
    the checks took 30% of a replay (24 candidates of a 256x256 matmul, 0.70 -> 0.49 s
    median of 6, AMD EPYC Zen 1). relax_tune's own calls pass TVM's types; a wrong one
    still fails, in TVM's FFI. ``copy()`` gives a checked ``Schedule`` (sketch generation
    copies, once per task)."""

    __slots__ = ()


def _unwrap_type_checks() -> None:
    for name, method in list(vars(Schedule).items()):
        if callable(method) and hasattr(method, "__wrapped__"):
            setattr(UncheckedSchedule, name, method.__wrapped__)


_unwrap_type_checks()


def replay_schedule(mod: tvm.IRModule, seed: int | None = None) -> Schedule:
    """A fresh traced schedule of ``mod`` to replay candidates on: an ``UncheckedSchedule``
    rendering no error text (fast), seeded with ``seed`` (TVM's seeds start at 1: 0 or None
    is a random one)."""
    if seed:
        return UncheckedSchedule(mod, seed=int(seed), error_render_level="none")
    return UncheckedSchedule(mod, error_render_level="none")


def schedule_from_json(mod: tvm.IRModule, trace_json: list, seed: int | None = None) -> Schedule:
    """Replay a plain-JSON trace on a fresh traced schedule of ``mod``."""
    sch = replay_schedule(mod, seed)
    apply_trace_json(trace_json, sch)
    return sch


def apply_trace_json(trace_json: list, sch: Schedule) -> None:
    """``Trace.apply_json_to_schedule``, with relax_tune's own tensor intrinsics that the
    trace names registered first (they are registered on first use, in each process:
    ``space.cpu.int8_intrin``, ``space.cpu.amx_intrin``). A trace that uses AVX2's
    ``vpmaddubsw`` on a function not marked as having narrow weight pairs raises a
    ``RelaxTuneError`` (it would saturate there: ``int8_intrin.NARROW_PAIRS_ATTR``)."""
    named = [str(inst[2][0]) for inst in trace_json[0]
             if inst[0] == "Tensorize" and inst[2] and str(inst[2][0]).startswith("relax_tune.")]
    if named:
        from .space.cpu import amx_intrin, int8_intrin

        if int8_intrin.AVX2_8X4_NARROW in named \
                and not int8_intrin.marked_narrow(sch.mod["main"]):
            raise RelaxTuneError("the trace multiplies with vpmaddubsw, which saturates on "
                                 "this function's weights (not marked "
                                 f"{int8_intrin.NARROW_PAIRS_ATTR})")
        int8_intrin.register_named(named)
        amx_intrin.register_named(named)
    Trace.apply_json_to_schedule(trace_json, sch)


def args_info(mod: tvm.IRModule, symbolic_as_none: bool = False) -> list:
    """MetaSchedule's ``args_info`` of a workload: ``[["TENSOR", dtype, shape], ...]``
    (with ``symbolic_as_none``, None for each symbolic dimension)."""
    func = mod["main"]
    out = []
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is None:
            out.append(["SCALAR", str(param.dtype)])
        else:
            out.append(["TENSOR", str(param.dtype),
                        [None if symbolic_as_none and not isinstance(d, (int, tvm.tirx.IntImm))
                         else int(d) for d in shape]])
    return out


REASSOCIATE_FLAGS = ("fast-math-reassoc", "fast-math-nsz", "fast-math-arcp",
                     "fast-math-contract")
"""LLVM floating-point flags ``host_target`` sets: reductions may be reassociated, so LLVM
vectorises a loop ``s += x[k]`` or ``m = max(m, x[k])`` (softmax, norms, pooling), as
vectorised libraries (MLAS, PyTorch's) sum in their own order; signed zeros, reciprocals
and fused multiply-adds likewise. Results move by float32 rounding only. No "no NaN / no
inf" assumption is made (masks of ``-inf`` stay exact). Norms and softmax run several
times faster, matrix products unchanged (measured: docs/design/reassociation-flags.md).
A target's flags apply to the whole build (TVM has no per-function flags), so they sit in
the target, not in a pass."""


def host_target(reassociate: bool = True) -> tvm.target.Target:
    """An llvm target for the machine this runs on: LLVM's name for the host CPU, less the
    SIMD features this machine does not offer (``host_cpu.host_target_config``: never code
    it cannot execute, e.g. AVX-512 on an AVX2 host or guest), and its core count, with
    ``REASSOCIATE_FLAGS`` unless ``reassociate=False`` (strict IEEE evaluation order).
    The flags do not change which records apply (``target_compatible``)."""
    config = host_target_config()
    if reassociate:
        config.update(dict.fromkeys(REASSOCIATE_FLAGS, True))
    return tvm.target.Target(config)


def ensure_tvm_threads(threads: int | None = None) -> int:
    """Make TVM's CPU thread pool use every usable core (or ``threads``), unless the user
    set TVM_NUM_THREADS, and leave its threads unpinned unless the user set
    TVM_BIND_THREADS. Returns the thread count.

    TVM assumes hyper-threading and starts half the cores' threads by default; on a 2-vCPU
    machine every kernel would then run, and be tuned, on one thread. It also pins each
    thread to a core: when another process needs one of the cores, the thread pinned there
    waits out that process's time slices at every kernel's barrier, while an unpinned one
    moves to the free core. ResNet-18 tuned 60 s, 2 threads, one other process spinning on
    this 2-core Zen 3: 144-281 ms a run pinned, 89-105 ms unpinned, ONNX Runtime 59.5 ms;
    on an idle machine pinned and unpinned are level (medians of five processes 25.1 and
    23.1 ms, the machine drifting by 20-35 ms; docs/results/zen3-epyc.md). This must run
    before the process first launches a parallel kernel. relax_tune calls it in its own
    worker processes only; a user's process that runs tuned models calls it (or sets the
    variables) itself, before the first call.
    """
    import os

    if threads is not None:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    elif not os.environ.get("TVM_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    return int(os.environ["TVM_NUM_THREADS"])
