"""A network's first convolution in bf16 two ways, each tuned from scratch: reading the model's input
in place (``LoweringOptions.bf16_image_windows`` on AMX, ``bf16_image_windows_avx512`` on
``vdpbf16ps``) and over its patches copied out first; timed interleaved in one process beside
PyTorch eager, with each one's error against PyTorch in fp32.

    .venv/bin/python experiments/first_convolution_in_place.py [--stems resnet mobilenetv2] [--trials-per-task 32]

Each stem is the zoo model's first convolution with what follows it there (ReLU, max pool, ReLU6),
over a 224x224 image; its output goes back to NCHW (a transpose both ways pay, which a model has not).
Prints a markdown table: both latencies, their ratio, the errors. Work dirs go to ``--out`` (a
temporary folder by default).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from codegen.bf16_dot import AMX  # noqa: E402
from common.host import cpu_model  # noqa: E402
from experiments import frameworks as fw  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402
from tuner.lowering import LoweringOptions  # noqa: E402
from tuner.targets import bf16_unit, resolve_target  # noqa: E402

STEMS = {
    "resnet": lambda: [torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)],
    "mobilenetv2": lambda: [torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.ReLU6()],
    "squeezenet": lambda: [torch.nn.Conv2d(3, 64, 3, 2), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, ceil_mode=True)],
    "convnext": lambda: [torch.nn.Conv2d(3, 96, 4, 4)],
}
WAYS = {"in place": True, "patches": False}


def tuned(stem: torch.nn.Module, image: torch.Tensor, in_place: bool, trials: int, work_dir: Path) -> fw.Contender:
    import tuner

    # both ways bf16 ones, on a CPU whose bf16 products are the slower too (where the stem would choose fp32)
    options = LoweringOptions(bf16_image_windows=in_place, bf16_image_windows_avx512=in_place, bf16_where_faster=False)
    result = tuner.tune(
        stem,
        example_inputs=[image],
        target="llvm",
        dtype="bfloat16",
        trials_per_task=trials,
        work_dir=work_dir,
        lowering=options,
        progress=False,
    )
    name = "in place" if in_place else "patches"
    return fw.tvm_model(name, result.artifact_path, result.description, [image], "bf16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stems", nargs="*", choices=list(STEMS), default=list(STEMS))
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="where the work dirs go (default: a temporary folder)")
    args = parser.parse_args()
    unit = bf16_unit(resolve_target("llvm"))
    if unit is None:
        sys.exit("first_convolution_in_place.py: this CPU has no bf16 dot product (AVX512_BF16 or AMX); run it on one")
    out = args.out or Path(tempfile.mkdtemp(prefix="first_convolution_"))
    rows = []
    for name in args.stems:
        torch.manual_seed(0)
        stem, image = torch.nn.Sequential(*STEMS[name]()).eval(), torch.randn(1, 3, 224, 224)
        ours = [tuned(stem, image, flag, args.trials_per_task, out / f"{name}_{way}") for way, flag in WAYS.items()]
        contenders = [fw.torch_eager(stem, [image]), *ours]
        _, errors = fw.errors_against_eager(contenders)
        fw.time_interleaved(contenders, rounds=args.rounds)
        in_place, patches = ours
        rows.append(
            {
                "stem": name,
                "in place (us)": f"{in_place.median * 1e6:.1f}",
                "patches (us)": f"{patches.median * 1e6:.1f}",
                "in place / patches": f"{in_place.median / patches.median:.3f}",
                "PyTorch eager fp32 (us)": f"{contenders[0].median * 1e6:.1f}",
                "errors: in place, patches": f"{errors['in place']:.1e}, {errors['patches']:.1e}",
            }
        )
        print(f"{name}: in place / patches {in_place.median / patches.median:.3f}", flush=True)
    instruction = "tdpbf16ps" if unit == AMX else "vdpbf16ps"
    print(f"\nFirst convolutions in bf16 on {cpu_model()} ({instruction}), {args.trials_per_task} trials per task")
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
