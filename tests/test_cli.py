"""The `tuner` command, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

import tvm


def tuner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_tune_report_apply(tmp_path):
    run = tuner("tune", "matmul-128", "--trials", "8", "--batch-size", "8", "--work-dir", "run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    progress = [line for line in run.stderr.splitlines() if "trials 8/8" in line]
    assert progress and "best" in progress[0] and "elapsed" in progress[0] and "eta" in progress[0]

    report = tuner("report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "run" / "report.md").read_text()
    assert "matmul-128" in md and "| 8 |" in md
    assert (tmp_path / "run" / "report.png").read_bytes()[:4] == b"\x89PNG"

    apply = tuner("apply", "run", "matmul-128", "-o", "out/mm.so", cwd=tmp_path)
    assert apply.returncode == 0, apply.stderr
    lib = tvm.runtime.load_module(str(tmp_path / "out" / "mm.so"))
    assert lib.entry_name == "main"


def test_bad_input_gives_one_line_and_a_nonzero_exit(tmp_path):
    cases = [
        (("tune", "matmul-12"), "did you mean|Did you mean"),
        (("tune", "matmul-128", "--target", "llvm -bogus=1"), "invalid target"),
        (("tune", "matmul-128", "--trials", "0"), "positive integer"),
        (("report", "nowhere"), "no tuning database"),
    ]
    for args, expected in cases:
        run = tuner(*args, cwd=tmp_path)
        assert run.returncode == 2, (args, run.stderr)
        errors = [line for line in run.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and __import__("re").search(expected, errors[0]), run.stderr


def test_help_explains_each_command(tmp_path):
    for command in ("tune", "apply", "report"):
        run = tuner(command, "--help", cwd=tmp_path)
        assert run.returncode == 0 and len(run.stdout.splitlines()) > 5


def test_workloads_lists_builtins(tmp_path):
    run = tuner("workloads", cwd=tmp_path)
    assert run.returncode == 0 and "matmul-512" in run.stdout and "tiny-resnet" in run.stdout
