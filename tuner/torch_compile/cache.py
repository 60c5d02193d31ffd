"""The torch.compile door's cache on disk: one directory per compiled graph (or piece of one), named by
its key, holding the compiled model (``model.so`` with ``model.params`` and ``model.json``), the tuning
database and ``entry.json``; or ``entry.json`` alone for a graph TVM cannot take, so that the next process does
not try again.

An entry is tuned into a temporary directory beside its place and renamed into it in one step: a
reader sees a finished entry or none. Two processes tuning the same graph at once both finish; the
first rename wins and the other's copy is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.error_text import error_line
from tuner.errors import PARTITION_HINT, ModelError, TunerError

from .graph import RunsInPyTorch

__all__ = ["ENTRY_FILE", "LIBRARY_FILE", "annotate", "compile_into", "key_of", "load_library", "read_entry"]

ENTRY_FILE = "entry.json"
LIBRARY_FILE = "model.so"  # tune()'s artifact (tuner.database.workdir.ARTIFACT_FILE): .params, .json beside it
# what a work dir holds that the cache does not keep
_LEFTOVERS = ("untuned.so", "untuned.params", "logs", ".tuner.lock")


def key_of(described: dict[str, Any], tensors: Sequence[Any]) -> str:
    """A cache key: ``described`` (JSON-able: code, shapes, target, options) with the tuner's, TVM's
    and torch's versions, and the bytes of ``tensors`` (the weights)."""
    import torch
    import tvm

    versions = {"tensor-tuner": _tuner_version(), "tvm": tvm.__version__, "torch": torch.__version__}
    digest = hashlib.blake2b(json.dumps({**described, "versions": versions}, sort_keys=True).encode(), digest_size=20)
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b"")
    return digest.hexdigest()


def read_entry(entry: Path) -> dict | None:
    """A published entry's record; None where there is none (or an incomplete copy of one)."""
    try:
        record = json.loads((entry / ENTRY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or (not record.get("fallback") and not (entry / LIBRARY_FILE).is_file()):
        return None
    return record


def load_library(entry: Path) -> Any:
    """The compiled model of ``entry`` (a ``CompiledModel``); RunsInPyTorch if it is broken."""
    from tuner.runtime.compiled_model import load

    try:
        return load(entry / LIBRARY_FILE)
    except Exception as err:  # noqa: BLE001 - an entry broken on disk: PyTorch runs the graph, the line says the fix
        raise RunsInPyTorch(f"its cached library in {entry} cannot be loaded ({error_line(err)}): delete it") from None


def compile_into(entry: Path, module: Any, examples: Sequence[Any], tune_kwargs: dict[str, Any], record: dict) -> dict:
    """Tune and compile ``module`` (an ``nn.Module`` of ``examples``) with ``tune()`` and publish it as
    ``entry``; returns the entry's record. RunsInPyTorch where it cannot be: a model TVM cannot take
    (remembered in ``entry``, with the operators it names as ``unsupported``), a failed tuning, a cache
    that cannot be written. A TunerError about the options or the machine is the user's and is raised."""
    from tuner.api import tune
    from tuner.progress import format_latency

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as err:
        raise RunsInPyTorch(
            f"the cache dir {entry.parent} cannot be written ({err.strerror or err}): give a writable cache_dir"
        ) from None
    try:
        try:
            # partition=False: the door splits a graph itself, each piece cached on its own
            result = tune(module, work_dir=work, example_inputs=list(examples), partition=False, **tune_kwargs)
        except ModelError as err:  # the model itself cannot be imported: remembered, never tried again
            reason = f"TVM cannot take it: {error_line(err).removesuffix(PARTITION_HINT)}"
            unsupported = err.unsupported
            shutil.rmtree(work)
            work.mkdir()
            _write(work, {**record, "fallback": reason, "unsupported": unsupported})
            _publish(work, entry)
            raise RunsInPyTorch(reason, unsupported) from None
        except TunerError:
            raise
        except Exception as err:  # noqa: BLE001 - never a crash for a graph: PyTorch runs it
            raise RunsInPyTorch(f"tuning it failed ({type(err).__name__}: {error_line(err)})") from None
        for leftover in _LEFTOVERS:
            path = work / leftover
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        summary = f"tuned earlier, {result.trials} trials"
        if result.latency_after is not None and result.latency_before is not None:
            summary += (
                f", {format_latency(result.latency_before)} untuned -> {format_latency(result.latency_after)} tuned"
            )
        record = {**record, "summary": summary}
        _write(work, record)
        _publish(work, entry)
        return record
    except OSError as err:
        raise RunsInPyTorch(
            f"its cache entry {entry} cannot be written ({err.strerror or err}): give a writable cache_dir"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone already where it was published


def annotate(entry: Path, **facts: Any) -> None:
    """Add ``facts`` to a published entry's record (replaced in one step); best effort."""
    record = read_entry(entry)
    if record is None:
        return
    temporary = entry / f".{ENTRY_FILE}.{os.getpid()}"
    try:
        temporary.write_text(json.dumps({**record, **facts}, indent=1) + "\n")
        os.replace(temporary, entry / ENTRY_FILE)
    except OSError:
        temporary.unlink(missing_ok=True)


def _tuner_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensor-tuner")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _write(work: Path, record: dict) -> None:
    record = {**record, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (work / ENTRY_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _publish(work: Path, entry: Path) -> None:
    """Rename the finished ``work`` dir to ``entry`` in one step; where another process published the
    same key first, its entry stays and this copy is dropped."""
    try:
        os.rename(work, entry)
    except OSError:
        if read_entry(entry) is None:  # not a finished entry: a stale or foreign dir in the way
            shutil.rmtree(entry, ignore_errors=True)
            os.rename(work, entry)
