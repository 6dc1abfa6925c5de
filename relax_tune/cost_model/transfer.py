"""Features that transfer across workloads and CPUs, for the pre-trained cost model.

The raw program features (``features.extract_features``) mix what a schedule chose with what
the workload is: a 1024-cube matmul has more iterations, more traffic and bigger footprints
than a 64-cube one whatever the schedule. A model trained on other workloads ranks the
candidates of a new one better when it sees, besides the raw vector:

- the vector centred on its task (minus the task's reference vector, the median of the
  first candidates the model saw for that task): what this schedule does differently from
  the task's typical candidate;
- what the target says about the machine (``target_facts``): vector width, cores, cache
  sizes, and the schedule's vector width, parallelism and footprints relative to them.

``transfer_features(raw, reference, facts)`` builds that vector; the training script and the
model in tuning call the same function, so they agree by construction.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from .features import N_FEATURES, feature_names

TRANSFER_VERSION = 1
"""Bumped whenever ``transfer_features`` changes (the shipped model records it)."""

FACT_NAMES = ("vector_bytes", "num_cores", "l1_bytes", "l2_bytes", "l3_bytes")

_DEFAULT_CACHES = (32 * 1024, 1024 * 1024, 32 * 1024 * 1024)
_NAMES = feature_names()
_IDX = {n: i for i, n in enumerate(_NAMES)}


@functools.lru_cache(maxsize=1)
def host_caches() -> tuple[int, int, int]:
    """L1 data, L2 and L3 cache sizes in bytes of this machine (Linux sysfs; typical sizes
    where it cannot be read)."""
    sizes = dict(zip((1, 2, 3), _DEFAULT_CACHES))
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                level = int(f.read())
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
            if kind == "Instruction" or level not in sizes:
                continue
            mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
            sizes[level] = int(text.rstrip("KMG")) * mult
    except (OSError, ValueError):
        pass
    return sizes[1], sizes[2], sizes[3]


def target_facts(target) -> dict[str, float]:
    """What ``target`` says about the machine: SIMD width in bytes and cores (from the
    target, ``space.params.target_params``), and cache sizes (this machine's when the target
    is for the host CPU, typical x86 sizes otherwise)."""
    from ..space.params import target_params

    params = target_params(target)
    caches = _DEFAULT_CACHES
    try:
        from tvm.target import codegen

        mcpu = str(target.attrs.get("mcpu", "")) if hasattr(target, "attrs") else ""
        if not mcpu or mcpu == str(codegen.llvm_get_system_cpu()):
            caches = host_caches()
    except Exception:  # a target without attrs, or no LLVM: typical sizes
        pass
    return {"vector_bytes": float(params.vector_bytes), "num_cores": float(params.num_cores),
            "l1_bytes": float(caches[0]), "l2_bytes": float(caches[1]),
            "l3_bytes": float(caches[2])}


def _log2(x: np.ndarray | float) -> np.ndarray:
    return np.log2(1.0 + np.maximum(np.asarray(x, dtype=np.float64), 0.0))


def _relative(raw: np.ndarray, facts: dict[str, float]) -> np.ndarray:
    """The schedule's choices relative to the machine (columns of ``relative_names``)."""
    cols = []
    vec_lanes = 2.0 ** raw[:, _IDX["top_log_vector"]] - 1.0  # elements of the vector loop
    vec_bytes = vec_lanes * 4.0  # float32 workloads (the corpus): bytes of the vector loop
    cols.append(np.log2(np.maximum(vec_bytes, 1.0) / facts["vector_bytes"]))
    par = 2.0 ** raw[:, _IDX["top_log_parallel"]] - 1.0
    cols.append(np.log2(np.maximum(par, 1.0) / facts["num_cores"]))
    cols.append((par >= facts["num_cores"]).astype(np.float64))
    for prefix in ("top", "mean"):
        fp = raw[:, _IDX[f"{prefix}_log_total_footprint"]]
        for name in ("l1_bytes", "l2_bytes", "l3_bytes"):
            cols.append(fp - math.log2(1.0 + facts[name]))
        reg = raw[:, _IDX[f"{prefix}_log_register_tile"]]
        cols.append(reg - math.log2(1.0 + facts["vector_bytes"] / 4.0))
    return np.stack(cols, axis=1)


def relative_names() -> list[str]:
    """Names of the machine-relative columns."""
    names = ["vector_over_width", "parallel_over_cores", "parallel_covers_cores"]
    for prefix in ("top", "mean"):
        names += [f"{prefix}_footprint_over_{c}" for c in ("l1", "l2", "l3")]
        names.append(f"{prefix}_register_tile_over_lanes")
    return names


def transfer_names() -> list[str]:
    """Names of the columns ``transfer_features`` returns, in order."""
    return (list(_NAMES) + [f"task_{n}" for n in _NAMES] + [f"fact_{n}" for n in FACT_NAMES]
            + relative_names())


N_TRANSFER = len(transfer_names())


def task_reference(raw: np.ndarray) -> np.ndarray:
    """A task's reference vector: the per-column median of its candidates' raw features."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, N_FEATURES)
    if len(raw) == 0:
        return np.zeros(N_FEATURES)
    return np.median(raw, axis=0)


def transfer_features(raw: np.ndarray, reference: np.ndarray,
                      facts: dict[str, float]) -> np.ndarray:
    """``[raw, raw - reference, log2 facts, machine-relative columns]`` for every row of
    ``raw`` (``len(raw) x N_TRANSFER``, float32)."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, N_FEATURES)
    ref = np.asarray(reference, dtype=np.float64).reshape(1, N_FEATURES)
    fact_row = np.asarray([_log2(facts[n]) for n in FACT_NAMES], dtype=np.float64)
    parts = [raw, raw - ref, np.repeat(fact_row[None, :], len(raw), axis=0), _relative(raw, facts)]
    return np.concatenate(parts, axis=1).astype(np.float32)
