"""What the correctness suite's tuning runs did to stay right, read from their work dirs: candidates
measured, candidates rejected by verification (``wrong_result``), kernels built with TVM's default
schedule (no verified candidate, no design space, a broken compile, a wrong model), and the share of
the runs' time the end-to-end check took.

    .venv/bin/python experiments/correctness_tally.py OUT [OUT ...]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.database.database import TuningDatabase  # noqa: E402
from tuner.database.workdir import ResultRecord, read_meta  # noqa: E402


def tally(out_dirs: list[Path]) -> dict:
    """Summed over every work dir (a directory holding ``tuning.db``) under ``out_dirs``."""
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for database in sorted(db for out in out_dirs for db in Path(out).rglob("tuning.db")):
        db = TuningDatabase(database, read_only=True)
        try:
            records = db.records()
            result = read_meta(db, ResultRecord)
        finally:
            db.close()
        totals["work dirs"] += 1
        totals["candidates measured"] += len(records)
        totals["rejected by verification"] += sum(1 for r in records if r.status == "wrong_result")
        if result is not None:
            totals["kernels fallen back"] += len(result.fell_back)
            reasons.update(_kind(why) for why in result.fell_back.values())
            check = result.check or {}
            totals["kernels left out by the end-to-end check"] += len(check.get("left_out", {}))
            if "end-to-end check" in result.seconds:  # runs since the check has been timed as a phase
                seconds["end-to-end check"] += result.seconds["end-to-end check"]
                seconds["whole runs"] += sum(result.seconds.values())
    share = seconds["end-to-end check"] / seconds["whole runs"] if seconds["whole runs"] else None
    return {
        **totals,
        "fallen back, by reason": dict(reasons),
        "end-to-end check, share of the runs' time": f"{share:.1%}" if share is not None else "-",
    }


def _kind(why: str) -> str:
    for kind in ("wrong", "not checked", "design space", "does not replay", "compile"):
        if kind in why:
            return kind
    return why


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="+", type=Path)
    for key, value in tally(parser.parse_args().out).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
