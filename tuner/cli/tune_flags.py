"""``tuner tune``'s flags: one spelling on the command line of each ``TuneOptions`` field (``TUNE_FLAGS``),
their defaults taken from the fields, and the options a parsed command line stands for."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from tuner.options import TuneOptions

_DEFAULTS = {f.name: f.default for f in fields(TuneOptions)}


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


def _trial_count(text: str) -> int:
    """A number of trials: 0 measures nothing (the analytic schedules alone)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of trials (0 or more), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of trials (0 or more), got {value}")
    return value


_positive_float = _positive(float, "number")


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 1,3,224,224, got {text!r}") from None
    return shape


def add_model_options(command: argparse.ArgumentParser) -> None:
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
    wall.add_argument(
        "--max-minutes",
        type=_positive_float,
        help="wall-clock budget of this command, in minutes: it ends within it, the final compile and check included",
    )
    wall.add_argument("--max-seconds", type=_positive_float, help="the same, in seconds")
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
    from tuner.search.objectives import Objectives

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


# Each TuneOptions field, the flags that set it on the command line (tests/test_settings.py holds the two together).
TUNE_FLAGS: dict[str, tuple[str, ...]] = {
    "target": ("--target",),
    "trials": ("--trials",),
    "work_dir": ("--work-dir",),
    "stop": ("--max-minutes", "--max-seconds", "--max-joules", "--max-cost", "--price-per-hour", "--plateau"),
    "task_stop": ("--task-trials", "--task-plateau"),
    "scheduler": ("--scheduler",),
    "filter": ("--no-filter",),
    "example_inputs": ("--input-shape",),
    "batch": ("--batch",),
    "dtype": ("--dtype",),
    "batch_size": ("--batch-size",),
    "build_workers": ("--build-workers",),
    "seed": ("--seed",),
    "verify": ("--no-verify",),
    "progress": ("--quiet",),
    "transfer_from": ("--transfer-from",),
    "cost_model_from": ("--cost-model-from",),
    "cluster": ("--cluster", "--ray"),
    "lowering": ("--exact-math", "--no-winograd", "--no-block-fusion", "--no-strassen"),
    "trials_per_task": ("--trials-per-task",),
    "cold_cache": ("--cold-cache",),
    "verbose": ("--verbose",),
    "analytic_start": ("--no-analytic-start",),
    "time_untuned": ("--time-untuned",),
    "partition": ("--no-partition",),
    "pipeline": ("--pipeline",),
}


def options_from_args(args: argparse.Namespace) -> TuneOptions:
    """The options a parsed ``tuner tune`` command line stands for."""
    stop, task_stop = objectives_from_args(args)
    return TuneOptions(
        target=args.target,
        trials=args.trials,
        work_dir=args.work_dir,
        stop=stop,
        task_stop=task_stop,
        scheduler=args.scheduler,
        filter=not args.no_filter,
        example_inputs=args.input_shape,
        batch=args.batch,
        dtype=args.dtype,
        batch_size=args.batch_size,
        build_workers=args.build_workers,
        seed=args.seed,
        verify=not args.no_verify,
        progress=not args.quiet,
        transfer_from=args.transfer_from,
        cost_model_from=args.cost_model_from,
        cluster=args.cluster,
        lowering=_lowering_from_args(args),
        trials_per_task=args.trials_per_task,
        cold_cache=args.cold_cache,
        verbose=args.verbose,
        analytic_start=not args.no_analytic_start,
        time_untuned=args.time_untuned,
        partition=not args.no_partition,
        pipeline={"on": True, "off": False}.get(args.pipeline),
    )


def _lowering_from_args(args: argparse.Namespace):
    """The lowering the flags ask for; None (the default lowering) where they ask for nothing else."""
    from tuner.lowering import LoweringOptions

    lowering = LoweringOptions(
        fast_math=not args.exact_math,
        winograd=False if args.no_winograd else None,
        fuse_expand_depthwise=False if args.no_block_fusion else None,
        strassen=False if args.no_strassen else None,
    )
    return None if lowering == LoweringOptions() else lowering


def add_tune_command(commands) -> None:
    tune = commands.add_parser(
        "tune",
        help="tune a model",
        description="Tune every kernel of MODEL. Progress goes to stderr: task, trials done, best latency so far, "
        "elapsed and remaining time. Running again on the same work dir resumes it: nothing is measured twice, "
        "and --trials counts what earlier runs measured.",
    )
    tune.add_argument("model", help="a built-in workload name (see `tuner workloads`) or an .onnx file")
    tune.add_argument(
        "--target",
        default=_DEFAULTS["target"],
        help=f"'llvm' (this CPU), 'cuda', 'cuda -arch=sm_90', ... (default: {_DEFAULTS['target']})",
    )
    budget = tune.add_mutually_exclusive_group()
    budget.add_argument(
        "--trials",
        type=_trial_count,
        help="candidates to measure in total; 0: none, every kernel with its analytic schedule (default, with no "
        "stopping option: 32 per kernel, at least 64)",
    )
    budget.add_argument(
        "--trials-per-task",
        type=_trial_count,
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
        default=_DEFAULTS["scheduler"],
        help=f"which task gets the next batch (default: {_DEFAULTS['scheduler']})",
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
    add_model_options(tune)
    tune.add_argument(
        "--seed", type=_positive_int, default=_DEFAULTS["seed"], help=f"random seed (default: {_DEFAULTS['seed']})"
    )
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
    tune.add_argument(
        "--no-analytic-start",
        action="store_true",
        help="start each kernel's search from random samples of its design spaces, not from its analytic schedule",
    )
    tune.add_argument(
        "--time-untuned",
        action="store_true",
        help="also compile and time the model with TVM's default schedules, for the summary's before and after",
    )
    tune.add_argument(
        "--no-partition",
        action="store_true",
        help="refuse a model with operators TVM's importer does not take, instead of running them in PyTorch "
        "between compiled pieces",
    )
    tune.add_argument(
        "--pipeline",
        choices=["on", "off"],
        help="search for the next batch while the last one is built and timed (default: on for GPUs)",
    )
    add_verbose(tune)


def add_verbose(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--verbose",
        action="store_true",
        help="let TVM's own log lines through (by default they go to DIR/logs/libraries.log)",
    )
