"""The `tuner` command, run as a user runs it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from onnx_models import save_det_model


def tuner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=cwd)


def tuner_here(*args: str, cwd: Path, capfd) -> tuple[int, str]:
    """The same command's exit code and stderr, run in this process: a mistake is answered before
    anything starts, so the seconds an interpreter takes to import TVM are all a subprocess adds."""
    from tuner.cli.main import main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    here = os.getcwd()
    os.chdir(cwd)
    try:
        code = main(list(args))
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    finally:
        os.chdir(here)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, capfd.readouterr().err


def answers(cases: list, cwd: Path, capfd):
    """Each (args, expected) case with its exit code and stderr: the first as a user runs it, the rest
    in this process."""
    for number, (args, expected) in enumerate(cases):
        if number == 0:
            run = tuner(*args, cwd=cwd)
            yield args, expected, run.returncode, run.stderr
        else:
            yield args, expected, *tuner_here(*args, cwd=cwd, capfd=capfd)


def test_tune_report_apply(tmp_path):
    run = tuner("tune", "matmul-128", "--trials", "8", "--batch-size", "8", "--work-dir", "run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    progress = [line for line in run.stderr.splitlines() if "trials 8/8" in line]
    assert progress and "best" in progress[0] and "elapsed" in progress[0] and "eta" in progress[0]

    report = tuner("report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "run" / "report.md").read_text()
    assert "matmul-128" in md and "| 8 |" in md and "measurement parallelism:" in md and "| spread | samples |" in md
    assert (tmp_path / "run" / "report.png").read_bytes()[:4] == b"\x89PNG"

    apply = tuner("apply", "run", "matmul-128", "-o", "out/mm.so", cwd=tmp_path)
    assert apply.returncode == 0, apply.stderr
    lib = tvm.runtime.load_module(str(tmp_path / "out" / "mm.so"))
    assert lib.entry_name == "main"
    assert '"kind": "tir"' in (tmp_path / "out" / "mm.json").read_text()  # its description, for tuner.load
    assert all(line.startswith("tuner: ") for line in apply.stderr.splitlines()), apply.stderr


def test_bad_input_gives_one_line_and_a_nonzero_exit(tmp_path, capfd):
    cases = [
        (("tune", "matmul-12"), "did you mean|Did you mean"),
        (("tune", "matmul-128", "--target", "llvm -bogus=1"), "invalid target"),
        (("tune", "matmul-128", "--trials", "-1"), "whole number of trials"),
        (("report", "nowhere"), "cannot report on .nowhere.: no such directory"),
        (("tune", "matmul-128", "--transfer-from", "nowhere"), "cannot transfer from 'nowhere': no such directory"),
        (
            ("tune", "matmul-128", "--cost-model-from", "nowhere"),
            "cannot warm-start the cost model from 'nowhere': no such directory",
        ),
    ]
    for args, expected, code, stderr in answers(cases, tmp_path, capfd):
        assert code == 2, (args, stderr)
        errors = [line for line in stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and __import__("re").search(expected, errors[0]), stderr


def test_help_explains_each_command(tmp_path):
    for command in ("tune", "apply", "report"):
        run = tuner(command, "--help", cwd=tmp_path)
        assert run.returncode == 0 and len(run.stdout.splitlines()) > 5


def test_the_command_line_starts_without_tvm_or_torch(tmp_path):
    """`tuner --help` and a mistake answer at once: TVM and PyTorch load when a command needs them."""
    probe = (
        "import sys, tuner.cli; from tuner import TunerError; "
        "print(sorted(m for m in ('tvm', 'torch', 'numpy') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr

    public = subprocess.run(
        [sys.executable, "-c", "import tuner, workloads; print(tuner.tune.__module__, workloads.Workload.__module__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert public.stdout.split() == ["tuner.api", "workloads.workload"], public.stderr


def test_a_built_in_operator_loads_without_torch(tmp_path):
    """The README's first command installs no torch: the built-in workloads and the importers load
    without it (torch's own modules, such as the torch.export pre-pass, only where torch is used)."""
    probe = "import sys; sys.modules['torch'] = None; import workloads; print(workloads.get_workload('matmul-128'))"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and "matmul-128" in run.stdout, run.stderr[-2000:]


@pytest.mark.slow  # builds every model (a minute); test_workloads_lists_flops_tasks_and_sources lists from the cache
def test_workloads_lists_builtins(tmp_path):
    run = tuner("workloads", cwd=tmp_path)
    assert run.returncode == 0 and "matmul-512" in run.stdout and "tiny-resnet" in run.stdout


def test_workloads_show_prints_the_tasks(tmp_path):
    run = tuner("workloads", "show", "conv2d-resnet50-l3", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "0.231 GFLOP per run, 1 distinct kernels, 1 launches" in run.stdout


def test_workloads_lists_flops_tasks_and_sources(tmp_path):
    """With the catalog cache in place (as after a first listing), the listing is instant."""
    import json
    import os

    from tuner.cli.catalog import _definitions_fingerprint

    cache = tmp_path / "cache"
    cache.mkdir()
    fake = {"name": "x", "category": "model", "family": "model", "source": "s", "flops": 4.1e9, "unavailable": None,
            "tasks": [{"name": "k", "weight": 2, "flops": 2.05e9}],
            "fingerprint": _definitions_fingerprint()}  # fmt: skip
    from workloads import list_workloads

    entries = {
        e.name: {**fake, "name": e.name, "category": e.category, "source": e.source}
        for e in list_workloads()
        if e.category == "model"
    }
    (cache / "catalog.json").write_text(json.dumps(entries))
    env = {**os.environ, "TENSOR_TUNER_CACHE_DIR": str(cache)}
    run = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "workloads"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:5] == ["workload", "kind", "family", "GFLOP", "tasks"]
    conv = next(line for line in lines if line.startswith("conv2d-resnet50-l3 "))
    assert "0.231" in conv and "ResNet-50 layer3" in conv
    resnet = next(line for line in lines if line.startswith("resnet50 "))
    assert "4.100" in resnet and "He et al." in resnet
    assert "building" not in run.stderr


def test_onnx_input_errors_from_the_cli(tmp_path, capfd):
    torch = __import__("pytest").importorskip("torch")
    __import__("pytest").importorskip("onnx")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    torch.onnx.export(
        net,
        (torch.randn(1, 3, 8, 8),),
        str(tmp_path / "m.onnx"),
        input_names=["x"],
        dynamic_axes={"x": {0: "n"}},
        dynamo=False,
    )
    (tmp_path / "bad.onnx").write_bytes(b"nope" * 50)
    save_det_model(tmp_path / "det.onnx")
    cases = [
        (("tune", "m.onnx"), "dynamic dimension"),
        (("tune", "m.onnx", "--input-shape", "0,3,8,8"), "size 0"),
        (("tune", "m.onnx", "--input-shape", "1,3,8,8", "--input-shape", "1,3,8,8"), "1 inputs but 2 example inputs"),
        (("tune", "bad.onnx"), "not a valid ONNX model"),
        (("tune", "det.onnx"), "does not support: Det"),
        (("tune", "matmul-512", "--batch", "2"), "fixed shapes"),
    ]
    for args, expected, code, stderr in answers(cases, tmp_path, capfd):
        assert code == 2, (args, stderr)
        errors = [line for line in stderr.splitlines() if line.startswith("tuner: error")]
        assert len(errors) == 1 and expected in errors[0], stderr
