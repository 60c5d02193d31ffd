"""experiments/budget_curve.py: each checkpoint is the run as it would have ended then, and the
curve is timed beside the fp32 runtimes with its errors."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


@pytest.mark.slow  # about two minutes on 2 cores: out of CI (`pytest -m slow`)
def test_a_checkpoint_measures_nothing_new_and_every_point_matches_pytorch(tmp_path):
    out = tmp_path / "curve"
    command = [sys.executable, "experiments/budget_curve.py", "--model", "tiny-resnet", "--out", str(out)]
    checkpoints = ["--checkpoints", "0.4", "0.6", "--starts", "analytic", "random"]
    subprocess.run([*command, "--minutes", "0.6", *checkpoints], cwd=ROOT, check=True, timeout=1200)
    curve = json.loads((out / "tiny-resnet.json").read_text())
    assert curve["checkpoints"]["trials=0"]["records"] == 0
    for start, suffix in (("analytic", ""), ("random", ", random start")):
        with sqlite3.connect(out / "runs" / "tiny-resnet" / start / "work" / "tuning.db") as conn:
            created = sorted(row[0] for row in conn.execute("SELECT created FROM records"))
        points = [curve["checkpoints"][f"tuned {minute} min{suffix}"] for minute in ("0.4", "0.6")]
        for point in points:
            cutoff = curve["tune"][start]["started"] + 60 * point["minute"]
            assert point["records"] == sum(1 for t in created if t <= cutoff)
            assert point["trials"] == point["records"]  # resumed, it measured nothing new
        assert 0 < points[0]["records"] <= points[1]["records"] <= len(created)
    timing = curve["timing"]
    for label in [*curve["checkpoints"], "PyTorch eager", "ONNX Runtime"]:
        assert timing["latency"][label] > 0 and timing["errors"][label] < 1e-5, (label, timing)
    table = (out / "tiny-resnet.md").read_text()
    assert "| tuned 0.6 min |" in table and "| tuned 0.6 min, random start |" in table and "| trials=0 |" in table
