"""The ``relax-tune`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .utils import RelaxTuneError, host_target


def _target_arg(text: str | None):
    if text is None:
        return host_target()
    text = text.strip()
    return json.loads(text) if text.startswith("{") else text


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(args.work_dir, max_trials_global=args.trials,
                      target=_target_arg(args.target))
    return 0 if result["outputs_match"] else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``relax-tune`` (one sub-command per job)."""
    parser = argparse.ArgumentParser(
        prog="relax-tune", description="Search-based auto-tuning for TVM Relax models.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every tuning round")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="tune the tutorial's MLP on this CPU and print what it gained",
        description="Tune the MetaSchedule tutorial's MLP (Linear-ReLU-Linear) on the host CPU, "
                    "print per task trials / best latency / speedup over the untuned function, "
                    "then the whole model's latency before and after. Re-running with the same "
                    "work dir resumes: trials already recorded count against the budget.")
    demo.add_argument("--work-dir", default="relax_tune_demo",
                      help="where the tuning database is kept (default: ./relax_tune_demo)")
    demo.add_argument("--trials", type=int, default=64,
                      help="trials shared by the model's tasks (default: 64)")
    demo.add_argument("--target", default=None,
                      help="TVM target as a string or JSON dict (default: this machine's CPU)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``relax-tune`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return args.func(args)
    except RelaxTuneError as err:
        print(f"relax-tune: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
