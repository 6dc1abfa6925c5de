"""A model compiled from a work_dir and OpenVINO or ONNX Runtime, profiled per kernel in one
process:

    python -m benchmarks.profile_vs_openvino <model.onnx> <work_dir> [--rounds 10]
        [--calls 5] [--threads 2] [--warm] [--against openvino|onnxruntime]

relax_tune's side is ``relax_tune.profile.profile_model`` (every call the Relax VM makes,
timed in place by its instrument hook); OpenVINO's is its own per-node profile
(``PERF_COUNT``: each executed node's real time, the node type and the primitive it ran,
``brgconv_avx512_amx_I8`` and the like; a float file is compiled with
``INFERENCE_PRECISION_HINT=f32``, as in the benchmark: on AMX CPUs OpenVINO runs a float
model in bf16 otherwise). ``--against onnxruntime``: ONNX Runtime's profiler instead (each
node's kernel time and operator: ``Conv``, ``FusedConv``, ``QLinearConv``, ...). The two run in interleaved blocks of ``--calls``
calls, ``--rounds`` times, so both see the same state of a drifting machine; the whole
model is timed uninstrumented in the same blocks. Both lists come in execution order, so
layer N of one reads against layer N of the other (kernels of ours also hold the
neighbouring elementwise operators OpenVINO fuses as post-ops). The ONNX file may be a
float or a QDQ model (the work_dir's records must be for the same file, as
``bench_real_models --work-root`` leaves them); every contender runs ``--threads``
threads. ``--warm`` adds a column: each kernel of ours called again at once with the same
arguments (``profile_model(warm=True)``), what it would take with its data in cache.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from benchmarks.contenders import work_dir_parser, work_dir_vm


def quantized(path: str) -> bool:
    """Whether the ONNX file holds quantized operators (QDQ or QOperator)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear")
               or node.op_type.startswith("QLinear") for node in graph.node)


class OpenVINOSide:
    """OpenVINO compiled with ``PERF_COUNT``: ``call()`` runs the model once, ``profile(n)``
    one call more and ``n`` profiled calls, ``per_node()`` the executed nodes' seconds a run
    by (name, type, primitive), medians over the profiled calls."""

    name = "openvino"

    def __init__(self, model: str, x, threads: int):
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                  "PERF_COUNT": "YES"}
        if not quantized(model):  # as the benchmark: a float model stays float32 (without
            config["INFERENCE_PRECISION_HINT"] = "f32"  # the hint, AMX CPUs run it in bf16)
        self.request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
        self.x = x
        self.nodes: dict[tuple, list[float]] = defaultdict(list)

    def call(self) -> None:
        self.request.infer({0: self.x})

    def profile(self, calls: int) -> None:
        self.call()
        for _ in range(calls):
            self.call()
            for node in self.request.profiling_info:
                if node.status == node.Status.EXECUTED:
                    key = (node.node_name, node.node_type, node.exec_type)
                    self.nodes[key].append(node.real_time.total_seconds())

    def per_node(self) -> dict[tuple, float]:
        return {key: statistics.median(times) for key, times in self.nodes.items()}


class OnnxRuntimeSide:
    """ONNX Runtime as the benchmark runs it (``alternatives.ort_session``), the same three
    calls as ``OpenVINOSide``; its per-node times come from a second session with ONNX
    Runtime's profiler on (each node's ``_kernel_time`` event, by node, operator and
    provider), so the whole-model calls run unprofiled."""

    name = "onnxruntime"

    def __init__(self, model: str, x, threads: int):
        from benchmarks.alternatives import ort_session

        self.session = ort_session(model, threads)
        self.profiler = ort_session(model, threads, profiling=True)
        self.feed = {self.session.get_inputs()[0].name: x}
        self.recorded: list[bool] = []  # per profiler run: one of the profiled calls?

    def call(self) -> None:
        self.session.run(None, self.feed)

    def profile(self, calls: int) -> None:
        for recorded in [False] + [True] * calls:
            self.profiler.run(None, self.feed)
            self.recorded.append(recorded)

    def per_node(self) -> dict[tuple, float]:
        import json
        import os

        path = self.profiler.end_profiling()  # the profiler writes its events to a file
        with open(path) as f:
            events = json.load(f)
        os.remove(path)
        per_run: dict[tuple, list[float]] = defaultdict(list)
        for event in events:
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                args = event.get("args", {})
                key = (event["name"][:-len("_kernel_time")], args.get("op_name", "?"),
                       args.get("provider", "").replace("ExecutionProvider", ""))
                per_run[key].append(event["dur"] * 1e-6)  # one a run, in run order
        return {key: statistics.median(t for t, kept in zip(times, self.recorded) if kept)
                for key, times in per_run.items()}


def main() -> None:
    parser = work_dir_parser(__doc__.splitlines()[0], "model", rounds=10, calls=5)
    parser.add_argument("--warm", action="store_true",
                        help="also time each kernel of ours called again at once")
    parser.add_argument("--against", choices=("openvino", "onnxruntime"), default="openvino",
                        help="the alternative whose own per-node profile is set beside ours")
    parser.add_argument("--min-ms", type=float, default=0.005,
                        help="leave out calls below this many ms a run")
    args = parser.parse_args()
    ex, vm, arg, x = work_dir_vm(args.model, args.work_dir, args.threads)
    from relax_tune.profile import profile_model

    side = (OpenVINOSide if args.against == "openvino" else OnnxRuntimeSide)(
        args.model, x, args.threads)

    def timed(call) -> list[float]:
        call()
        out = []
        for _ in range(args.calls):
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
        return out

    whole: dict[str, list[float]] = {"relax_tune": [], side.name: []}
    ours: dict[str, list[float]] = defaultdict(list)
    again: dict[str, list[float]] = defaultdict(list)
    order: list[str] = []
    for _ in range(args.rounds):
        whole["relax_tune"] += timed(lambda: vm["main"](arg))
        for kernel in profile_model(ex, [arg], runs=args.calls, warmup=1, warm=args.warm):
            ours[kernel.name].append(kernel.secs)
            if kernel.warm_secs is not None:
                again[kernel.name].append(kernel.warm_secs)
        whole[side.name] += timed(side.call)
        side.profile(args.calls)
    theirs = side.per_node()
    # profile_model lists the slowest first; execution order from one instrumented run

    def note_order(func, name, before, ret, *rest):  # noqa: ARG001
        if not before and str(name) not in order:
            order.append(str(name))
        return 0

    vm.set_instrument(note_order)
    vm["main"](arg)
    print(f"threads {args.threads}; {args.rounds} interleaved rounds of {args.calls} calls")
    for name, times in whole.items():
        print(f"whole model, {name}: {statistics.median(times) * 1e3:.3f} ms (median)")
    ours_ms = {k: statistics.median(v) * 1e3 for k, v in ours.items()}
    again_ms = {k: statistics.median(v) * 1e3 for k, v in again.items()}
    print(f"\nrelax_tune, in execution order (sum {sum(ours_ms.values()):.3f} ms"
          + (f"; called again at once: {sum(again_ms.values()):.3f} ms of kernels" if again_ms
             else "") + "):")
    for name in order:
        if ours_ms.get(name, 0) >= args.min_ms:
            warm = "" if not again_ms else \
                f"{again_ms[name]:8.3f}  " if name in again_ms else " " * 10
            print(f"{ours_ms[name]:8.3f}  {warm}{name}")
    print(f"\n{side.name}, in execution order (sum {sum(theirs.values()) * 1e3:.3f} ms):")
    for (name, kind, primitive), secs in theirs.items():
        if secs * 1e3 >= args.min_ms:
            print(f"{secs * 1e3:8.3f}  {kind:<14} {primitive:<28} {name}")


if __name__ == "__main__":
    main()
