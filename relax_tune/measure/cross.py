"""Targets of another instruction set: how a candidate is linked, and who can run it.

A candidate for this machine is linked into a ``.so`` by the host compiler. For a target whose
``mtriple`` names another architecture (``aarch64-linux-gnu`` on an x86 host) the host
compiler cannot link the object files, so the builder (``LocalBuilder(link=...)``) either

- cross-links with ``<triple>-gcc`` / ``<triple>-g++`` when one is on PATH (Debian:
  ``apt-get install gcc-aarch64-linux-gnu``), giving a ``.so`` the device loads as it is, or
- exports a ``.tar`` of the object files and lets the device link them: TVM's RPC server
  (``tvm.rpc.server.load_module`` -> ``tvm.runtime.load_module``) links an uploaded ``.tar``
  into a ``.so`` with the device's own compiler when it loads it (TVM's RPC flow).

Neither runs on this machine: ``LocalRunner.check_target`` refuses such targets, they are
measured through ``RPCRunner`` (``relax-tune tune --rpc HOST:PORT:KEY``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from typing import Any

import tvm

LINK_AUTO = "auto"
LINK_HOST = ""
LINK_TAR = "tar"

_ARCH_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}


@functools.lru_cache(maxsize=1)
def host_triple() -> str:
    """LLVM's triple of this machine (e.g. ``x86_64-pc-linux-gnu``)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())


def _arch(triple: str) -> str:
    arch = triple.split("-", 1)[0].lower()
    return _ARCH_ALIASES.get(arch, arch)


def target_triple(target: tvm.target.Target) -> str:
    """The ``mtriple`` the target's host code is compiled for ("" when it names none: this
    machine's). For a device target (cuda) that is its host's."""
    for t in (target, target.host):
        if t is not None and t.kind.name in ("llvm", "c"):
            return str(t.attrs.get("mtriple", "") or "")
    return ""


def is_foreign(target: tvm.target.Target) -> bool:
    """True when ``target``'s code is for another architecture than this machine's."""
    triple = target_triple(target)
    return bool(triple) and _arch(triple) != _arch(host_triple())


def find_cross_compiler(triple: str) -> str | None:
    """``<triple>-gcc`` or ``<triple>-g++`` on PATH (a 4-part triple is also tried without
    its vendor: ``aarch64-unknown-linux-gnu`` -> ``aarch64-linux-gnu-gcc``), else None."""
    parts = triple.split("-")
    names = [triple] + (["-".join([parts[0], *parts[2:]])] if len(parts) == 4 else [])
    for name in names:
        for tool in ("gcc", "g++"):
            path = shutil.which(f"{name}-{tool}")
            if path:
                return path
    return None


def link_mode(target: tvm.target.Target, link: str = LINK_AUTO) -> str:
    """How candidates for ``target`` are linked: ``LINK_HOST`` (""; the host compiler,
    a ``.so``), ``LINK_TAR`` ("tar"; an archive of object files the device links) or the
    path of a cross compiler (a ``.so`` for the device).

    ``link`` is ``LocalBuilder``'s option: "auto" picks the host compiler for this machine's
    architecture, else the matching cross compiler when one is found, else "tar"; "tar"
    always exports archives; any other string is the compiler that links."""
    if link != LINK_AUTO:
        return link
    if not is_foreign(target):
        return LINK_HOST
    return find_cross_compiler(target_triple(target)) or LINK_TAR


@functools.lru_cache(maxsize=1)
def _system_linker() -> str | None:
    """``ld`` on a Linux host (None elsewhere, or when it is not on PATH)."""
    return shutil.which("ld") if sys.platform.startswith("linux") else None


def _link_objects(output: str, objects: list[str], options: Any = None, **kwargs: Any) -> None:
    """``export_library``'s ``fcompile`` for a candidate of this machine: its object files
    linked into a ``.so`` by ``ld -shared`` itself, not through the compiler driver TVM
    calls (``g++ -shared``: 31 ms a candidate against 4 ms, Zen 3, a fifth of a build).
    What the kernels take from the C library (``expf``, ``memset``) resolves when the
    runner's process loads them, where the C library is already loaded. Anything but
    object files, or a failing ``ld``, goes to the compiler as before."""
    from tvm.support import cc

    linker = _system_linker()
    if linker is not None and all(str(obj).endswith(".o") for obj in objects):
        done = subprocess.run([linker, "-shared", "-o", output, *map(str, objects)],
                              capture_output=True, check=False)
        if done.returncode == 0:
            return
    cc.create_shared(output, objects, options, **kwargs)


def export(executable: Any, path: str, mode: str, candidate: bool = False) -> None:
    """``executable.export_library(path)`` linked as ``mode`` says (``link_mode``): a
    ``.tar`` path is archived, a ``.so`` path linked by the host compiler (a ``candidate``
    for this machine's runner by ``ld``, ``_link_objects``) or, for a compiler path, by
    that compiler."""
    if mode == LINK_TAR or path.endswith(".tar"):
        executable.export_library(path)
    elif mode == LINK_HOST:
        executable.export_library(path, fcompile=_link_objects if candidate else None)
    else:
        executable.export_library(path, cc=mode)


def describe(target: Any, mode: str) -> str:
    """A line for the log: what ``mode`` means for ``target``."""
    triple = target_triple(target) or host_triple()
    if mode == LINK_HOST:
        return f"linking candidates for {triple} with the host compiler"
    if mode == LINK_TAR:
        return (f"exporting candidates for {triple} as .tar archives of object files: the "
                "device links them when it loads them (TVM's RPC server does)")
    return f"linking candidates for {triple} with {mode}"
