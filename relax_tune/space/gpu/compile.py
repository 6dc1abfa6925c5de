"""Compiling CUDA candidates where there may be no GPU: the CUDA C source TVM generates,
turned into a cubin by nvcc for the target's architecture, and the choice of CUDA compiler
TVM uses when it loads a module on a GPU."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil

import tvm

from ...utils import RelaxTuneError

logger = logging.getLogger("relax_tune.space.gpu")


def _has_nvrtc_bindings() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):
        return False


def find_nvcc() -> str | None:
    """The nvcc executable (on PATH, under $CUDA_HOME/bin or /usr/local/cuda/bin), or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def ensure_cuda_compiler() -> str | None:
    """Make TVM compile CUDA modules with nvcc when its default, NVRTC through the
    ``cuda-bindings`` package, is not installed (TVM compiles a CUDA module's source when the
    module is loaded on a GPU). Sets ``TVM_CUDA_COMPILE_MODE`` unless the user did, before
    worker processes start so they inherit it; returns the mode in effect (None: neither
    compiler is available)."""
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE")
    if mode:
        return mode.lower()
    if _has_nvrtc_bindings():
        return "nvrtc"
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    if shutil.which("nvcc") is None:  # TVM looks nvcc up through CUDA_HOME
        os.environ.setdefault("CUDA_HOME", os.path.dirname(os.path.dirname(nvcc)))
    return "nvcc"


def _modules(root) -> list:
    """``root`` and every runtime module it imports, transitively."""
    out, stack = [], [root]
    while stack:
        mod = stack.pop()
        out.append(mod)
        stack.extend(mod.imports)
    return out


def cuda_source(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """The CUDA C source of the kernels of ``mod`` (scheduled TIR functions, or a whole
    Relax module) for ``target`` (code generation only: needs neither a GPU nor nvcc)."""
    if target.kind.name != "cuda":
        raise RelaxTuneError(f"cuda_source needs a cuda target, not {target.kind.name!r}")
    ex = tvm.compile(mod, target)
    sources = [m.inspect_source() for m in _modules(ex.mod) if m.kind == "cuda"]
    if not sources:
        raise RelaxTuneError("the module has no CUDA kernel: bind its loops to GPU threads")
    return "\n".join(sources)


def compile_cuda(mod: tvm.IRModule, target: tvm.target.Target, fmt: str = "cubin") -> bytes:
    """Compile the kernels of ``mod`` for the target's ``arch`` with nvcc and return the
    binary (``fmt``: "cubin" or "ptx"); raises RelaxTuneError when nvcc is missing or fails.
    One call compiles every function of ``mod``: batch candidates into one module (distinct
    function names) to pay nvcc's start-up once."""
    from tvm.support import nvcc as tvm_nvcc

    arch = str(target.attrs.get("arch", "")) if "arch" in target.attrs else ""
    if not arch:
        raise RelaxTuneError(f"target {target} names no 'arch'; use e.g. cuda_target('sm_80')")
    if find_nvcc() is None:
        raise RelaxTuneError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    code = cuda_source(mod, target)
    if shutil.which("nvcc") is None:
        os.environ.setdefault("CUDA_HOME", os.path.dirname(os.path.dirname(find_nvcc() or "")))
    try:
        with target:
            return bytes(tvm_nvcc.compile_cuda(code, target_format=fmt, arch=arch,
                                               compiler="nvcc"))
    except Exception as err:
        raise RelaxTuneError(f"nvcc could not compile the kernels for {arch}: "
                             f"{str(err).strip()[-2000:]}") from None
