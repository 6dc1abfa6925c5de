"""A compiled int8 model timed in a process of its own, and again right after ONNX Runtime's
int8 kernels ran on the same thread (what sharing a process with them costs):

    python -m benchmarks.int8_alone <model_qdq.onnx> <work_dir> [--rounds 5] [--calls 20]
        [--no-spin]

The QDQ file and the work_dir are what ``bench_real_models --int8 --work-root`` leaves (the
model compiled from the work_dir's records, nothing tuned). Each round times ``--calls``
calls of the model (median), then runs ONNX Runtime int8 once on the same input and times
the model again; the table gives the medians over rounds. ``TVM_NUM_THREADS`` and ONNX
Runtime's intra-op threads are both ``--threads``.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.contenders import work_dir_parser, work_dir_vm


def main() -> None:
    parser = work_dir_parser(__doc__.splitlines()[0], "qdq", rounds=5, calls=20)
    parser.add_argument("--no-spin", action="store_true",
                        help="ONNX Runtime's intra-op threads do not spin after a run")
    args = parser.parse_args()
    _, vm, arg, x = work_dir_vm(args.qdq, args.work_dir, args.threads)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    if args.no_spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(args.qdq, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}

    def ours() -> float:
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            vm["main"](arg)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    for _ in range(3):
        vm["main"](arg)
    alone, after = [], []
    for _ in range(args.rounds):
        alone.append(ours())
        session.run(None, feed)
        after.append(ours())
    print(f"threads {args.threads}, {args.rounds} rounds of {args.calls} calls, ONNX Runtime "
          f"threads {'do not spin' if args.no_spin else 'spin (its default)'}")
    print(f"alone: {statistics.median(alone) * 1e3:.3f} ms; right after ONNX Runtime int8 "
          f"ran on this thread: {statistics.median(after) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
