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
        early, at_budget = (curve["checkpoints"][f"tuned {minute} min{suffix}"] for minute in ("0.4", "0.6"))
        run = curve["tune"][start]
        assert early["records"] == sum(1 for t in created if t <= run["started"] + 60 * early["minute"])
        assert early["trials"] == early["records"]  # resumed, it measured nothing new
        # at the full budget the point is the run's own model, as the user got it
        assert at_budget["artifact"] == run["artifact"] and at_budget["records"] == run["trials"]
        assert 0 < early["records"] <= at_budget["records"]
    timing = curve["timing"]
    for label in [*curve["checkpoints"], "PyTorch eager", "ONNX Runtime"]:
        assert timing["latency"][label] > 0 and timing["errors"][label] < 1e-5, (label, timing)
    table = (out / "tiny-resnet.md").read_text()
    assert "| tuned 0.6 min |" in table and "| tuned 0.6 min, random start |" in table and "| trials=0 |" in table
    summary = (out / "summary.md").read_text()
    assert "| tiny-resnet |" in summary and "0.6 min" in summary and "within 10%" in summary
