"""The ``tuner`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from workloads import WorkloadError

from .errors import TunerError

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


def _positive(kind: type, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {value}")
        return value

    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 1,3,224,224, got {text!r}") from None
    return shape


def _add_model_options(command: argparse.ArgumentParser) -> None:
    """The options that pick which variant of MODEL is meant (tune and apply must agree)."""
    command.add_argument("--batch", type=_positive_int, help="batch size of a built-in model (default: 1)")
    command.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="precision of the model's convolutions and matmuls (default: float32)",
    )
    command.add_argument(
        "--input-shape",
        type=_shape,
        action="append",
        metavar="D0,D1,...",
        help="shape of an ONNX model's input, once per input, where the file leaves dimensions symbolic",
    )


def _plateau(text: str) -> tuple[int, float]:
    """ "N,PCT": no improvement by PCT percent over N batches."""
    try:
        batches, percent = text.split(",")
        return int(batches), float(percent) / 100
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected BATCHES,PERCENT like 4,1 (1% over 4 batches), got {text!r}"
        ) from None


def _add_objective_options(command: argparse.ArgumentParser) -> None:
    """Cost objectives: the run ends (or a task is dropped) when the first is met."""
    group = command.add_argument_group("stopping", "the run ends when the first of these (or --trials) is met")
    wall = group.add_mutually_exclusive_group()
    wall.add_argument("--max-minutes", type=_positive_float, help="tuning wall time budget, in minutes")
    wall.add_argument("--max-seconds", type=_positive_float, help="tuning wall time budget, in seconds")
    group.add_argument("--max-joules", type=_positive_float, help="energy budget (GPUs whose driver reports energy)")
    group.add_argument("--max-cost", type=_positive_float, help="money budget, with --price-per-hour")
    group.add_argument("--price-per-hour", type=_positive_float, help="what an hour of the device costs")
    group.add_argument(
        "--plateau",
        type=_plateau,
        metavar="N,PCT",
        help="stop when the model's latency improved less than PCT%% over N batches",
    )
    group.add_argument("--task-trials", type=_positive_int, help="drop a task after this many trials")
    group.add_argument(
        "--task-plateau",
        type=_plateau,
        metavar="N,PCT",
        help="drop a task that improved less than PCT%% over its last N batches",
    )


def objectives_from_args(args: argparse.Namespace):
    """(run objectives, task objectives) from the stopping options; None where none was given."""
    from .objectives import Objectives

    patience, gain = args.plateau or (None, 0.01)
    run = Objectives(
        seconds=args.max_minutes * 60 if args.max_minutes else args.max_seconds,
        joules=args.max_joules,
        money=args.max_cost,
        price_per_hour=args.price_per_hour,
        patience=patience,
        min_improvement=gain,
    )
    task_patience, task_gain = args.task_plateau or (None, 0.01)
    task = Objectives(trials=args.task_trials, patience=task_patience, min_improvement=task_gain)
    return (None if run.empty else run), (None if task.empty else task)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in (_add_tune, _add_apply, _add_report, _add_workloads, _add_doctor):
        add_command(commands)
    return parser


def _add_tune(commands) -> None:
    tune = commands.add_parser(
        "tune",
        help="tune a model",
        description="Tune every kernel of MODEL. Progress goes to stderr: task, trials done, best latency so far, "
        "elapsed and remaining time. Running again on the same work dir resumes it: nothing is measured twice, "
        "and --trials counts what earlier runs measured.",
    )
    tune.add_argument("model", help="a built-in workload name (see `tuner workloads`) or an .onnx file")
    tune.add_argument(
        "--target", default="llvm", help="'llvm' (this CPU), 'cuda', 'cuda -arch=sm_90', ... (default: llvm)"
    )
    budget = tune.add_mutually_exclusive_group()
    budget.add_argument(
        "--trials",
        type=_positive_int,
        help="candidates to measure in total (default, with no stopping option: 32 per kernel, at least 64)",
    )
    budget.add_argument(
        "--trials-per-task",
        type=_positive_int,
        help="the budget as candidates per kernel of the model: N x its tasks in total "
        "(the scheduler still decides where they go)",
    )
    tune.add_argument(
        "--exact-math",
        action="store_true",
        help="compute exp, erf, tanh, sigmoid and softmax with libm instead of vectorised approximations",
    )
    tune.add_argument(
        "--no-winograd",
        action="store_true",
        help="compute 3x3 convolutions directly on a CPU, not by Winograd's algorithm",
    )
    tune.add_argument(
        "--no-block-fusion",
        action="store_true",
        help="keep a 1x1 expanding convolution and the depthwise one after it as two kernels on a CPU "
        "(MobileNet's inverted-residual blocks)",
    )
    tune.add_argument(
        "--no-strassen",
        action="store_true",
        help="compute large matmuls by constant weights directly on a CPU, not by one level of Strassen's algorithm",
    )
    _add_objective_options(tune)
    tune.add_argument(
        "--scheduler",
        choices=("gradient", "round-robin"),
        default="gradient",
        help="which task gets the next batch (default: gradient)",
    )
    tune.add_argument(
        "--no-filter", action="store_true", help="measure every proposed candidate (no cost-model filter)"
    )
    tune.add_argument(
        "--work-dir", type=Path, help="where the database, logs and compiled model go (default: tuner-runs/MODEL-KIND)"
    )
    tune.add_argument(
        "--batch-size", type=_positive_int, help="candidates measured per round (default: chosen from the budget)"
    )
    tune.add_argument("--build-workers", type=_positive_int, help="parallel build processes (default: one per core)")
    tune.add_argument(
        "--cold-cache",
        action="store_true",
        help="time CPU kernels with their arguments flushed from the caches, as they meet their data inside a model",
    )
    _add_model_options(tune)
    tune.add_argument("--seed", type=_positive_int, default=1, help="random seed (default: 1)")
    tune.add_argument(
        "--transfer-from",
        type=Path,
        action="append",
        metavar="DIR",
        help="start from the schedules tuned in DIR (another model's work dir) for kernels of the same kind; "
        "repeatable",
    )
    tune.add_argument(
        "--cost-model-from",
        type=Path,
        action="append",
        metavar="DIR",
        help="warm-start the cost model with what the run in DIR measured (its schedules are not used); repeatable",
    )
    tune.add_argument(
        "--cluster",
        "--ray",  # its name before it matched tune(cluster=...)
        dest="cluster",
        metavar="ADDRESS",
        help="build and measure on a Ray cluster: 'auto', HOST:PORT of its head, ray://HOST:PORT, or 'local' "
        "(default: this machine's processes)",
    )
    tune.add_argument(
        "--no-verify", action="store_true", help="skip checking the best schedules' outputs against the untuned kernels"
    )
    tune.add_argument("--quiet", action="store_true", help="print only the final summary")
    _add_verbose(tune)


def _add_verbose(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--verbose",
        action="store_true",
        help="let TVM's own log lines through (by default they go to DIR/logs/libraries.log)",
    )


def _add_apply(commands) -> None:
    apply = commands.add_parser(
        "apply",
        help="compile a model with tuned schedules",
        description="Compile MODEL with the best schedules in DIR's database.",
    )
    apply.add_argument("work_dir", type=Path, metavar="DIR", help="a work dir written by `tuner tune`")
    apply.add_argument("model", help="the model to compile (a built-in workload name or an .onnx file)")
    _add_model_options(apply)
    apply.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the shared library to write, its description beside it (load it with tuner.load)",
    )
    apply.add_argument("--target", help="compile for this target (default: the one DIR was tuned for)")
    _add_verbose(apply)


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
    from .api import tune
    from .lowering import LoweringOptions

    stop, task_stop = objectives_from_args(args)
    result = tune(
        args.model,
        target=args.target,
        example_inputs=args.input_shape,
        batch=args.batch,
        dtype=args.dtype,
        trials=args.trials,
        trials_per_task=args.trials_per_task,
        lowering=LoweringOptions(
            fast_math=not args.exact_math,
            winograd=False if args.no_winograd else None,
            fuse_expand_depthwise=False if args.no_block_fusion else None,
            strassen=False if args.no_strassen else None,
        ),
        stop=stop,
        task_stop=task_stop,
        scheduler=args.scheduler,
        filter=not args.no_filter,
        work_dir=args.work_dir,
        batch_size=args.batch_size,
        build_workers=args.build_workers,
        seed=args.seed,
        verify=not args.no_verify,
        progress=not args.quiet,
        transfer_from=args.transfer_from,
        cost_model_from=args.cost_model_from,
        cluster=args.cluster,
        cold_cache=args.cold_cache,
        verbose=args.verbose,
    )
    if args.quiet:
        print(result.summary())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from .apply import apply

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
