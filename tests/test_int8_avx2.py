"""Int8 kernels on CPUs without AVX-512 (issue 45): AVX2's ``vpmaddwd`` on s16-widened
weights, and AVX-VNNI's 256-bit ``vpdpbusd``, chosen from the target's features.

The targets are cross-compiled (``mcpu=znver3``: AVX2 only; ``mcpu=alderlake``: AVX2 and
AVX-VNNI, no AVX-512) on any x86 host; their kernels also run on a host that has the
instructions (AVX2 / AVX-VNNI), where they must give the untuned function's integers: the
``vpmaddwd`` sequence is exact for full-range u8 x s8 operands (``vpmaddubsw`` is not: it
saturates pairs of products in s16, see ``int8_intrin``). The tuner measuring them:
``test_int8.py::test_tuning_measures_the_tensorized_kernel``.
"""

import re

import numpy as np
import pytest
import tvm
from tvm.target import codegen

from relax_tune.space import generate_design_space, space_for_target, without_decisions
from relax_tune.space.cpu.int8_intrin import (AVX2_8X2, AVXVNNI_8X4, dot_instruction,
                                              int8_dot_intrinsic)
from relax_tune.testing.int8_kernels import integer_kernel, kernel_asm, run_kernel
from relax_tune.utils import host_target

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
AVXVNNI = tvm.target.Target({"kind": "llvm", "mcpu": "alderlake", "num-cores": 2})
TARGETS = {"avx2": (AVX2, AVX2_8X2), "avxvnni": (AVXVNNI, AVXVNNI_8X4)}


def _host_runs(target: tvm.target.Target) -> bool:
    """Whether this host has every int8 feature ``target`` is scheduled for."""
    host = host_target()
    return all(codegen.target_has_features(f, host) for f in ("avx2", "avxvnni")
               if codegen.target_has_features(f, target))


def _candidate(mod: tvm.IRModule, target: tvm.target.Target, seed: int) -> tvm.IRModule:
    (sketch,) = generate_design_space(mod, target)
    candidate = space_for_target(target).replay(mod, without_decisions(sketch), seed=seed)
    assert candidate.error is None, candidate.error
    return candidate.sch.mod


@pytest.mark.parametrize("isa", list(TARGETS))
@pytest.mark.parametrize("kind", ["matmul", "conv2d"])
def test_kernels_use_the_instruction_and_give_the_same_integers(isa, kind):
    target, name = TARGETS[isa]
    assert int8_dot_intrinsic(target) == name
    mod = integer_kernel(kind, target, zero_point=5 if kind == "conv2d" else None)
    scheduled = _candidate(mod, target, seed=11)
    asm = kernel_asm(scheduled, target)
    assert dot_instruction(name).mnemonic in asm
    assert "zmm" not in asm  # no AVX-512 register
    if isa == "avx2":
        assert "vpdpbusd" not in asm and "vpmaddubsw" not in asm
        assert re.search(r"vpmaddwd\t[^\n]*%ymm", asm)  # on 256 bits
    else:
        assert re.search(r"vpdpbusd\t[^\n]*%ymm", asm)  # VEX-encoded: no AVX-512 here
    if not _host_runs(target):
        pytest.skip(f"this CPU cannot run {isa} code")
    np.testing.assert_array_equal(run_kernel(scheduled, target), run_kernel(mod, target))


def test_widened_weights_are_packed_as_int16():
    scheduled = _candidate(integer_kernel("matmul", AVX2), AVX2, seed=12)
    assert '"int16"' in scheduled.script()  # the packed weight buffer
    assert "meta_schedule.layout_rewrite_preproc" in scheduled.script()
