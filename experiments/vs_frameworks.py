"""Tuned models against what a user runs today: PyTorch, torch.compile, ONNX Runtime and OpenVINO.

For each zoo model and a set of operators (and models built from Hugging Face transformers'
definitions, workloads/hf_models.py, when named), tune with a stated budget, then time side by side
in one process, on the same inputs with the same threads, the tuned model, PyTorch eager,
torch.compile, ONNX Runtime and OpenVINO (as its users get it, in bf16 on a CPU with bf16 dot
products, and forced to fp32), with every output checked against PyTorch's; TVM untuned is the
latency tune() measured before tuning (often orders of magnitude slower: timing it again here would
take longer than the rest for the big models). Per kernel: its latency, FLOPs and bytes, its
fraction of this machine's measured limits (experiments/machine_limits.py) and the time of the
matching PyTorch operator.

    .venv/bin/python experiments/vs_frameworks.py                      # the whole zoo and the operators
    .venv/bin/python experiments/vs_frameworks.py --models resnet18 --operators
    .venv/bin/python experiments/vs_frameworks.py --quick              # CI: tiny-resnet, one operator, a few trials
    .venv/bin/python experiments/vs_frameworks.py --retime             # time again what the last run tuned
    .venv/bin/python experiments/vs_frameworks.py --models hf-resnet50 hf-distilbert-base
    .venv/bin/python experiments/vs_frameworks.py --dtype bfloat16     # tuned in bf16; PyTorch's autocast joins
    .venv/bin/python experiments/vs_frameworks.py --models hf-bert --no-strassen   # matmuls in their direct form
    python3 experiments/vs_frameworks.py --target cuda --models resnet18 bert-base   # on a GPU host, fp16

On a GPU (``--target cuda``) the models run in fp16 (``--dtype``), every contender on the GPU and
synchronised after each call (OpenVINO left out); the machine's limits are cuBLAS's fp16 GEMM and a
device copy. With ``--dtype bfloat16`` the frameworks still run in fp32 (``tuned / best`` is against
them) and PyTorch under ``torch.autocast`` in bf16 joins OpenVINO's default as the bf16 contenders.

Writes vs_frameworks.csv, kernels.csv, vs_frameworks.md and vs_frameworks.png into --out. Tuning
work dirs go to OUT/runs/ (a rerun resumes them: nothing is measured twice). Each workload is tuned,
then timed, in fresh processes of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.error_text import error_line  # noqa: E402
from experiments import frameworks as fw  # noqa: E402
from experiments.harness import markdown_table, prepare_comparison, run_step, write_csv  # noqa: E402
from experiments.vs_frameworks_tables import (  # noqa: E402
    Lineup,
    arithmetic_floor,  # noqa: F401 - tests/test_vs_frameworks.py imports it from here
    columns,
    kernel_rows,
    model_row,
    plot,
    public,
    summary,
)

ZOO = [
    "attention-block",
    "resnet18",
    "squeezenet1.1",
    "mobilenetv2",
    "resnet50",
    "convnext-t",
    "bert-base",
    "llama3-8b-layer",
]
_PREPACKED = "_prepacked"  # the suffix a kernel takes in the model when its weights' layout is rewritten
FRAMEWORKS = ["PyTorch eager", "torch.compile", "ONNX Runtime"]  # and OpenVINO's two on a CPU
TUNED_FILE = "tuned.json"  # in a workload's run dir: what its tuning step returned
TIMED_FILE = "timed.json"  # and what its timing step measured, round by round


@dataclass(frozen=True)
class Setting:
    """Where the comparison runs, and in what precision."""

    target: str = "llvm"  # or "cuda"
    dtype: str = "float32"
    strassen: bool = True  # large matmuls in Strassen's form where the lowering chooses it

    @property
    def on_gpu(self) -> bool:
        return self.target == "cuda"

    def args(self) -> list[str]:
        return ["--target", self.target, "--dtype", self.dtype, *([] if self.strassen else ["--no-strassen"])]

    @property
    def framework_dtype(self) -> str:
        """What the frameworks run in: the setting's dtype, but fp32 in a bf16 run (PyTorch's bf16 is
        its autocast, a contender of its own)."""
        return "float32" if self.dtype == "bfloat16" else self.dtype

    def lineup(self) -> Lineup:
        names = [*FRAMEWORKS, *([] if self.on_gpu else [fw.OPENVINO_FP32, fw.OPENVINO_DEFAULT])]
        reduced = fw.PRECISIONS["bfloat16"] if self.dtype == "bfloat16" else None
        if reduced:
            names.append(fw.autocast_name(self.dtype))
        return Lineup(tuple(names), fw.PRECISIONS.get(self.framework_dtype, self.framework_dtype), reduced)


def placed(module: Any, example: Any, setting: Setting) -> tuple[Any, Any]:
    """The module and an input (or a list of them) as the frameworks run them in this setting: in
    their precision, on its device."""
    import torch

    device, dtype = ("cuda" if setting.on_gpu else "cpu"), getattr(torch, setting.framework_dtype)

    def place(x):  # token ids (BERT's input) stay integers
        return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)

    example = [place(x) for x in example] if isinstance(example, list | tuple) else place(example)
    return module.to(device=device, dtype=dtype), example


# -- tuning, one fresh process per workload --------------------------------------------------------
def tune_step(name: str, trials_per_task: int, work_dir: Path, seed: int, setting: Setting) -> dict:
    from tuner import LoweringOptions, tune
    from workloads.models import MODELS

    if name in {spec.name for spec in MODELS}:
        model, inputs = name, None
    else:
        model, inputs = fw.module_and_inputs(name)
    result = tune(
        model,
        target=setting.target,
        example_inputs=inputs,
        dtype=setting.dtype,  # fp16, bf16: convolutions and matmuls in that precision, the input stays float32
        trials_per_task=trials_per_task,
        work_dir=work_dir,
        seed=seed,
        lowering=None if setting.strassen else LoweringOptions(strassen=False),
        time_untuned=True,  # the table's "TVM untuned" column
    )
    return {
        "artifact": str(result.artifact_path),
        "untuned_latency": result.latency_before,
        "trials": result.trials,
        "tuning_seconds": sum(v for k, v in result.seconds.items() if k != "compile and time"),
        "tasks": [
            {
                "name": t.name,
                "launches": t.weight,
                "flops": t.flops,
                "bytes": t.bytes,
                "latency": t.best_latency,
                "trials": t.trials,
            }
            for t in result.tasks
        ],
    }


# -- timing, one fresh process per workload, every contender in it ----------------------------------
def time_workload(name: str, tuned: dict, threads: int, run_dir: Path, quick: bool, setting: Setting) -> dict:
    import torch

    from tuner.runtime.compiled_model import CompiledModel, ModelDescription

    torch.set_num_threads(threads)
    module, inputs = placed(*fw.module_and_inputs(name), setting)
    description = ModelDescription.read(Path(tuned["artifact"]))
    # a mixed-precision model takes float32
    tuned_inputs = [x.to(getattr(torch, spec.dtype)) for x, spec in zip(inputs, description.inputs, strict=True)]
    precision = fw.PRECISIONS.get(setting.framework_dtype, setting.framework_dtype)
    contenders = [
        fw.tvm_model("tuned", Path(tuned["artifact"]), description, tuned_inputs, fw.PRECISIONS.get(setting.dtype, "")),
        fw.torch_eager(module, inputs, precision),
        *([] if quick else [fw.torch_compiled(module, inputs, precision)]),
        *([fw.torch_autocast(module, inputs, setting.dtype)] if setting.dtype == "bfloat16" else []),
        fw.onnx_runtime(module, inputs, threads, run_dir, precision),
        *([] if setting.on_gpu else fw.openvino(module, inputs, threads)),
    ]
    if setting.on_gpu:
        fw.synchronize_each_call(contenders)
    reference, errors = fw.errors_against_eager(contenders)
    # ten short rounds rather than five long ones: a shared VM's thread placement can change during
    # the timing (experiments/cross_core.py), and each round's ratio shows whether it did
    fw.time_interleaved(contenders, rounds=2 if quick else 10, seconds_per_round=0.1 if quick else 0.3)
    in_model = CompiledModel(Path(tuned["artifact"]), description).kernel_times(*tuned_inputs, runs=2 if quick else 10)
    return {
        "latency": {c.name: c.median for c in contenders},
        # each kernel's time inside the model: the tuning timed it alone, its data in cache
        "kernels_in_model": {name.removesuffix(_PREPACKED): seconds for name, seconds in in_model.items()},
        "rounds": {c.name: c.round_medians for c in contenders if c.call},
        "missing": {c.name: c.missing for c in contenders if c.missing},
        "precision": {c.name: c.precision for c in contenders},
        "errors": errors,
        "output_scale": float(abs(reference).max()),  # what the errors are relative to
        "torch_ops": torch_op_times(module, inputs, runs=2 if quick else 5, gpu=setting.on_gpu),
    }


def torch_op_times(module, inputs: list, runs: int, gpu: bool = False) -> list[tuple[str, float, float]]:
    """(operator, FLOPs, seconds per call) of PyTorch's GEMM-like operators in eager mode, from its
    profiler: inclusive CPU time, or on a GPU the time of the kernels each launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
    with torch.inference_mode():
        module(*inputs)
        with profile(activities=activities, with_flops=True) as prof:
            for _ in range(runs):
                module(*inputs)
    wanted = {"aten::conv2d", "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"}
    return [
        (e.name, float(e.flops), (e.device_time_total if gpu else e.cpu_time_total) / 1e6)
        for e in prof.events()
        if e.name in wanted and e.flops
    ]


def _tuned(name: str, run_dir: Path, args: argparse.Namespace) -> dict:
    """The tuning step's outcome: from a fresh tune() (which resumes the work dir), or with
    ``--retime`` from the last one's record."""
    record = run_dir / TUNED_FILE
    if args.retime and record.exists():
        return json.loads(record.read_text())
    step = ["--tune", name, "--work-dir", str(run_dir), "--trials-per-task", str(args.trials_per_task)]
    tuned = run_step(Path(__file__), [*step, "--seed", str(args.seed), *_setting(args).args()], run_dir / "tune.log")
    if record.exists():  # a resumed work dir: its tuning time is that of every session, not only this one
        tuned["tuning_seconds"] += json.loads(record.read_text())["tuning_seconds"]
    record.write_text(json.dumps(tuned) + "\n")
    return tuned


def _setting(args: argparse.Namespace) -> Setting:
    return Setting(args.target, args.dtype or ("float16" if args.target == "cuda" else "float32"), not args.no_strassen)


def _torch_sees_a_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _model_names() -> list[str]:
    """The zoo's models and the transformers models, as ``--models`` takes them."""
    from workloads.hf_models import HF_MODELS
    from workloads.models import MODELS

    return [spec.name for spec in MODELS] + list(HF_MODELS)


def _limits(setting: Setting, threads: int):
    from experiments.machine_limits import measure, measure_gpu

    return measure_gpu(setting.dtype) if setting.on_gpu else measure(threads)


def main() -> None:
    from experiments.operator_modules import OPERATORS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="*",
        default=None,
        help=f"zoo models (default: {' '.join(ZOO)}) or transformers models of workloads/hf_models.py (hf-...)",
    )
    parser.add_argument(
        "--operators", nargs="*", default=None, help=f"operators (with no names: all of {' '.join(OPERATORS)})"
    )
    parser.add_argument("--trials-per-task", type=int, default=None, help="default: 64 (4 with --quick)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: experiments/results/vs_frameworks (/cuda on a GPU)")
    parser.add_argument("--target", choices=["llvm", "cuda"], default="llvm", help="this CPU, or the GPU in fp16")
    parser.add_argument(
        "--dtype",
        default=None,
        help="the tuned models' precision: float32 (default), float16 (default on cuda), bfloat16",
    )
    parser.add_argument("--no-strassen", action="store_true", help="tune without Strassen's matmuls (the lowering's)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short timing, no torch.compile; unless named otherwise, tiny-resnet and one operator, 4 trials per task",
    )
    parser.add_argument(
        "--retime",
        action="store_true",
        help="time again what earlier runs tuned (OUT/runs/NAME/tuned.json) without running tune() again",
    )
    parser.add_argument("--tune", help=argparse.SUPPRESS)  # internal: the tuning step of one workload
    parser.add_argument("--time", help=argparse.SUPPRESS)  # internal: the timing step of one workload
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.trials_per_task = args.trials_per_task or (4 if args.quick else 64)
    setting = _setting(args)
    if setting.on_gpu and not _torch_sees_a_gpu():
        parser.error("--target cuda compares on a GPU: torch sees none here (a GPU host with torch built with CUDA)")
    if args.tune:
        print(json.dumps(tune_step(args.tune, args.trials_per_task, Path(args.work_dir), args.seed, setting)))
        return
    if args.time:
        run_dir = Path(args.work_dir)
        tuned = json.loads((run_dir / TUNED_FILE).read_text())
        timed = time_workload(args.time, tuned, args.threads, run_dir, args.quick, setting)
        (run_dir / TIMED_FILE).write_text(json.dumps(timed) + "\n")  # each round's latencies, kept for a closer look
        print(json.dumps(timed))
        return
    default_out = "experiments/results/vs_frameworks" + ("/cuda" if setting.on_gpu else "")
    if args.quick:
        if args.models is None and args.operators is None:
            args.models, args.operators = ["tiny-resnet"], ["op-softmax-bert"]
        default_out += "/quick"
    args.out = args.out or default_out
    # neither given: the zoo and every operator; one given: only that; --operators without names: every operator
    models = args.models if args.models is not None else (ZOO if args.operators is None else [])
    operators = (
        (args.operators or list(OPERATORS))
        if args.operators is not None
        else ([] if args.models is not None else list(OPERATORS))
    )
    unknown = [n for n in models if n not in _model_names()] + [n for n in operators if n not in OPERATORS]
    if unknown:
        parser.error(f"unknown workloads {' '.join(unknown)}: models are {' '.join(_model_names())}")
    lineup = setting.lineup()
    out, target = prepare_comparison(args.out, setting.target)
    threads = int(target.attrs["num-cores"]) if not setting.on_gpu else (os.cpu_count() or 1)
    limits = _limits(setting, threads)
    print(json.dumps(limits.as_dict()), flush=True)
    model_rows, all_kernels, timed_all, failures = [], [], {}, []
    for name in [*models, *operators]:
        run_dir = out / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            tuned = _tuned(name, run_dir, args)
            # each workload timed in a process of its own: runtimes loaded for earlier workloads (their
            # thread pools, their memory) must not weigh on later ones
            quick = ["--quick"] if args.quick else []
            timing = ["--time", name, "--work-dir", str(run_dir), "--threads", str(threads), *quick, *setting.args()]
            timed = run_step(Path(__file__), timing, run_dir / "time.log")
        except Exception as err:  # noqa: BLE001 - one workload failing must not lose the others' numbers
            print(f"{name}: failed, left out of the tables: {err}", flush=True)
            failures.append(f"{name}: {error_line(err)}")
            continue
        timed_all[name] = timed
        model_rows.append(model_row(name, tuned, timed, limits, lineup))
        all_kernels += kernel_rows(name, tuned, timed, limits)
        for framework, why in timed["missing"].items():
            print(f"{name}: {framework} unavailable: {why}", flush=True)
        print(markdown_table(public(model_rows[-1:]), columns(model_rows)), flush=True)
        write_csv(out / "vs_frameworks.csv", public(model_rows))  # after every workload: nothing measured is lost
        write_csv(out / "kernels.csv", public(all_kernels))
    (out / "limits.json").write_text(json.dumps(limits.as_dict(), indent=1) + "\n")
    failed = "".join(f"- failed: {line}\n" for line in failures)
    text = summary(model_rows, all_kernels, limits, args.trials_per_task, lineup)
    (out / "vs_frameworks.md").write_text(text + failed)
    if model_rows:
        plot(model_rows, timed_all, out / "vs_frameworks.png", lineup)
    print((out / "vs_frameworks.md").read_text())


if __name__ == "__main__":
    main()
