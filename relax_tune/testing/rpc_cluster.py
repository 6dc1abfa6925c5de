"""A real RPC tracker and servers on 127.0.0.1, started as TVM's own command-line programs in
their own process groups (stopping a group stops the session processes too; SIGTERM to the
CLI alone leaves its popen worker listening). Used by the RPC tests and
benchmarks/measure_scale.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import tvm

from relax_tune.measure.worker_pool import TORCHLESS_DIR

HOST = "127.0.0.1"  # loopback only: nothing here ever talks to another machine


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((HOST, port)) == 0


class LocalRPCCluster:
    """A tracker and ``n_servers`` servers under ``key`` on 127.0.0.1 (context manager).

    Each server process is limited to ``threads`` TVM threads so that servers sharing this
    machine do not fight over its cores, and its threads are left unpinned
    (``relax_tune.utils.ensure_tvm_threads``: TVM pins each process's threads from the
    first core on, so every server's would share the same cores)."""

    def __init__(self, n_servers: int = 2, key: str = "rt-test", threads: int = 1,
                 start_timeout: float = 60.0) -> None:
        self.key = key
        self.tracker_port = free_port()
        self.servers: list[subprocess.Popen] = []
        self.server_ports: list[int] = []
        self._procs: list[subprocess.Popen] = []
        env = dict(os.environ, TVM_NUM_THREADS=str(threads))
        env.setdefault("TVM_BIND_THREADS", "0")
        # without PyTorch, as the measurement workers: TVM's FFI imports it where it is
        # installed, 2.5 s of the 8 s each of these processes (and each server's popen
        # worker after it) takes to start on a Zen 3
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [TORCHLESS_DIR,
                                                          env.get("PYTHONPATH")]))
        self._env = env
        self._tracker = self._start(["tvm.exec.rpc_tracker", "--host", HOST, "--port",
                                     str(self.tracker_port), "--port-end",
                                     str(self.tracker_port + 1), "--silent"])
        # the servers start beside the tracker, not after it (each process spends its start
        # importing TVM; a server retries its tracker)
        for _ in range(n_servers):
            self.add_server()
        deadline = time.monotonic() + start_timeout
        while not _listening(self.tracker_port):
            if time.monotonic() > deadline or self._tracker.poll() is not None:
                self.stop()
                raise RuntimeError("the RPC tracker did not start")
            time.sleep(0.1)
        self.wait_for(n_servers, deadline)

    @property
    def tracker(self) -> str:
        """``host:port`` of the tracker."""
        return f"{HOST}:{self.tracker_port}"

    def _start(self, args: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", *args], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=self._env)
        self._procs.append(proc)
        return proc

    def add_server(self) -> subprocess.Popen:
        """Start one more server under the key."""
        port = free_port()
        proc = self._start(["tvm.exec.rpc_server", "--host", HOST, "--port", str(port),
                            "--port-end", str(port + 1), "--tracker", self.tracker,
                            "--key", self.key])
        self.servers.append(proc)
        self.server_ports.append(port)
        return proc

    def summary(self) -> dict:
        """The tracker's summary (queue and server info)."""
        client = tvm.rpc.connect_tracker(HOST, self.tracker_port)
        try:
            return client.summary()
        finally:
            client.close()

    def registered(self) -> int:
        """Servers registered under the key now."""
        return sum(1 for s in self.summary()["server_info"]
                   if s.get("key") == "server:" + self.key)

    def free(self) -> int:
        """Servers under the key that are free (not in a session) now."""
        return int(self.summary()["queue_info"].get(self.key, {}).get("free", 0))

    def wait_for(self, n: int, deadline: float) -> None:
        """Wait until ``n`` servers are registered and free."""
        while not (self.registered() >= n and self.free() >= n):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{n} RPC servers did not register in time")
            time.sleep(0.2)

    @staticmethod
    def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``proc``'s whole process group (its session processes included)."""
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Kill every process group this cluster started and reap them."""
        for proc in self._procs:
            self.kill(proc)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "LocalRPCCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
