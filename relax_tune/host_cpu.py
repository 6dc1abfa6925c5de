"""This machine as an LLVM target: the CPU LLVM names and the SIMD extensions this machine
really offers (``/proc/cpuinfo``), which a virtual machine may hide from that CPU. Imports
nothing of relax_tune, so the design space (``space.cpu.amx_intrin``) and ``utils`` both use it."""

from __future__ import annotations

import os

import tvm

_SIMD_FEATURE_PREFIXES = ("avx", "amx", "fma", "f16c", "gfni", "vaes", "vpclmulqdq", "sha")
"""LLVM features that select instructions a kernel may emit and that Linux lists by (almost)
the same name in ``/proc/cpuinfo`` (``avx512vnni`` / ``avx512_vnni``, ``amx-tile`` /
``amx_tile``, ``sha`` / ``sha_ni``)."""


def _flag_key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(".", "")


def _host_cpu_flags() -> frozenset[str] | None:
    """The CPU flags Linux lists for this machine (normalised by ``_flag_key``), or None
    where there is no ``/proc/cpuinfo`` to read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(_flag_key(flag) for flag in line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def host_missing_features(mcpu: str) -> list[str]:
    """The SIMD features LLVM's CPU ``mcpu`` implies that this machine does not offer, as
    ``-feature`` ``mattr`` entries (empty where it lacks none, or cannot tell).

    LLVM names the host CPU from its family and model, and a virtual machine may hide some
    of that CPU's extensions: an AMD Zen 4 whose hypervisor masks AVX-512 is ``znver4`` to
    LLVM, and code built for ``znver4`` dies there of SIGILL at its first ``zmm``
    instruction. The flags the kernel reports are the truth about what runs."""
    flags = _host_cpu_flags()
    if not flags or "avx" not in flags and "sse2" not in flags:  # not an x86 cpuinfo
        return []
    from tvm.target import codegen

    try:
        implied = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    except Exception:  # noqa: BLE001 - an LLVM that cannot describe the CPU
        return []
    missing = sorted(str(f) for f in implied
                     if str(f).startswith(_SIMD_FEATURE_PREFIXES)
                     and _flag_key(str(f)) not in flags
                     and not (str(f) == "sha" and "shani" in flags))
    return [f"-{f}" for f in missing]


def host_target_config() -> dict:
    """This machine as an llvm target dict: LLVM's name for its CPU, the SIMD features that
    name implies but this machine lacks switched off (``host_missing_features``), and its
    usable cores."""
    from tvm.target import codegen

    mcpu = str(codegen.llvm_get_system_cpu())
    config: dict = {"kind": "llvm", "mcpu": mcpu}
    missing = host_missing_features(mcpu)
    if missing:
        config["mattr"] = missing
    config["num-cores"] = len(os.sched_getaffinity(0))
    return config
