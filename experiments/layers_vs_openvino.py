"""Kernel by kernel against OpenVINO: where a compiled model loses its time to OpenVINO's CPU plugin.

    .venv/bin/python experiments/layers_vs_openvino.py hf-regnet --dtype bfloat16 \
        --work-dir experiments/results/budget_curve/runs/hf-regnet-bfloat16/analytic/work

One process: OpenVINO's per-layer profile (``PERF_COUNT``: each executed layer's time, its kind and the
implementation it ran, e.g. ``brgconv_avx512_amx_1x1_bf16``) over ``--runs`` inferences, and the model a
``tuner tune`` work dir holds (its ``model.so``) timed kernel by kernel inside the model
(``CompiledModel.kernel_times``), both on 2 threads by default. Each side is summed by kind of layer or
kernel, then its slowest are listed. Profiling costs each side something (OpenVINO's sum is below its
plain latency, ours above): compare kinds within a side's total, and totals only roughly. ``--dtype
bfloat16`` leaves OpenVINO its default precision (bf16 where the CPU has it); float32 forces it to fp32.
Writes OUT/MODEL[-bfloat16].md (default OUT: experiments/results/layers_vs_openvino).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import frameworks as fw  # noqa: E402
from experiments.harness import host_cpu, markdown_table  # noqa: E402

# our kernels' names as the lowering and Relax's fusion make them: the first that matches names the kind
KERNEL_KINDS = [
    ("grouped convolution (bf16)", r"bf16_grouped_conv2d"),
    ("convolution (bf16)", r"bf16_conv2d|bf16_patches|bf16_padded_image"),
    ("attention product (bf16)", r"bf16_batch_matmul"),
    ("product (bf16)", r"bf16_dense"),
    ("inverted residual", r"expand_depthwise"),
    ("convolution", r"conv2d|conv1d|winograd"),
    ("product", r"matmul|dense"),
    ("pool or mean", r"mean|pool|sum"),
    ("norm or softmax", r"norm|softmax"),
    ("copy", r"transpose|concatenate|split|reshape|strided_slice|pad|copy"),
]


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, name)), "other")


def openvino_layers(module, inputs, threads: int, runs: int, dtype: str) -> tuple[dict, float]:
    """Seconds per inference of each executed layer, keyed (name, kind, implementation); the plain latency."""
    import openvino as ov

    with fw.composed_attention():
        converted = ov.convert_model(module, example_input=tuple(inputs))
    config = {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": True}
    if dtype == "float32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    request = ov.Core().compile_model(converted, "CPU", config).create_infer_request()
    feed = [x.numpy() for x in inputs]
    for _ in range(max(10, runs // 10)):
        request.infer(feed)
    layers: dict = collections.defaultdict(float)
    started = time.perf_counter()
    for _ in range(runs):
        request.infer(feed)
        for layer in request.get_profiling_info():
            if layer.status.name == "EXECUTED":
                key = (layer.node_name, layer.node_type, layer.exec_type)
                layers[key] += layer.real_time.total_seconds() / runs
    return dict(layers), (time.perf_counter() - started) / runs


def work_dir_model(work_dir: Path):
    """The compiled model (``CompiledModel``) a finished tune left in ``work_dir``."""
    from tuner.runtime.compiled_model import CompiledModel, ModelDescription

    library = work_dir / "model.so"
    if not library.exists():
        raise SystemExit(f"{work_dir} holds no compiled model (model.so): pass the work dir of a finished tune")
    return CompiledModel(library, ModelDescription.read(library))


def by_kind(seconds: dict, kind_of) -> list[dict]:
    totals: dict = collections.defaultdict(float)
    for key, value in seconds.items():
        totals[kind_of(key)] += value
    whole = sum(totals.values())
    ordered = sorted(totals.items(), key=lambda item: -item[1])
    return [{"kind": k, "us": f"{v * 1e6:.0f}", "share": f"{v / whole:.0%}"} for k, v in ordered]


def slowest(seconds: dict, label, count: int) -> list[dict]:
    ordered = sorted(seconds.items(), key=lambda item: -item[1])[:count]
    return [{"layer": label(key), "us": f"{value * 1e6:.1f}"} for key, value in ordered]


def module_on_threads(model: str, threads: int) -> tuple:
    """(the model's module in eval mode, its inputs), torch's own threads set to ``threads``."""
    import torch

    torch.set_num_threads(threads)
    module, inputs = fw.module_and_inputs(model)
    return module.eval(), inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model of workloads/hf_models.py or the zoo")
    parser.add_argument("--work-dir", type=Path, help="a `tuner tune` work dir of that model: its kernels too")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--top", type=int, default=15, help="slowest layers listed per side")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/layers_vs_openvino"))
    args = parser.parse_args()

    module, inputs = module_on_threads(args.model, args.threads)
    layers, latency = openvino_layers(module, inputs, args.threads, args.runs, args.dtype)
    lines = [
        f"# {args.model} ({args.dtype}) kernel by kernel against OpenVINO",
        "",
        f"{host_cpu()}, {args.threads} threads, {args.runs} inferences a side; `experiments/layers_vs_openvino.py "
        f"{' '.join(sys.argv[1:])}`",
        "",
        f"OpenVINO: {latency * 1e3:.3f} ms an inference while profiled, its layers {sum(layers.values()) * 1e3:.3f} ms",
        "",
        markdown_table(by_kind(layers, lambda key: f"{key[1]} ({key[2]})"), ["kind", "us", "share"]),
        "",
        markdown_table(slowest(layers, lambda key: f"{key[0][:60]} {key[1]} ({key[2]})", args.top), ["layer", "us"]),
    ]
    if args.work_dir is not None:
        ours = work_dir_model(args.work_dir).kernel_times(*inputs, runs=max(10, args.runs // 20))
        lines += [
            "",
            f"Ours ({args.work_dir}): its kernels {sum(ours.values()) * 1e3:.3f} ms an inference inside the model",
            "",
            markdown_table(by_kind(ours, kernel_kind), ["kind", "us", "share"]),
            "",
            markdown_table(slowest(ours, str, args.top), ["layer", "us"]),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.dtype == "float32" else f"-{args.dtype}"
    (args.out / f"{args.model}{suffix}.md").write_text(text)


if __name__ == "__main__":
    main()
