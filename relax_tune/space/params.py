"""Per-target parameters of the design space, read from the target (never hard-coded).

The vector width comes from the target's ``mcpu``/``mattr`` (through LLVM's feature table),
the core count from the target attribute ``num-cores`` (default: the cores this process may
run on). Rules and postprocessors take a :class:`TargetParams` instead of a raw target.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tvm

logger = logging.getLogger("relax_tune.space")

# Annotation keys a sketch puts on the root block; the postprocessor turns them into loop
# kinds and loop pragmas on the concrete loop nest (tvm.compile ignores block annotations).
ANN_PARALLEL = "relax_tune.parallel"
"""Root-block annotation: the largest parallel extent worth fusing (int)."""
ANN_VECTORIZE = "relax_tune.vectorize"
"""Root-block annotation: the widest vectorised loop, in bytes of the written element (int)."""
ANN_UNROLL = "relax_tune.unroll_explicit"
"""Root-block annotation: ``pragma_auto_unroll_max_step`` for the outer loop (sampled int)."""
ANN_TILED = "relax_tune.tiling_structure"
"""Block annotation: the block has been multi-level tiled with this structure (e.g. "SSRSRS")."""
ANN_PACK = "relax_tune.pack_operands"
"""Block annotation: 1 when the postprocessor packs the block's reused inputs in the kernel
(a sampled choice; see ``operand_packing``)."""
ANN_WHOLE_LOOP = "relax_tune.whole_loop"
"""Block annotation: the position of a loop the multi-level tiling splits only inside the
tile levels where the write-back may go, so each of those tiles covers all of it (a
grouped convolution's channel within its group: ``group_axis``)."""

_AVX512_CPUS = ("avx512", "skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake",
                "sapphirerapids", "graniterapids", "emeraldrapids", "rocketlake", "znver4",
                "znver5", "x86-64-v4", "knl", "knm", "cannonlake", "alderlake-avx512")
_AVX_CPUS = ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
             "znver1", "znver2", "znver3", "bdver", "sandybridge", "ivybridge", "x86-64-v3",
             "core-avx", "btver2", "arrowlake", "lunarlake", "gracemont")


@dataclass(frozen=True)
class TargetParams:
    """What the CPU rules need to know about a target.

    Attributes:
        kind: the target kind name ("llvm", "cuda", ...).
        vector_bytes: width of one SIMD register in bytes (64 AVX-512, 32 AVX/AVX2, 16 else).
        num_cores: cores a kernel may run on in parallel.
        vector_registers: SIMD registers of the ISA (bounds useful register tiles).
        max_jobs_per_core: parallel jobs per core the parallel postprocessor aims for.
        jobs_per_core_choices: when several, the parallel budget is sampled among
            ``num_cores x`` each of them (a ``sample_categorical``).
        max_vector_registers_per_loop: the widest vectorised loop, in SIMD registers.
        spatial_vector_register_choices: for functions without a reduction (elementwise,
            layout and copy kernels), the vectorised loop's width is sampled among these
            register counts (the loop's width against its trip count is their one real knob
            besides the parallel grain, on every vector width).
        unroll_max_steps: candidates for ``pragma_auto_unroll_max_step``.
        max_innermost_spatial: largest innermost tile of a non-vectorised spatial axis.
        max_innermost_reduction: largest innermost tile of a reduction axis.
        max_innermost_generic: largest innermost tile of the vectorised axis when its extent
            is not a multiple of the vector lanes.
    """

    kind: str = "llvm"
    vector_bytes: int = 16
    num_cores: int = 1
    vector_registers: int = 16
    max_jobs_per_core: int = 16
    jobs_per_core_choices: tuple[int, ...] = (4, 16, 64)
    max_vector_registers_per_loop: int = 4
    spatial_vector_register_choices: tuple[int, ...] = (1, 4)
    unroll_max_steps: tuple[int, ...] = (0, 16, 64, 512)
    max_innermost_spatial: int = 8
    max_innermost_reduction: int = 16
    max_innermost_generic: int = 64

    @property
    def max_parallel_extent(self) -> int:
        """Target number of parallel jobs (cores x jobs per core)."""
        return self.num_cores * self.max_jobs_per_core

    @property
    def parallel_extent_choices(self) -> list[int]:
        """The parallel budgets to sample from (distinct, ascending; never empty)."""
        choices = sorted({self.num_cores * max(1, int(c)) for c in self.jobs_per_core_choices})
        return choices or [self.max_parallel_extent]

    @property
    def max_vectorize_bytes(self) -> int:
        """Bytes covered by the widest vectorised loop the postprocessor creates."""
        return self.vector_bytes * self.max_vector_registers_per_loop

    @property
    def spatial_vectorize_bytes_choices(self) -> list[int]:
        """The vector budgets (bytes) sampled for functions without a reduction (distinct,
        ascending; never empty)."""
        choices = sorted({self.vector_bytes * max(1, int(c))
                          for c in self.spatial_vector_register_choices})
        return choices or [self.max_vectorize_bytes]

    def lanes(self, dtype: str) -> int:
        """SIMD lanes of one register for elements of ``dtype`` (at least 1)."""
        return max(1, self.vector_bytes // dtype_bytes(dtype))


def dtype_bytes(dtype: str) -> int:
    """Bytes of one scalar element of ``dtype`` (at least 1; bool and int1 count as 1)."""
    try:
        dt = tvm.DataType(str(dtype))
        return max(1, (int(dt.bits) * max(1, int(dt.lanes)) + 7) // 8)
    except Exception:  # an exotic dtype string: assume 4 bytes
        return 4


def _attr(target: tvm.target.Target, key: str):
    try:
        attrs = target.attrs
        return attrs[key] if key in attrs else None
    except Exception:
        return None


def _has_features(target: tvm.target.Target, features: list[str]) -> bool | None:
    try:
        from tvm.target import codegen

        return bool(codegen.llvm_cpu_has_features(features, target))
    except Exception:
        return None


def _vector_bytes(target: tvm.target.Target) -> int:
    has512 = _has_features(target, ["avx512f"])
    if has512:
        return 64
    has_avx = _has_features(target, ["avx"])
    if has_avx:
        return 32
    if has512 is None and has_avx is None:  # LLVM could not answer: read the names
        mcpu = str(_attr(target, "mcpu") or "").lower()
        mattr = [str(a).lower() for a in (_attr(target, "mattr") or [])]
        if "+avx512f" in mattr or any(name in mcpu for name in _AVX512_CPUS):
            return 64
        if "+avx2" in mattr or "+avx" in mattr or any(name in mcpu for name in _AVX_CPUS):
            return 32
    return 16


def _default_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def target_params(target: tvm.target.Target) -> TargetParams:
    """The design-space parameters of ``target``: vector width from ``mcpu``/``mattr``,
    core count from the ``num-cores`` attribute (default: the usable cores of this host)."""
    kind = str(target.kind.name)
    cores = _attr(target, "num-cores")
    try:
        num_cores = int(cores) if cores is not None and int(cores) > 0 else _default_cores()
    except (TypeError, ValueError):
        num_cores = _default_cores()
    vbytes = _vector_bytes(target) if kind == "llvm" else 16
    params = TargetParams(kind=kind, vector_bytes=vbytes, num_cores=num_cores,
                          vector_registers=32 if vbytes >= 64 else 16)
    logger.debug("target params for %s: %s", target, params)
    return params
