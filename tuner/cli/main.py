"""The ``tuner`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tuner.errors import TunerError
from workloads import WorkloadError

from .tune_flags import add_model_options, add_tune_command, add_verbose, options_from_args

_DESCRIPTION = """Auto-tune deep-learning tensor programs with Apache TVM.

  tuner tune MODEL      find fast schedules for every kernel of MODEL (resumable)
  tuner apply DIR MODEL compile MODEL with the schedules tuned in DIR
  tuner report DIR      summarise DIR as report.md plus report.png
  tuner workloads       list the built-in models and operators
  tuner doctor          check this machine: TVM, CUDA, GPUs, NVML, compilers, Ray, CPU
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line and a pointer to --help instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"tuner: error: {message} (see `{self.prog} --help`)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the run stops, with its measurements saved."""


def _terminate(signum: int, frame) -> None:
    raise Terminated("stopped by SIGTERM")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in (add_tune_command, _add_apply, _add_report, _add_workloads, _add_doctor):
        add_command(commands)
    return parser


def _add_apply(commands) -> None:
    apply = commands.add_parser(
        "apply",
        help="compile a model with tuned schedules",
        description="Compile MODEL with the best schedules in DIR's database.",
    )
    apply.add_argument("work_dir", type=Path, metavar="DIR", help="a work dir written by `tuner tune`")
    apply.add_argument("model", help="the model to compile (a built-in workload name or an .onnx file)")
    add_model_options(apply)
    apply.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the shared library to write, its description beside it (load it with tuner.load)",
    )
    apply.add_argument("--target", help="compile for this target (default: the one DIR was tuned for)")
    add_verbose(apply)


def _add_report(commands) -> None:
    report = commands.add_parser(
        "report",
        help="summarise a work dir",
        description="Write report.md (tasks, trials, best latencies, failures) and report.png (best latency against "
        "trials and against tuning time).",
    )
    report.add_argument("work_dir", type=Path, metavar="DIR", help="a work dir written by `tuner tune`")
    report.add_argument("-o", "--output-dir", type=Path, help="where to write the report (default: DIR)")


def _add_workloads(commands) -> None:
    listing = commands.add_parser(
        "workloads",
        help="list built-in workloads",
        description="List the built-in models and operators with their FLOPs, distinct kernels (tasks) and where their "
        "shapes come from; `tuner workloads show NAME` prints one workload's tasks. Models are built to count their "
        "kernels the first time (cached afterwards).",
    )
    listing.add_argument("action", nargs="?", choices=("show",), help="show one workload's tasks")
    listing.add_argument("name", nargs="?", help="the workload to show")


def _add_doctor(commands) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check this machine",
        description="Check what tuning needs on this machine, one line each, OK or the fix: TVM, TVM's CUDA runtime, "
        "the GPUs it sees, NVML, the CUDA compiler, Ray and the cluster it would join, the CPU. "
        "Exits 0 when every target named can be tuned here, 1 otherwise.",
    )
    doctor.add_argument("--target", choices=("llvm", "cuda"), help="the target to check (default: both)")
    doctor.add_argument(
        "--cluster",
        "--ray",
        dest="cluster",
        metavar="ADDRESS",
        help="the Ray cluster to check (default: $RAY_ADDRESS, or the last one started here)",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    # A shell without job control starts background commands with SIGINT ignored, and Python then
    # leaves it so: a `kill -INT` (or Ctrl-C reaching the group) must still stop a tuner started so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _COMMANDS[args.command](args)
    except (TunerError, WorkloadError) as err:
        print(f"tuner: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def _tune(args: argparse.Namespace) -> int:
    from tuner.run import run_tuning

    result = run_tuning(args.model, options_from_args(args))
    if args.quiet:
        print(result.summary())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from tuner.compile.apply import apply

    path = apply(
        args.work_dir,
        args.model,
        args.output,
        target=args.target,
        example_inputs=args.input_shape,
        batch=args.batch,
        dtype=args.dtype,
        verbose=args.verbose,
    )
    print(f"wrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import write_report

    md, png = write_report(args.work_dir, args.output_dir)
    print(f"wrote {md} and {png}")
    return 0


def _workloads(args: argparse.Namespace) -> int:
    from workloads import list_workloads

    from .catalog import catalog

    entries = list_workloads()
    if args.action == "show":
        return _show_workload(args.name, entries)
    infos = catalog(
        entries,
        on_build=lambda name: print(
            f"tuner: building {name} to count its kernels (cached afterwards)", file=sys.stderr
        ),
    )
    width = max(len(i.name) for i in infos)
    print(f"{'workload':<{width}}  {'kind':<8}  {'family':<20}  {'GFLOP':>8}  {'tasks':>5}  source")
    for info in infos:
        gflop = f"{info.flops / 1e9:8.3f}" if info.flops is not None else f"{'-':>8}"
        tasks = f"{info.distinct_tasks:5d}" if info.flops is not None else f"{'-':>5}"
        note = f"  [not built: {info.unavailable}]" if info.unavailable else ""
        print(f"{info.name:<{width}}  {info.category:<8}  {info.family:<20}  {gflop}  {tasks}  {info.source}{note}")
    return 0


def _show_workload(name: str | None, entries) -> int:
    from workloads import get_workload

    from .catalog import describe

    if not name:
        raise TunerError("`tuner workloads show` needs a workload name: see `tuner workloads`")
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        get_workload(name)  # raises the unknown-name error with suggestions
    info = describe(entry)
    if info.unavailable:
        raise TunerError(info.unavailable)
    print(f"{info.name}: {info.source}")
    print(
        f"{info.flops / 1e9:.3f} GFLOP per run, {info.distinct_tasks} distinct kernels, "
        f"{sum(t.weight for t in info.tasks)} launches"
    )
    width = max(len(t.name) for t in info.tasks)
    print(f"  {'kernel':<{width}}  {'launches':>8}  {'MFLOP/launch':>12}")
    for task in info.tasks:
        print(f"  {task.name:<{width}}  {task.weight:>8}  {task.flops / 1e6:12.2f}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import TARGETS, doctor

    return doctor((args.target,) if args.target else TARGETS, args.cluster)


_COMMANDS = {"tune": _tune, "apply": _apply, "report": _report, "workloads": _workloads, "doctor": _doctor}

if __name__ == "__main__":
    sys.exit(main())
