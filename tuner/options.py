"""``TuneOptions``: every setting of a tuning run but the model, each defined once, with what it means.

``tune()`` takes them as its keywords and ``tuner tune`` as its flags (``tuner.cli.tune_flags``); a
test holds both to these fields, names and defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only named in annotations: the command line reads these fields without loading TVM
    import tvm

    from costmodel import FilterSettings
    from tuner.lowering import LoweringOptions
    from tuner.search.objectives import Objectives


def _setting(default: Any, meaning: str) -> Any:
    return field(default=default, metadata={"meaning": meaning})


@dataclass(frozen=True)
class TuneOptions:
    """Every setting of a tuning run but the model (``describe_settings()`` lists what each means)."""

    target: str | dict | tvm.target.Target = _setting(
        "llvm", "what to tune for: 'llvm' (this CPU), 'cuda', 'cuda -arch=sm_90', a tag, a dict or a Target"
    )
    trials: int | None = _setting(
        None,
        "candidates measured in total, counting earlier runs in the same work_dir: running again on a work dir "
        "resumes it and measures nothing twice",
    )
    work_dir: str | Path | None = _setting(
        None, "where the database, logs and compiled model go (default: tuner-runs/MODEL-KIND)"
    )
    stop: Objectives | None = _setting(
        None,
        "cost objectives for the whole run (time, e.g. Objectives(seconds=600), energy, money, or no improvement); "
        "the first one met ends it. Time is this call's wall clock, everything included: the search stops early "
        "enough for the final re-timing, the compile, the end-to-end check and the timing to end within it (a "
        "resumed work dir gets the whole budget again; too short a budget to measure anything gives the analytic "
        "schedules, as trials=0)",
    )
    task_stop: Objectives | None = _setting(None, "the same per task: a task that meets one gets no more trials")
    scheduler: str = _setting(
        "gradient", "'gradient' (trials go where they cut the model's latency most) or 'round-robin'"
    )
    filter: bool | FilterSettings = _setting(
        True,
        "False measures every candidate the search proposes instead of skipping those the cost model predicts to "
        "be poor; a costmodel.FilterSettings sets how much it filters",
    )
    example_inputs: Sequence[Any] | None = _setting(
        None,
        "a torch.nn.Module's inputs (tensors or shapes), or the shapes an ONNX file's inputs leave symbolic",
    )
    batch: int | None = _setting(None, "a built-in model's batch size")
    dtype: str | None = _setting(
        None,
        "'float16' computes convolutions and matmuls in half precision accumulating in float32; 'bfloat16' from "
        "bf16 operands into float32 with the CPU's bf16 dot product; inputs and outputs keep their dtypes",
    )
    batch_size: int | None = _setting(None, "candidates measured per round (default: chosen from the budget)")
    build_workers: int | None = _setting(None, "parallel build processes (default: one per core)")
    seed: int = _setting(1, "the random seed of the search")
    verify: bool = _setting(
        True, "only schedules whose outputs match the unscheduled kernel's reach the compiled model"
    )
    progress: bool = _setting(True, "a progress line per measured batch on stderr")
    transfer_from: Sequence[str | Path] | None = _setting(
        None,
        "work dirs of earlier runs (other models) whose schedules for kernels of the same kind are tried first, "
        "and whose measurements warm-start the cost model",
    )
    cost_model_from: Sequence[str | Path] | None = _setting(
        None, "work dirs of earlier runs whose measurements warm-start the cost model, without their schedules"
    )
    cluster: str | None = _setting(
        None,
        "build and measure on a Ray cluster: 'auto', 'HOST:PORT' of its head, 'ray://HOST:PORT', or 'local' (a "
        "private instance); None: this machine's own worker processes",
    )
    lowering: LoweringOptions | None = _setting(
        None, "how a model becomes kernels (tuner.lowering.LoweringOptions; docs/lowering.md)"
    )
    trials_per_task: int | None = _setting(
        None,
        "the budget per kernel instead: trials becomes that many times the number of tasks (the scheduler still "
        "gives more to the tasks where they pay)",
    )
    cold_cache: bool = _setting(
        False,
        "time each CPU kernel with its arguments flushed from the caches, as it meets data written by other "
        "kernels inside a model (GPU kernels are always timed with the L2 flushed)",
    )
    verbose: bool = _setting(
        False,
        "let TVM's own log lines reach the terminal (by default they go to the work dir's logs/libraries.log; "
        "TENSOR_TUNER_VERBOSE=1 does the same)",
    )
    analytic_start: bool = _setting(
        True,
        "each kernel's search starts from its analytic schedule and three schedules one step around it; False "
        "starts from the design spaces' random samples, as stock MetaSchedule does (kernels never measured still "
        "get their analytic schedule)",
    )
    time_untuned: bool = _setting(
        False,
        "also compile and time the model with TVM's default schedules, for the summary's before and after "
        "(minutes on a large model, whose untuned products run 26-680x slower than tuned)",
    )
    partition: bool = _setting(
        True,
        "a torch module with operators TVM's importer refuses is cut around them: its pieces that hold a matmul "
        "or convolution are tuned and compiled, the refused operators run in PyTorch between them (docs/"
        "partition.md); False refuses the module instead",
    )
    pipeline: bool | None = _setting(
        None,
        "search for and submit the next batch while the engine still builds and times the last one, the search "
        "working from a cost model one batch behind (docs/engine.md); None: where candidates are timed while others "
        "build (GPUs), True or False: always or never",
    )

    @property
    def filter_settings(self) -> FilterSettings:
        from costmodel import FilterSettings

        if isinstance(self.filter, FilterSettings):
            return self.filter
        return FilterSettings(enabled=bool(self.filter))

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any]) -> TuneOptions:
        """The options among ``keywords`` (a call's arguments, say), every field taken from them."""
        return cls(**{f.name: keywords[f.name] for f in fields(cls)})


def describe_settings(indent: str = "    ") -> str:
    """One line per setting, ``name``: what it means, for ``tune()``'s docstring."""
    return "\n".join(f"{indent}``{f.name}``: {f.metadata['meaning']}." for f in fields(TuneOptions))
