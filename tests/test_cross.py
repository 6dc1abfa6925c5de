"""Targets of another instruction set (``measure/cross.py``): candidates for aarch64 built on
this x86 machine are cross-linked by ``aarch64-linux-gnu-gcc`` (the library's ELF machine is
AArch64) or, without a cross compiler, exported as ``.tar`` archives of object files that the
device links when it loads them; the loopback RPC test times such an archive on a real RPC
server, which links it itself (TVM's RPC flow); the local runner refuses a foreign target.

The cross-compiler test needs Debian's ``gcc-aarch64-linux-gnu`` and is skipped without it.
"""

from __future__ import annotations

import shutil
import tarfile

import numpy as np
import pytest

from relax_tune import utils
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import LocalBuilder, LocalRunner, RPCRunner, cross
from relax_tune.tuning.tune import tune_tasks
from relax_tune.utils import RelaxTuneError

from relax_tune.testing.workloads import matmul_mod, tiled_matmul_trace

AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "num-cores": 4}
EM_AARCH64 = 183
EM_X86_64 = 62

pytestmark = pytest.mark.skipif(not cross.is_foreign(utils.parse_target(AARCH64)),
                                reason="this machine is aarch64: nothing is foreign to it")


def elf_machine(data: bytes) -> int:
    """``e_machine`` of an ELF header (little-endian: both machines here are)."""
    assert data[:4] == b"\x7fELF", data[:4]
    return int.from_bytes(data[18:20], "little")


def archive_members(path: str) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.fixture(scope="module")
def matmul():
    mod = matmul_mod(64)
    return mod, tiled_matmul_trace(mod)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None
                    and shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler: apt-get install gcc-aarch64-linux-gnu")
def test_aarch64_candidate_is_cross_linked_into_an_aarch64_library(matmul):
    mod, trace = matmul
    with LocalBuilder(max_workers=1) as builder:
        assert builder.link_mode(AARCH64).endswith(("aarch64-linux-gnu-gcc",
                                                    "aarch64-linux-gnu-g++"))
        results = builder.build(mod, AARCH64, [trace, None])
        for res in results:
            assert res.ok, res.error
            assert res.artifact_path.endswith(".so")
            with open(res.artifact_path, "rb") as f:
                assert elf_machine(f.read(64)) == EM_AARCH64


def test_without_a_cross_compiler_the_artifact_is_an_archive_of_objects(matmul,
                                                                         shared_builder):
    """An Android phone's triple (no aarch64-linux-android-gcc here: its NDK is not
    installed), and the archive mode forced by the builder option for aarch64-linux-gnu."""
    mod, trace = matmul
    android = dict(AARCH64, mtriple="aarch64-linux-android")
    assert cross.find_cross_compiler("aarch64-linux-android") is None
    auto = shared_builder  # link="auto", the default
    with LocalBuilder(max_workers=1, link="tar") as forced:
        assert auto.link_mode(android) == "tar"
        assert auto.link_mode(utils.host_target()) == ""  # this machine: linked as ever
        results = auto.build(mod, android, [trace]) + forced.build(mod, AARCH64, [trace])
        for res in results:
            assert res.ok, res.error
            assert res.artifact_path.endswith(".tar")
            members = archive_members(res.artifact_path)
            assert members and all(name.endswith(".o") for name in members), list(members)
            assert {elf_machine(data) for data in members.values()} == {EM_AARCH64}


def test_foreign_target_is_refused_by_the_local_runner(matmul, target, tmp_path):
    with LocalRunner() as runner, LocalBuilder(max_workers=1) as builder:
        runner.check_target(target)  # this machine's target: fine
        with pytest.raises(RelaxTuneError, match=r"aarch64-linux-gnu.*cannot run here.*--rpc"):
            runner.check_target(AARCH64)
        # tuning stops before any work, with the same message
        tasks = extract_tasks(matmul[0], AARCH64)
        with pytest.raises(RelaxTuneError, match="--rpc"):
            tune_tasks(tasks, str(tmp_path / "work"), max_trials_global=2, builder=builder,
                       runner=runner)


def test_device_side_link_through_a_loopback_rpc_server(target, tmp_path, rpc_cluster):
    """The archive mode forced for this machine's own target: the RPC server links each
    uploaded .tar with its own compiler when it loads it; candidates run, get valid times
    and compute A @ B; tuning through it completes."""
    mod = matmul_mod(64)
    info = utils.args_info(mod)
    cluster = rpc_cluster
    with LocalBuilder(max_workers=1, link="tar") as builder, \
            RPCRunner(cluster.tracker, cluster.key, session_timeout_sec=60) as runner:
        results = builder.build(mod, target, [tiled_matmul_trace(mod), None])
        arts = [r.artifact_path for r in results]
        assert all(r.ok and a.endswith(".tar") for r, a in zip(results, arts)), results
        assert {elf_machine(d) for d in archive_members(arts[0]).values()} == {EM_X86_64}
        timed = runner.run(arts, info, target)
        assert all(r.ok and 0 < r.mean_secs < 1 for r in timed), [r.error for r in timed]
        assert timed[0].device.startswith(f"{cluster.key}@127.0.0.1:")
        a, b, c = runner.run_and_fetch(arts[0], info, target, seed=3)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)

        small = matmul_mod(32)
        work = str(tmp_path / "work")
        reports = tune_tasks(extract_tasks(small, target), work, max_trials_global=4,
                             num_trials_per_iter=4, builder=builder, runner=runner)
        assert reports[0].trials == 4 and reports[0].best_secs is not None
        assert reports[0].baseline_secs is not None  # the untuned function ran too
        assert cluster.free() == len(cluster.servers)  # every session released


def test_cli_compile_for_aarch64(tmp_path, capsys):
    """``relax-tune compile --target <aarch64>``: a library linked by the cross compiler, or,
    for a triple without one, a clear error for ``-o model.so`` and an archive for ``.tar``."""
    import json
    import textwrap

    from relax_tune.cli import commands as cli
    from relax_tune.database import JSONDatabase

    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent("""
        from relax_tune.demo import demo_model

        def mlp():
            return demo_model()[0]
    """))
    work = str(tmp_path / "work")
    JSONDatabase(work_dir=work)  # an empty database: nothing tuned, every kernel untuned
    android = dict(AARCH64, mtriple="aarch64-linux-android")

    def compile_to(target: dict, out: str) -> tuple[int, str]:
        code = cli.main(["compile", f"{model}:mlp", "--work-dir", work, "-o",
                         str(tmp_path / out), "--target", json.dumps(target)])
        return code, capsys.readouterr().err

    code, err = compile_to(android, "phone.so")
    assert code == 2 and "no aarch64-linux-android-gcc" in err and "model.tar" in err, err
    assert compile_to(android, "phone.tar") == (0, "")
    members = archive_members(str(tmp_path / "phone.tar"))
    assert {elf_machine(data) for data in members.values()} == {EM_AARCH64}
    if cross.find_cross_compiler("aarch64-linux-gnu") is None:
        pytest.skip("no aarch64 cross compiler: apt-get install gcc-aarch64-linux-gnu")
    assert compile_to(AARCH64, "board.so") == (0, "")
    with open(tmp_path / "board.so", "rb") as f:
        assert elf_machine(f.read(64)) == EM_AARCH64
