"""Every mistake a user can make, at both doors: the CLI answers with one `tuner: error:` line on
stderr and exit 2, tune()/apply() raise a TunerError with the same text, and nothing is changed."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tvm
from onnx_models import save_det_model, save_relu_model

from tuner import Objectives, TunerError, tune
from tuner.compile.apply import apply

pytest.importorskip("onnx")
NO_GPU = not tvm.cuda(0).exist


def _database(path: Path, *, schema: str | None = None, foreign: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    if foreign:
        conn.executescript(
            "CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO photos VALUES (1, 'cat');"
        )
    else:
        conn.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); INSERT INTO meta VALUES ('schema', "
            f"'{schema}');"
        )
    conn.commit()
    conn.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory, tuned_matmul) -> Path:
    """The inputs the cases point at, in one directory that each case runs in."""
    root = tmp_path_factory.mktemp("bad-inputs")
    save_relu_model(root / "dynamic.onnx")
    save_relu_model(root / "fixed.onnx", batch=1)
    save_det_model(root / "det.onnx")
    (root / "broken.onnx").write_bytes(b"not a protobuf" * 40)
    (root / "random" / "tuning.db").parent.mkdir()
    (root / "random" / "tuning.db").write_bytes(os.urandom(8192))
    good = tuned_matmul.database_path.read_bytes()
    (root / "truncated").mkdir()
    (root / "truncated" / "tuning.db").write_bytes(good[:2000])
    _database(root / "foreign" / "tuning.db", foreign=True)
    _database(root / "newer" / "tuning.db", schema="tensor-tuner/99")
    (root / "empty").mkdir()
    (root / "a-file").write_text("")
    os.symlink(tuned_matmul.work_dir, root / "tuned")
    return root


# (id, CLI arguments or None, tune()/apply() call or None, what the one line must say)
CASES = [
    ("unknown model", ["tune", "matmul-12"], lambda: tune("matmul-12"), r"unknown model 'matmul-12'.*'matmul-128'"),
    (
        "bad target",
        ["tune", "matmul-128", "--target", "llvm -bogus=1"],
        lambda: tune("matmul-128", target="llvm -bogus=1"),
        "invalid target",
    ),
    (
        "unknown target kind",
        ["tune", "matmul-128", "--target", "vulkan"],
        lambda: tune("matmul-128", target="vulkan"),
        "unsupported target kind 'vulkan'",
    ),
    (
        "unknown mcpu",
        ["tune", "matmul-128", "--target", "llvm -mcpu=znver9"],
        lambda: tune("matmul-128", target="llvm -mcpu=znver9"),
        "unknown CPU -mcpu=znver9.*'znver5'",
    ),
    (
        "unknown GPU arch",
        ["tune", "matmul-128", "--target", "cuda -arch=sm_99"],
        lambda: tune("matmul-128", target="cuda -arch=sm_99"),
        "unknown GPU architecture -arch=sm_99.*'sm_90'",
    ),
    (
        "negative trials",
        ["tune", "matmul-128", "--trials", "-5"],
        lambda: tune("matmul-128", trials=-5),
        "whole number",
    ),
    (
        "trials not a number",
        ["tune", "matmul-128", "--trials", "many"],
        lambda: tune("matmul-128", trials="many"),
        "whole number",
    ),
    (
        "unwritable work dir",
        ["tune", "matmul-128", "--work-dir", "a-file/run"],
        lambda: tune("matmul-128", work_dir="a-file/run"),
        "cannot write to work dir",
    ),
    (
        "missing ONNX file",
        ["tune", "missing.onnx"],
        lambda: tune("missing.onnx"),
        "ONNX file missing.onnx does not exist",
    ),
    ("malformed ONNX file", ["tune", "broken.onnx"], lambda: tune("broken.onnx"), "not a valid ONNX model"),
    ("unsupported operator", ["tune", "det.onnx"], lambda: tune("det.onnx"), "does not support: Det"),
    ("dynamic shape", ["tune", "dynamic.onnx"], lambda: tune("dynamic.onnx"), "dynamic dimension"),
    (
        "wrong input shape",
        ["tune", "fixed.onnx", "--input-shape", "1,3,9,8"],
        lambda: tune("fixed.onnx", example_inputs=[(1, 3, 9, 8)]),
        r"has shape \(1, 3, 8, 8\) but",
    ),
    (
        "wrong input count",
        ["tune", "fixed.onnx", "--input-shape", "1,3,8,8", "--input-shape", "1,3,8,8"],
        lambda: tune("fixed.onnx", example_inputs=[(1, 3, 8, 8)] * 2),
        "1 inputs but 2 example inputs",
    ),
    (
        "wrong input dtype",
        None,
        lambda: tune("fixed.onnx", example_inputs=[__import__("numpy").zeros((1, 3, 8, 8), "int64")]),
        "takes float32 but the example input is int64",
    ),
    (
        "malformed --input-shape",
        ["tune", "dynamic.onnx", "--input-shape", "1,x,3"],
        None,
        "expected a shape like 1,3,224,224",
    ),
    ("malformed --plateau", ["tune", "matmul-128", "--plateau", "abc"], None, "expected BATCHES,PERCENT"),
    ("malformed --task-plateau", ["tune", "matmul-128", "--task-plateau", "4"], None, "expected BATCHES,PERCENT"),
    (
        "zero time budget",
        ["tune", "matmul-128", "--max-seconds", "0"],
        lambda: tune("matmul-128", stop=Objectives(seconds=0)),
        "positive",
    ),
    (
        "negative task budget",
        ["tune", "matmul-128", "--task-trials", "-2"],
        lambda: tune("matmul-128", task_stop=Objectives(trials=-2)),
        "positive",
    ),
    (
        "energy budget without counters",
        ["tune", "matmul-128", "--max-joules", "10"],
        lambda: tune("matmul-128", stop=Objectives(joules=10)),
        "energy budget.*needs energy readings",
    ),
    (
        "bad Ray address",
        ["tune", "matmul-128", "--ray", "nonsense"],
        lambda: tune("matmul-128", cluster="nonsense"),
        "'nonsense' is not a Ray address",
    ),
    (
        "nothing at the Ray address",
        ["tune", "matmul-128", "--cluster", "127.0.0.1:1"],
        lambda: tune("matmul-128", cluster="127.0.0.1:1"),
        "nothing answers at 127.0.0.1:1",
    ),
    (
        "transfer from a missing dir",
        ["tune", "matmul-128", "--transfer-from", "nowhere"],
        lambda: tune("matmul-128", transfer_from=["nowhere"]),
        "cannot transfer from 'nowhere': no such directory",
    ),
    (
        "transfer from a foreign dir",
        ["tune", "matmul-128", "--transfer-from", "foreign"],
        lambda: tune("matmul-128", transfer_from=["foreign"]),
        "foreign.*not a tensor-tuner/2 database",
    ),
    (
        "tune on a random-bytes database",
        ["tune", "matmul-128", "--work-dir", "random"],
        lambda: tune("matmul-128", work_dir="random"),
        "random/tuning.db is not a usable tensor-tuner database",
    ),
    (
        "tune on a truncated database",
        ["tune", "matmul-128", "--work-dir", "truncated"],
        lambda: tune("matmul-128", work_dir="truncated"),
        "truncated/tuning.db is not a usable",
    ),
    (
        "tune on a foreign database",
        ["tune", "matmul-128", "--work-dir", "foreign"],
        lambda: tune("matmul-128", work_dir="foreign"),
        "SQLite file of something else \\(tables photos\\)",
    ),
    (
        "tune on a newer database",
        ["tune", "matmul-128", "--work-dir", "newer"],
        lambda: tune("matmul-128", work_dir="newer"),
        "written by a newer tensor-tuner \\(schema tensor-tuner/99",
    ),
    ("report of a random-bytes database", ["report", "random"], None, "not a usable tensor-tuner database"),
    ("report of a newer database", ["report", "newer"], None, "written by a newer tensor-tuner"),
    ("report of a truncated database", ["report", "truncated"], None, "not a usable tensor-tuner database"),
    ("report of a foreign database", ["report", "foreign"], None, "SQLite file of something else"),
    ("report of a dir with no database", ["report", "empty"], None, "holds no tuning database"),
    (
        "apply from a random-bytes database",
        ["apply", "random", "matmul-128", "-o", "m.so"],
        lambda: apply("random", "matmul-128", "m.so"),
        "not a usable",
    ),
    (
        "apply from a newer database",
        ["apply", "newer", "matmul-128", "-o", "m.so"],
        lambda: apply("newer", "matmul-128", "m.so"),
        "written by a newer tensor-tuner",
    ),
    (
        "apply from a truncated database",
        ["apply", "truncated", "matmul-128", "-o", "m.so"],
        lambda: apply("truncated", "matmul-128", "m.so"),
        "not a usable",
    ),
    (
        "apply from a foreign database",
        ["apply", "foreign", "matmul-128", "-o", "m.so"],
        lambda: apply("foreign", "matmul-128", "m.so"),
        "something else",
    ),
    (
        "apply from a dir with no database",
        ["apply", "empty", "matmul-128", "-o", "m.so"],
        lambda: apply("empty", "matmul-128", "m.so"),
        "holds no tuning database",
    ),
    (
        "apply to a model with no tuned kernel",
        ["apply", "tuned", "matmul-512", "-o", "m.so"],
        lambda: apply("tuned", "matmul-512", "m.so"),
        "no verified schedule for any of the 1 kernels of matmul-512",
    ),
]
if NO_GPU:
    CASES.append(
        (
            "cuda without a GPU",
            ["tune", "matmul-128", "--target", "cuda"],
            lambda: tune("matmul-128", target="cuda"),
            "cannot tune for 'cuda' here: no CUDA GPU",
        )
    )

_DATABASES = ("random", "truncated", "foreign", "newer")


def _fingerprint(root: Path) -> dict[str, bytes]:
    return {name: (root / name / "tuning.db").read_bytes() for name in _DATABASES}


def _cli(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    if args[0] == "tune" and "--work-dir" not in args:  # cases run two at a time: one work dir each
        args = [*args, "--work-dir", f"runs/{abs(hash(tuple(args)))}"]
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=root, timeout=300
    )


def test_there_are_at_least_twenty_cases_at_each_door():
    assert sum(1 for case in CASES if case[1]) >= 20 and sum(1 for case in CASES if case[2]) >= 20


# a process per case (over a minute): the Python door below checks every case's text in CI, and test_cli checks
# that the command line turns such errors into one line and exit 2
@pytest.mark.slow
def test_every_mistake_at_the_command_line_is_one_line_and_exit_2(files):
    before = _fingerprint(files)
    cli_cases = [case for case in CASES if case[1]]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda case: _cli(files, case[1]), cli_cases))
    wrong = []
    for (name, _, _, expected), run in zip(cli_cases, runs, strict=True):
        lines = run.stderr.strip().splitlines()
        if not (
            run.returncode == 2
            and len(lines) == 1
            and lines[0].startswith("tuner: error: ")
            and re.search(expected, lines[0])
        ):
            wrong.append((name, run.returncode, run.stderr[-1500:]))
    assert not wrong, wrong
    assert _fingerprint(files) == before, "a refused database was changed"


def test_a_malformed_option_points_to_help_instead_of_printing_the_usage(files):
    run = _cli(files, ["tune", "matmul-128", "--plateau", "abc"])
    assert run.stderr.strip().splitlines() == [
        "tuner: error: argument --plateau: expected BATCHES,PERCENT like 4,1 (1% over 4 batches), got 'abc' (see "
        "`tuner tune --help`)"
    ]


def test_every_mistake_in_python_raises_a_tuner_error_with_the_same_text(files, monkeypatch):
    monkeypatch.chdir(files)
    before = _fingerprint(files)
    wrong = []
    for name, _, call, expected in CASES:
        if call is None:
            continue
        try:
            call()
            wrong.append((name, "no error"))
        except TunerError as err:
            if not re.search(expected, str(err)) or "\n" in str(err):
                wrong.append((name, str(err)))
        except Exception as err:  # noqa: BLE001 - reported with the others
            wrong.append((name, f"{type(err).__name__}: {err}"))
    assert not wrong, wrong
    assert _fingerprint(files) == before, "a refused database was changed"
