"""Kill the tuner at random instants and resume it; make a fifth of its candidates fail for real.

    .venv/bin/python experiments/chaos.py                  # 20 kills on tiny-resnet, then the fault run
    .venv/bin/python experiments/chaos.py --kills 5 --trials 48

1. An uninterrupted `tuner tune MODEL --trials N`: the reference latency and throughput.
2. The same command killed with SIGKILL at random instants (whatever it is doing: searching,
   building, timing, re-measuring the best, compiling) and started again each time, until it
   finishes; again on a fresh work dir until KILLS kills are done. After each kill: no worker
   outlives the tuner, and every measurement committed before the kill is still there at the end.
   At the end of each cycle: exactly N records, none twice, none half written (SQLite's integrity
   check, every row complete), and the result verified.
3. A run with 20% of candidates failing for real (measure.workers.faults: crashes, hangs, out of memory,
   NaN and wrong output, compiler crashes): it completes, every failure is recorded with its
   reason, and the cost in throughput against the reference is printed.

Writes chaos.json and chaos.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.database.workdir import WorkDir  # noqa: E402

TAG_ENV = "TENSOR_TUNER_CHAOS_TAG"  # inherited by the tuner's workers: finds them after a kill


@dataclass
class Tuner:
    """A `tuner tune` process started in the background."""

    process: subprocess.Popen
    tag: str
    stderr_path: Path

    def phase(self) -> str:
        """What the tuner was doing, from the last progress line it printed."""
        lines = self.stderr_path.read_text(errors="replace").splitlines()
        last = lines[-1] if lines else ""
        for marker, phase in (
            ("compiling", "compile"),
            ("re-measuring", "final re-measure"),
            ("trials", "search and measure"),
            ("tuning on", "start-up"),
        ):
            if marker in last:
                return phase
        return "start-up"


def start_tuner(args: list[str], cwd: Path, env: dict[str, str] | None = None, log_name: str = "tuner.stderr") -> Tuner:
    tag = uuid.uuid4().hex
    stderr_path = cwd / log_name
    environment = {
        **os.environ,
        **(env or {}),
        TAG_ENV: tag,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "tune", *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=environment,
        )
    return Tuner(process, tag, stderr_path)


def tagged_processes(tag: str) -> list[int]:
    """The processes (the tuner's workers among them) started with ``tag`` in their environment."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def orphans_after(tuner: Tuner, grace_seconds: float = 5.0) -> list[int]:
    """Processes of a dead tuner still alive after ``grace_seconds`` (should be none)."""
    deadline = time.monotonic() + grace_seconds
    while True:
        alive = tagged_processes(tuner.tag)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@dataclass
class DatabaseState:
    records: int
    candidates: set[tuple[int, str]] = field(default_factory=set)
    duplicates: int = 0
    incomplete: int = 0
    intact: bool = True


def read_database(path: Path) -> DatabaseState:
    """What the work dir's database holds, read without writing to it."""
    if not path.exists():
        return DatabaseState(0)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        intact = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute(
            "SELECT workload_id, candidate, trace, status, latency, samples, elapsed FROM records"
        ).fetchall()
    except sqlite3.Error:
        return DatabaseState(0, intact=False)
    finally:
        conn.close()
    keys = [(row[0], row[1]) for row in rows]
    incomplete = sum(1 for row in rows if not _complete(row))
    return DatabaseState(len(rows), set(keys), len(keys) - len(set(keys)), incomplete, intact)


def _complete(row: tuple) -> bool:
    _, candidate, trace, status, latency, samples, elapsed = row
    try:
        json.loads(trace)
        parsed = json.loads(samples) if samples else []
    except (TypeError, ValueError):
        return False
    if status == "ok" and (latency is None or not parsed):
        return False
    return bool(candidate) and elapsed is not None


def job_result(path: Path) -> dict:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='result'").fetchone()
        verified = conn.execute("SELECT COUNT(*) FROM records WHERE verified=1").fetchone()[0]
    finally:
        conn.close()
    return {**(json.loads(row[0]) if row else {}), "verified_records": verified}


def failures_by_kind(path: Path) -> Counter:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT status, error FROM records WHERE status != 'ok'").fetchall()
    finally:
        conn.close()
    kinds = Counter()
    for status, error in rows:
        text = (error or "").lower()
        kind = next((k for k, words in _FAILURE_WORDS.items() if any(w in text for w in words)), status)
        kinds[kind] += 1
    return kinds


_FAILURE_WORDS = {
    "build crash": ("build crashed",),
    "segfault": ("sigsegv",),
    "hang (timeout)": ("timed out",),
    "out of memory": ("out of memory",),
    "NaN output": ("nan or inf",),
    "wrong output": ("max relative error", "wrong"),
}


def kill_cycle(
    work_dir: Path, args: list[str], trials: int, kills_wanted: int, rng: random.Random, expected_seconds: float
) -> dict:
    """Kill the same command at random instants until ``kills_wanted`` kills or it finishes; then
    let it finish. Returns what was checked."""
    kills, phases, lost, orphans = 0, Counter(), 0, 0
    committed: set = set()
    while True:
        tuner = start_tuner([*args, "--work-dir", str(work_dir)], work_dir.parent, log_name=f"{work_dir.name}.stderr")
        if kills >= kills_wanted:
            tuner.process.wait()
            break
        instant = rng.uniform(0.5, expected_seconds)
        try:
            tuner.process.wait(timeout=instant)
            break  # finished before the kill instant: the cycle is complete
        except subprocess.TimeoutExpired:
            pass
        phases[tuner.phase()] += 1
        tuner.process.send_signal(signal.SIGKILL)
        tuner.process.wait()
        kills += 1
        orphans += len(orphans_after(tuner))
        state = read_database(WorkDir(work_dir).database)
        lost += len(committed - state.candidates)
        committed = state.candidates
    final = read_database(WorkDir(work_dir).database)
    lost += len(committed - final.candidates)
    result = job_result(WorkDir(work_dir).database) if tuner.process.returncode == 0 else {}
    return {
        "kills": kills,
        "phases": dict(phases),
        "exit": tuner.process.returncode,
        "records": final.records,
        "expected_records": trials,
        "lost": lost,
        "duplicated": final.duplicates,
        "half_written": final.incomplete + (0 if final.intact else 1),
        "orphans": orphans,
        "latency_after": result.get("latency_after"),
        "latency_before": result.get("latency_before"),
        "verified": bool(result.get("verified_records")),
    }


def timed_run(work_dir: Path, args: list[str], env: dict[str, str] | None = None) -> dict:
    started = time.monotonic()
    tuner = start_tuner([*args, "--work-dir", str(work_dir)], work_dir.parent, env, log_name=f"{work_dir.name}.stderr")
    tuner.process.wait()
    seconds = time.monotonic() - started
    if tuner.process.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {tuner.stderr_path.read_text()[-2000:]}")
    return {**job_result(WorkDir(work_dir).database), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-resnet")
    parser.add_argument("--trials", type=int, default=96)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments/results/chaos")
    options = parser.parse_args()
    out = options.out.resolve()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    args = [options.model, "--trials", str(options.trials), "--batch-size", "8", "--time-untuned"]
    rng = random.Random(options.seed)

    def fresh(name: str) -> Path:
        path = runs / name
        subprocess.run(["rm", "-rf", str(path)], check=True)
        return path

    print(f"reference: {' '.join(args)} uninterrupted", flush=True)
    reference = timed_run(fresh("reference"), args)
    cycles = []
    while sum(c["kills"] for c in cycles) < options.kills:
        left = options.kills - sum(c["kills"] for c in cycles)
        cycle = kill_cycle(
            fresh(f"killed-{len(cycles)}"), args, options.trials, min(left, 8), rng, reference["seconds"]
        )
        cycles.append(cycle)
        print(f"cycle {len(cycles)}: {json.dumps(cycle)}", flush=True)
    print(f"faults: {options.fault_rate:.0%} of candidates fail", flush=True)
    faulty = timed_run(fresh("faults"), args, {"TENSOR_TUNER_INJECT_FAULTS": str(options.fault_rate)})
    faults = failures_by_kind(WorkDir(runs / "faults").database)
    summary = {
        "model": options.model,
        "trials": options.trials,
        "kills_survived": sum(c["kills"] for c in cycles if c["exit"] == 0),
        "kills": sum(c["kills"] for c in cycles),
        "kill_phases": dict(sum((Counter(c["phases"]) for c in cycles), Counter())),
        "lost": sum(c["lost"] for c in cycles),
        "duplicated": sum(c["duplicated"] for c in cycles),
        "half_written": sum(c["half_written"] for c in cycles),
        "orphans": sum(c["orphans"] for c in cycles),
        "wrong_record_count": sum(1 for c in cycles if c["records"] != c["expected_records"]),
        "resumed_latency_ms": [round(c["latency_after"] * 1e3, 4) for c in cycles if c["latency_after"]],
        "reference_latency_ms": round(reference["latency_after"] * 1e3, 4),
        "reference_seconds": round(reference["seconds"], 1),
        "faults_seconds": round(faulty["seconds"], 1),
        "faults_by_kind": dict(faults),
        "faults_latency_ms": round(faulty["latency_after"] * 1e3, 4),
        "faults_verified": bool(faulty["verified_records"]),
        "cycles": cycles,
    }
    (out / "chaos.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "chaos.md").write_text(markdown(summary))
    print(markdown(summary))


def markdown(s: dict) -> str:
    resumed = ", ".join(f"{v:.3f}" for v in s["resumed_latency_ms"])
    phases = ", ".join(f"{k} {v}" for k, v in sorted(s["kill_phases"].items()))
    faults = ", ".join(f"{k} {v}" for k, v in sorted(s["faults_by_kind"].items()))
    return (
        f"| {s['model']}, {s['trials']} trials | result |\n|---|---|\n"
        f"| SIGKILLs survived | {s['kills_survived']} of {s['kills']} ({phases}) |\n"
        f"| measurements lost / duplicated / half-written | {s['lost']} / {s['duplicated']} / {s['half_written']} |\n"
        f"| runs ending with other than exactly {s['trials']} records | {s['wrong_record_count']} |\n"
        f"| worker processes outliving a killed tuner | {s['orphans']} |\n"
        f"| latency, uninterrupted / each resumed run (ms) | {s['reference_latency_ms']:.3f} / {resumed} |\n"
        f"| 20% faults: failures recorded by kind | {faults} |\n"
        f"| 20% faults: wall time vs uninterrupted | {s['faults_seconds']:.0f} s vs {s['reference_seconds']:.0f} s "
        f"({s['faults_seconds'] / s['reference_seconds']:.2f}x); latency {s['faults_latency_ms']:.3f} ms, verified: "
        f"{s['faults_verified']} |\n"
    )


if __name__ == "__main__":
    main()
