"""Measurement at scale: tuning throughput through 1 vs 2 RPC servers (tracker and servers on
127.0.0.1), and how much a concurrent build disturbs a local timing (why builds are not
overlapped with local measurement). Prints medians and ratios; run with the machine's load noted.

    python -m benchmarks.measure_scale [--trials 24]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from relax_tune import utils
from relax_tune.tuning.extract import extract_tasks
from relax_tune.measure import LocalBuilder, LocalRunner, RPCRunner
from relax_tune.testing.rpc_cluster import LocalRPCCluster
from relax_tune.testing.workloads import matmul_mod as matmul
from relax_tune.tuning.tune import tune_tasks


def rpc_throughput(n_servers: int, trials: int, target) -> float:
    """Trials per second tuning a 128^3 matmul through ``n_servers`` servers."""
    tasks = extract_tasks(matmul(128), target)
    with LocalRPCCluster(n_servers=n_servers, key=f"bench{n_servers}") as cluster, \
            LocalBuilder() as builder, \
            RPCRunner(cluster.tracker, cluster.key, number=10, repeat=3) as runner:
        runner.run([builder.build(tasks[0].mod, target, [None])[0].artifact_path],
                   utils.args_info(tasks[0].mod), target)  # warm the session workers
        with tempfile.TemporaryDirectory() as work:
            start = time.perf_counter()
            tune_tasks(tasks, work, max_trials_global=trials, num_trials_per_iter=8,
                       builder=builder, runner=runner, progress_bar=False)
            wall = time.perf_counter() - start
        print(f"  {n_servers} server(s): {trials} trials in {wall:.1f} s, "
              f"{trials / wall:.2f} trials/s, sessions {runner.stats}")
    return trials / wall


def overlap_disturbance(target, reps: int = 15) -> tuple[float, float]:
    """Median time of one kernel timed quietly and while the builder compiles a batch."""
    mod = matmul(256)
    info = utils.args_info(mod)
    with LocalBuilder() as builder, LocalRunner(number=5, repeat=3) as runner:
        art = builder.build(mod, target, [None])[0].artifact_path
        quiet = [runner.run([art], info, target)[0].mean_secs for _ in range(reps)]
        busy: list[float] = []
        stop = threading.Event()

        def build_loop() -> None:
            other = matmul(192)
            while not stop.is_set():
                builder.build(other, target, [None] * builder.max_workers)

        thread = threading.Thread(target=build_loop)
        thread.start()
        time.sleep(1.0)
        busy = [runner.run([art], info, target)[0].mean_secs for _ in range(reps)]
        stop.set()
        thread.join()
    return statistics.median(quiet), statistics.median(busy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=24)
    args = parser.parse_args()
    target = utils.host_target()
    print("load:", open("/proc/loadavg").read().strip())
    quiet, busy = overlap_disturbance(target)
    print(f"local timing of a 256^3 matmul: quiet {quiet * 1e3:.3f} ms, during builds "
          f"{busy * 1e3:.3f} ms ({busy / quiet:.2f}x)")
    one = rpc_throughput(1, args.trials, target)
    two = rpc_throughput(2, args.trials, target)
    print(f"RPC tuning throughput: 1 server {one:.2f} trials/s, 2 servers {two:.2f} trials/s "
          f"({two / one:.2f}x)")
    print("load:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
