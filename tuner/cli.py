"""The ``tuner`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workloads import WorkloadError

from .errors import TunerError

_DESCRIPTION = """Auto-tune deep-learning tensor programs with Apache TVM.

  tuner tune MODEL      find fast schedules for every kernel of MODEL (resumable)
  tuner apply DIR MODEL compile MODEL with the schedules tuned in DIR
  tuner report DIR      summarise DIR as report.md plus report.png
  tuner workloads       list the built-in models and operators
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    tune = commands.add_parser(
        "tune",
        help="tune a model",
        description="Tune every kernel of MODEL. Progress goes to stderr: task, trials done, best latency so far, "
        "elapsed and remaining time. Running again on the same work dir resumes it: nothing is measured twice, "
        "and --trials counts what earlier runs measured.",
    )
    tune.add_argument("model", help="a built-in workload name (see `tuner workloads`)")
    tune.add_argument("--target", default="llvm", help="'llvm' (this CPU), 'cuda', 'cuda -arch=sm_90', ... (default: llvm)")
    tune.add_argument("--trials", type=_positive_int, default=64, help="candidates to measure in total (default: 64)")
    tune.add_argument("--work-dir", type=Path, help="where the database, logs and compiled model go (default: tuner-runs/MODEL-KIND)")
    tune.add_argument("--batch-size", type=_positive_int, help="candidates measured per round (default: chosen from the budget)")
    tune.add_argument("--build-workers", type=_positive_int, help="parallel build processes (default: one per core)")
    tune.add_argument("--seed", type=_positive_int, default=1, help="random seed (default: 1)")
    tune.add_argument("--no-verify", action="store_true", help="skip checking the best schedules' outputs against the untuned kernels")
    tune.add_argument("--quiet", action="store_true", help="print only the final summary")

    apply = commands.add_parser(
        "apply", help="compile a model with tuned schedules", description="Compile MODEL with the best schedules in DIR's database."
    )
    apply.add_argument("work_dir", type=Path, metavar="DIR", help="a work dir written by `tuner tune`")
    apply.add_argument("model", help="the model to compile (a built-in workload name)")
    apply.add_argument("-o", "--output", type=Path, required=True, help="the shared library to write (load it with tvm.runtime.load_module)")
    apply.add_argument("--target", help="compile for this target (default: the one DIR was tuned for)")

    report = commands.add_parser(
        "report",
        help="summarise a work dir",
        description="Write report.md (tasks, trials, best latencies, failures) and report.png (best latency against trials and against tuning time).",
    )
    report.add_argument("work_dir", type=Path, metavar="DIR", help="a work dir written by `tuner tune`")
    report.add_argument("-o", "--output-dir", type=Path, help="where to write the report (default: DIR)")

    commands.add_parser("workloads", help="list built-in workloads", description="List the built-in models and operators.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (TunerError, WorkloadError) as err:
        print(f"tuner: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _tune(args: argparse.Namespace) -> int:
    from .api import tune

    result = tune(
        args.model,
        target=args.target,
        trials=args.trials,
        work_dir=args.work_dir,
        batch_size=args.batch_size,
        build_workers=args.build_workers,
        seed=args.seed,
        verify=not args.no_verify,
        progress=not args.quiet,
    )
    if args.quiet:
        print(result.summary())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from .apply import apply

    path = apply(args.work_dir, args.model, args.output, target=args.target)
    print(f"wrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import write_report

    md, png = write_report(args.work_dir, args.output_dir)
    print(f"wrote {md} and {png}")
    return 0


def _workloads(args: argparse.Namespace) -> int:
    from workloads import list_workloads

    entries = list_workloads()
    width = max(len(e.name) for e in entries)
    for entry in entries:
        print(f"{entry.name:<{width}}  {entry.category:<8}  {entry.source}")
    return 0


_COMMANDS = {"tune": _tune, "apply": _apply, "report": _report, "workloads": _workloads}

if __name__ == "__main__":
    sys.exit(main())
