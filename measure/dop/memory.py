"""What the DOP controller learned, remembered across runs on the same machine and device.

Without it every run starts the controller at DOP 1: on a CPU where two candidates at once never
measure right, each run climbs to 2, loses, re-measures that window alone and probes again; on a
GPU each run climbs slowly back to the DOP that holds. With it a run starts where the last one on
this machine left off: the DOP, where losses start, and the probe cooldown and loss streak.

One JSON file, ``dop_memory.json`` in the user cache (``~/.cache/tensor-tuner``, or
``$TENSOR_TUNER_CACHE_DIR``), holds one entry per machine key (``machine_key``). It is written
atomically (a temporary file renamed over it). A missing, unreadable or unwritable file never
stops tuning: the problem is logged once and the run starts afresh. Delete the file, or its
entry, to make the controller forget.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from common.host import CACHE_DIR_ENV, cpu_model, user_cache_dir, write_atomically

from .controller import DopController, DopDecision, DopState

__all__ = ["CACHE_DIR_ENV", "DopMemory", "RememberedDop", "machine_key", "user_cache_dir"]

FILE_NAME = "dop_memory.json"
_FORMAT = 1

log = logging.getLogger("tensor_tuner.measure")


def machine_key(device: str, gpu_name: str | None = None) -> str:
    """Which machine and device a remembered DOP belongs to: the GPU's name for ``cuda`` (this host's
    name where the GPU's is unknown); host name, CPU model and core count for ``cpu``."""
    if device == "cuda":
        return f"cuda/{gpu_name or f'unnamed GPU on {platform.node()}'}"
    if device == "cpu":
        return f"cpu/{platform.node()}/{cpu_model()}/{os.cpu_count() or 1} cores"
    raise ValueError(f"no DOP memory for device kind {device!r}: expected 'cpu' or 'cuda'")


@dataclass(frozen=True)
class RememberedDop:
    state: DopState
    updated: datetime  # when a run last saved it

    @property
    def since(self) -> str:
        return self.updated.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


class _Unreadable(Exception):
    """The memory file exists but does not hold what this module writes."""


class DopMemory:
    """One machine's entry in the memory file. Its methods never raise: a file that cannot be
    read or written is reported once to the log (and kept in ``problem``) and the run goes on."""

    def __init__(self, key: str, path: Path | None = None):
        self.key = key
        self.path = Path(path) if path is not None else user_cache_dir() / FILE_NAME
        self.problem: str | None = None
        self._saved: DopDecision | None = None  # the latest decision whose outcome was saved

    def resume(self, controller: DopController) -> None:
        """Start ``controller`` where the last run on this machine left it, or say why it starts at 1."""
        remembered = self.load()
        if remembered is not None:
            controller.resume(remembered.state, since=remembered.since)
        else:
            controller.start = f"start: DOP 1 ({self.problem or 'nothing remembered for ' + self.key})"

    def save_new(self, controller: DopController) -> None:
        """Save ``controller``'s state if it has decided anything since the last save."""
        latest = controller.decisions[-1] if controller.decisions else None
        if latest is not None and latest is not self._saved:
            self.save(controller.state())
            self._saved = latest

    def load(self) -> RememberedDop | None:
        """This machine's entry, or None where there is none (or none that can be used)."""
        try:
            entry = self._read().get(self.key)
            return None if entry is None else _parse(entry)
        except (OSError, _Unreadable, ValueError, TypeError) as err:
            self._report(f"cannot use {self.path} ({err}); the DOP controller starts afresh")
            return None

    def save(self, state: DopState) -> bool:
        """Store ``state`` as this machine's entry, keeping the other machines'; False if it could not."""
        try:
            entries = self._read()
        except (OSError, _Unreadable) as err:
            self._report(f"cannot use {self.path} ({err}); it is replaced")
            entries = {}
        entries[self.key] = {**asdict(state), "updated": datetime.now(UTC).isoformat(timespec="seconds")}
        try:
            write_atomically(
                self.path, json.dumps({"format": _FORMAT, "machines": entries}, indent=1, sort_keys=True) + "\n"
            )
        except OSError as err:
            self._report(f"cannot save the DOP controller's state to {self.path} ({err}); the next run starts afresh")
            return False
        return True

    def _read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            content = json.loads(text)
        except ValueError as err:
            raise _Unreadable(f"not JSON: {err}") from None
        if (
            not isinstance(content, dict)
            or content.get("format") != _FORMAT
            or not isinstance(content.get("machines"), dict)
        ):
            raise _Unreadable(f"not a format-{_FORMAT} DOP memory file")
        return content["machines"]

    def _report(self, problem: str) -> None:
        if self.problem is None:
            log.warning("DOP memory: %s", problem)
        self.problem = problem


def _parse(entry: object) -> RememberedDop:
    if not isinstance(entry, dict):
        raise ValueError(f"an entry is {type(entry).__name__}, not an object")

    def count(name: str, least: int, optional: bool = False) -> int | None:
        value = entry.get(name)
        if value is None and optional:
            return None
        if type(value) is not int or value < least:
            raise ValueError(f"{name} is {value!r}, not a whole number >= {least}")
        return value

    updated = datetime.fromisoformat(entry.get("updated"))  # TypeError or ValueError if it is not a time
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    state = DopState(
        count("dop", 1), count("loss_dop", 1, optional=True), count("cooldown", 0), count("loss_streak", 0)
    )
    return RememberedDop(state, updated)
