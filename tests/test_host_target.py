"""host_target: code built for it runs on this machine, also where a virtual machine hides
extensions of the CPU LLVM names (a Zen 4 guest without AVX-512 is ``znver4`` to LLVM)."""

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.target import codegen

from relax_tune import host_cpu, utils


def _cpuinfo_flags() -> set[str]:
    flags = host_cpu._host_cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this machine")
    return set(flags)


def test_host_target_offers_only_simd_features_this_machine_lists():
    flags = _cpuinfo_flags()
    target = utils.host_target()
    offered = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    simd = {f for f in offered if f.startswith(host_cpu._SIMD_FEATURE_PREFIXES)}
    beyond = {f for f in simd if host_cpu._flag_key(f) not in flags
              and not (f == "sha" and "shani" in flags)}
    assert not beyond, f"{target} offers {sorted(beyond)}, which /proc/cpuinfo does not list"


def test_a_cpu_with_more_extensions_than_this_machine_loses_exactly_those():
    flags = _cpuinfo_flags()
    missing = host_cpu.host_missing_features("sapphirerapids")
    implied = {str(f) for f in codegen.llvm_get_cpu_features(
        tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))}
    assert all(m.startswith("-") and m[1:] in implied for m in missing)
    # each one switched off is absent here, each SIMD one kept is present
    assert all(host_cpu._flag_key(m[1:]) not in flags for m in missing)
    kept = ({f for f in implied if f.startswith(host_cpu._SIMD_FEATURE_PREFIXES)}
            - {m[1:] for m in missing})
    assert all(host_cpu._flag_key(f) in flags or f == "sha" for f in kept)
    if "avx512f" not in flags:
        assert "-avx512f" in missing


def test_a_vectorised_kernel_built_for_the_host_target_runs_here():
    n = 256
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0 + 1.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    _, inner = sch.split(i, [None, 16])
    sch.vectorize(inner)
    lib = tvm.compile(sch.mod, target=utils.host_target())
    x = np.arange(n, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(n, dtype="float32"))
    lib["main"](tvm.runtime.tensor(x), out)  # SIGILL here if the target overreached
    np.testing.assert_allclose(out.numpy(), x * 2 + 1)
    if "avx512f" not in _cpuinfo_flags():
        assert "zmm" not in lib.mod.inspect_source("asm")


def test_records_of_the_same_cpu_name_with_other_features_do_not_apply():
    full = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    hidden = dict(full, mattr=["-avx512f", "-avx512vnni"])
    assert not utils.target_compatible(full, hidden)
    assert not utils.target_compatible(hidden, full)
    assert utils.target_compatible(hidden, dict(hidden, mattr=["-avx512vnni", "-avx512f"]))
    assert utils.target_compatible(dict(full, **{"num-cores": 4}), full)
    assert utils.target_compatible({"kind": "llvm"}, hidden)  # no CPU named: anything
