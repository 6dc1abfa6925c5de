"""RPCRunner against a real tracker and two real servers on 127.0.0.1 (TVM's own CLI programs,
each in its own process group, killed by group at the end): tuning through them, results
spread over both servers, a server killed mid-batch, a hung (stopped) server, bad input."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from relax_tune import utils
from relax_tune.database import JSONDatabase
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import RPCRunner, parse_rpc_spec
from relax_tune.tuning.tune import tune_tasks
from relax_tune.utils import RelaxTuneError

from relax_tune.testing.rpc_cluster import LocalRPCCluster, free_port
from relax_tune.testing.workloads import matmul_mod



@pytest.fixture(scope="module")
def cluster(rpc_cluster):
    return rpc_cluster


@pytest.fixture(scope="module")
def builder(shared_builder):
    return shared_builder


def test_bad_input_gives_clear_errors():
    with pytest.raises(RelaxTuneError, match="host:port"):
        RPCRunner("localhost", "k")
    with pytest.raises(RelaxTuneError, match="host:port:key"):
        parse_rpc_spec("127.0.0.1:9190")
    assert parse_rpc_spec("127.0.0.1:9190:cpu") == ("127.0.0.1:9190", "cpu")
    with pytest.raises(RelaxTuneError, match="cannot reach the RPC tracker"):
        RPCRunner(f"127.0.0.1:{free_port()}", "k")


def test_runs_spread_over_both_servers_and_match_local(cluster, builder, target,
                                                       shared_runner):
    mod = matmul_mod(64)
    info = utils.args_info(mod)
    builds = builder.build(mod, target, [None] * 6)
    arts = [b.artifact_path for b in builds]
    with RPCRunner(cluster.tracker, cluster.key, session_timeout_sec=60) as runner:
        results = runner.run(arts + [None], info, target)
        assert len(results) == 7 and results[-1].error == "not built"
        assert all(r.ok and r.mean_secs > 0 for r in results[:-1]), results
        devices = {r.device for r in results[:-1]}
        assert devices == {f"rt-test@127.0.0.1:{p}" for p in cluster.server_ports}
        remote = runner.run_and_fetch(arts[0], info, target, seed=5)
    here = shared_runner.run_and_fetch(arts[0], info, target, seed=5)
    assert len(remote) == len(here) == 3  # A, B and C after the call
    for a, b in zip(remote, here):  # same seeded inputs, same outputs
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert cluster.free() == 2  # every session released


def test_packed_weight_candidates_run_remotely(cluster, builder, target):
    """A candidate that packs its weight: the RPC runner packs once on the server, times
    the kernel, and fetches outputs equal to numpy's on the original-layout inputs."""
    from relax_tune.measure.prepack import read_plan
    from relax_tune.search import ReplaySearch

    mod = utils.normalize_mod(matmul_mod(64)["main"].with_attr("layout_free_buffers", [1]))
    cand = ReplaySearch(mod, target, seed=3).next_candidates(1)[0]
    art = builder.build(mod, target, [cand.trace_json])[0].artifact_path
    assert read_plan(art) is not None  # built as kernel + packing function
    info = utils.args_info(mod)
    with RPCRunner(cluster.tracker, cluster.key, session_timeout_sec=60) as runner:
        result = runner.run([art], info, target)[0]
        assert result.ok, result.error
        a, b, c = runner.run_and_fetch(art, info, target, seed=5)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)
    assert cluster.free() == 2


def test_head_to_head_runs_on_one_server(cluster, builder, target):
    """A head-to-head through the RPC runner: every run of both kernels, all rounds, in one
    session on one server, one after another (``run`` would spread them over both servers,
    timed at once); the ratios still tell the untuned kernel from the tiled one."""
    from relax_tune.measure.head_to_head import head_to_head
    from relax_tune.testing.workloads import tiled_matmul_trace

    mod = matmul_mod(128)
    info = utils.args_info(mod)
    fast, slow = (b.artifact_path for b in builder.build(
        mod, target, [tiled_matmul_trace(mod, k_inside_rows=False), None]))
    seen: list = []

    class Recording(RPCRunner):
        def run(self, *args, **kwargs):  # a head-to-head must not come through here
            raise AssertionError("head-to-head went through run()")

        def run_on_one_device(self, *args, **kwargs):
            results = super().run_on_one_device(*args, **kwargs)
            seen.extend(results)
            return results

    with Recording(cluster.tracker, cluster.key, number=2, repeat=2) as runner:
        assert not runner.one_device and runner.can_fetch and not runner.can_time_and_fetch
        sessions = runner.stats["sessions"]
        ratios = head_to_head(runner, fast, slow, info, target, rounds=3)
        assert ratios is not None and len(ratios) == 3 and min(ratios) > 1, ratios
        assert runner.stats["sessions"] == sessions + 1  # one session for all six runs
        assert len(seen) == 6 and all(r.ok for r in seen), seen
        devices = {r.device for r in seen}
        assert len(devices) == 1 and devices <= {f"rt-test@127.0.0.1:{p}"
                                                 for p in cluster.server_ports}, devices
        # a library that is not there fails alone, the others are still timed
        mixed = runner.run_on_one_device([fast, "/nonexistent.so", None], info, target)
        assert mixed[0].ok and not mixed[1].ok and mixed[2].error == "not built"
        assert head_to_head(runner, fast, "/nonexistent.so", info, target, rounds=1) is None
    assert cluster.free() == 2


def test_tuning_completes_through_rpc(cluster, builder, target, tmp_path):
    mod = matmul_mod(32)
    tasks = extract_tasks(mod, target)
    work = str(tmp_path / "work")
    with RPCRunner(cluster.tracker, cluster.key) as runner:
        reports = tune_tasks(tasks, work, max_trials_global=8, num_trials_per_iter=4,
                             builder=builder, runner=runner)
    assert reports[0].trials == 8 and reports[0].best_secs is not None
    db = JSONDatabase(work_dir=work)
    assert len(db) == 9  # 8 trials + baseline
    best = db.query_tuning_record(mod, target)  # what ApplyDatabase takes: the report's
    assert best.is_valid and best.mean_run_secs == pytest.approx(reports[0].applied_secs)
    assert cluster.free() == 2


def _group_members(pgid: int) -> set[int]:
    """Pids of the processes in the process group ``pgid`` now (read from /proc)."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            members.add(int(entry))
    return members


def _kill_when_busy(cluster: LocalRPCCluster, victim, sig: int, log: list,
                    settle_sec: float = 0.2) -> threading.Thread:
    """Send ``sig`` to ``victim`` once both servers are in a session and the victim's session
    process (TVM's server forks one per session) has lived ``settle_sec``: a server between
    two sessions also counts as not free, and a session process lingers a moment after its
    result is sent; killing it at either point would lose no candidate."""
    idle = _group_members(victim.pid)

    def watch() -> None:
        deadline = time.monotonic() + 60
        seen: dict[int, float] = {}
        while time.monotonic() < deadline:
            now = time.monotonic()
            children = _group_members(victim.pid) - idle
            seen = {pid: seen.get(pid, now) for pid in children}
            if cluster.free() == 0 and any(now - t0 >= settle_sec for t0 in seen.values()):
                LocalRPCCluster.kill(victim, sig)
                log.append(now)
                return
            time.sleep(0.02)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fault", ["killed", pytest.param("hung", marks=pytest.mark.slow)])
def test_server_lost_mid_batch(builder, target, fault):
    """One of two servers is SIGKILLed (or SIGSTOPped: hangs) while both are measuring: its
    candidate is retried on the other one, and every candidate gets a result."""
    # untuned, 60 calls a candidate: 0.7 s (Zen 4) and more per session, so a kill 0.2 s into
    # a session lands before its result is sent
    mod = matmul_mod(256)
    info = utils.args_info(mod)
    arts = [b.artifact_path for b in builder.build(mod, target, [None] * 4)]
    with LocalRPCCluster(n_servers=2, key=f"rt-{fault}") as c:
        victim, survivor = c.servers[0], c.server_ports[1]
        sig = signal.SIGKILL if fault == "killed" else signal.SIGSTOP
        # a short session limit bounds the wait on the hung server
        with RPCRunner(c.tracker, c.key, number=20, repeat=3, session_timeout_sec=6,
                       request_timeout_sec=6) as runner:
            killed: list = []
            watcher = _kill_when_busy(c, victim, sig, killed)
            start = time.monotonic()
            results = runner.run(arts, info, target)
            wall = time.monotonic() - start
            watcher.join(timeout=5)
            assert killed, "both servers were never busy at once"
            assert len(results) == len(arts)
            assert all(r.ok for r in results), [r.error for r in results]
            assert runner.stats["retries"] >= 1
            assert wall < 60
            # the next batch runs on the survivor alone
            again = runner.run(arts[:1], info, target)
            assert all(r.ok and r.device.endswith(f":{survivor}") for r in again)
        if fault == "hung":
            LocalRPCCluster.kill(victim, signal.SIGCONT)


def test_no_server_under_key_fails_candidates_in_bounded_time(cluster, builder, target):
    mod = matmul_mod(16)
    art = builder.build(mod, target, [None])[0].artifact_path
    with RPCRunner(cluster.tracker, "no-such-key", request_timeout_sec=1) as runner:
        start = time.monotonic()
        (res,) = runner.run([art], utils.args_info(mod), target)
        assert not res.ok and "no RPC server registered under key 'no-such-key'" in res.error
        assert time.monotonic() - start < 10


def test_cli_rpc_spec_makes_a_working_runner(cluster, builder, target):
    from relax_tune.cli import commands as cli

    make = cli.make_rpc_runner
    mod = matmul_mod(16)
    art = builder.build(mod, target, [None])[0].artifact_path
    runner = make(f"{cluster.tracker}:{cluster.key}")
    try:
        (res,) = runner.run([art], utils.args_info(mod), target)
        assert res.ok and res.device.startswith(cluster.key + "@127.0.0.1:")
    finally:
        runner.shutdown()
