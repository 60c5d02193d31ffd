"""The ``torch.compile`` door: ``torch.compile(model, backend="tensor_tuner", options={...})``.

Dynamo hands the backend one FX graph at a time (a model with graph breaks gives several); each is a
model of its own. At its first call the graph is specialised to the shapes of that call, its
weights (the parameters and buffers dynamo passes as inputs) are baked in as constants, and it is
tuned and compiled by ``tune()``, with progress on stderr. The compiled library is kept in a cache on
disk under a key of everything that decides it (the graph's code, its input shapes and dtypes, the
weights' contents, the target, the budget and dtype asked for, and the tuner's, TVM's and torch's
versions), so the next process with the same model loads it and tunes nothing.

A graph that cannot be compiled (an operator TVM's importer does not take, an in-place write to an
input, a non-tensor output) runs in PyTorch, said in one line on stderr. So does a call the compiled
graph does not fit: other shapes of a graph dynamo made dynamic, or weights changed since it was
compiled. Outputs carry no autograd history: the tuner builds inference graphs.

The backend is registered under PyTorch's ``torch_dynamo_backends`` entry point (setup.cfg); torch is
imported only when it is used, so ``import tuner`` works without it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.error_text import error_line
from common.host import user_cache_dir
from tuner.errors import TunerError

from .cache import annotate, compile_into, key_of, load_library, read_entry
from .graph import GraphPlan, RunsInPyTorch, graph_constants, plan_graph, read_placeholders, static_module

__all__ = [
    "BACKEND_NAME",
    "OPTION_NAMES",
    "BackendOptions",
    "TunedGraph",
    "cache_key",
    "default_cache_dir",
    "tensor_tuner_backend",
]

BACKEND_NAME = "tensor_tuner"
OPTION_NAMES = ("target", "trials", "trials_per_task", "max_minutes", "dtype", "cache_dir", "progress")


def default_cache_dir() -> Path:
    """Where compiled graphs are kept unless ``options["cache_dir"]`` says otherwise: ``torch_compile``
    in the tuner's user cache (``$TENSOR_TUNER_CACHE_DIR`` or ``~/.cache/tensor-tuner``)."""
    return user_cache_dir() / "torch_compile"


@dataclass(frozen=True)
class BackendOptions:
    """``torch.compile``'s ``options`` for this backend, named as ``tune()`` names them.

    ``trials`` (in total) or ``trials_per_task`` set the trial budget, ``max_minutes`` a time budget per
    graph, its compile included (whichever is met first ends the tuning); with none of them a graph gets
    ``tune()``'s default
    budget. ``dtype`` is ``tune()``'s (``"float16"``, ``"bfloat16"``); ``progress=False``
    keeps the tuning quiet (a graph that runs in PyTorch is still said)."""

    target: str | dict = "llvm"
    trials: int | None = None
    trials_per_task: int | None = None
    max_minutes: float | None = None
    dtype: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    progress: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """The options ``torch.compile`` passed, checked; a TunerError names a wrong one."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise TunerError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for torch.compile's backend {BACKEND_NAME!r}: "
                f"it takes {', '.join(OPTION_NAMES)}"
            )
        for name in ("trials", "trials_per_task"):
            value = options.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise TunerError(f"option {name} must be a whole number (0: analytic schedules only), got {value!r}")
        minutes = options.get("max_minutes")
        if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0):
            raise TunerError(f"option max_minutes must be a positive number, got {minutes!r}")
        from workloads.precision import MODEL_DTYPES

        if options.get("dtype") not in (None, *MODEL_DTYPES):
            raise TunerError(f"option dtype must be one of {', '.join(MODEL_DTYPES)}, got {options['dtype']!r}")
        if not isinstance(options.get("target", "llvm"), (str, dict)):
            raise TunerError(f"option target must be a target string or dict, got {options['target']!r}")
        if "cache_dir" in options:
            options["cache_dir"] = Path(options["cache_dir"]).expanduser()
        options["progress"] = bool(options.get("progress", True))
        return cls(**options)

    def tune_budget(self) -> dict[str, Any]:
        """``trials``, ``trials_per_task`` and ``stop`` for ``tune()``, those given (none: its default)."""
        from tuner.search.objectives import Objectives

        budget: dict[str, Any] = {}
        if self.trials is not None:
            budget["trials"] = self.trials
        if self.trials_per_task is not None:
            budget["trials_per_task"] = self.trials_per_task
        if self.max_minutes is not None:
            budget["stop"] = Objectives(seconds=self.max_minutes * 60.0)
            budget.setdefault("trials", None)  # the time alone, unless a trial budget is given too
        return budget

    def tune_kwargs(self) -> dict[str, Any]:
        """Everything ``tune()`` is given but the model, its work dir and example inputs."""
        return {"target": self.target, "dtype": self.dtype, "progress": self.progress, **self.tune_budget()}

    def key_fields(self) -> dict[str, Any]:
        """The options that change what is compiled (the target is keyed resolved, apart)."""
        return {
            "dtype": self.dtype,
            "trials": self.trials,
            "trials_per_task": self.trials_per_task,
            "max_minutes": self.max_minutes,
        }


def tensor_tuner_backend(
    gm: Any, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None, mode: str | None = None
) -> TunedGraph:
    """The dynamo backend: ``gm`` (a ``torch.fx.GraphModule``) as a callable that tunes and compiles
    it at its first call, or loads it from the cache, and runs it with TVM from then on.

    ``example_inputs`` (possibly fake tensors) are not used: the first call's real arguments are.
    ``options``: see ``BackendOptions``. ``mode`` (torch.compile's) is accepted and ignored."""
    del example_inputs, mode
    parsed = BackendOptions.parse(options)
    from tuner.targets import resolve_target

    return TunedGraph(gm, parsed, str(resolve_target(parsed.target)))


class TunedGraph:
    """A captured graph as dynamo calls it: tuned, compiled (or loaded) and run by TVM, whole or in
    pieces around operators TVM cannot take, or run by PyTorch where it cannot be."""

    def __init__(self, gm: Any, options: BackendOptions, target: str):
        self.gm = gm
        self.options = options
        self.target = target
        compile_id = gm.meta.get("dynamo_compile_id") if hasattr(gm, "meta") else None
        self.name = f"graph {compile_id}" if compile_id is not None else "graph"
        self.placeholders = read_placeholders(gm)
        self.key: str | None = None
        self.fallback: str | None = None  # why it runs in PyTorch, once decided
        self.ready_seconds: float | None = None  # from the first call to ready to run
        self._run: Callable[[tuple], Any] | None = None
        self._said: set[str] = set()

    def __call__(self, *args: Any) -> Any:
        if self._run is None:
            started = time.monotonic()
            self._run = self._prepare(args)
            self.ready_seconds = time.monotonic() - started
        return self._run(args)

    # -- the first call ---------------------------------------------------------------------------
    def _prepare(self, args: tuple) -> Callable[[tuple], Any]:
        try:
            plan = plan_graph(self.gm, args, self.target, self.placeholders)
        except RunsInPyTorch as why:
            return self._in_pytorch(str(why))
        if plan.dynamic:
            self._say(
                f"{self.name} has dynamic dimensions ({', '.join(plan.dynamic)}); it is tuned for the shapes of its "
                f"first call {[tuple(x.shape) for x in plan.inputs]} and other shapes run in PyTorch: pass "
                "dynamic=False to torch.compile for a tuned graph per shape"
            )
        if _grad_wanted(args):
            self._say(
                f"{self.name}: its outputs carry no autograd history (the tuner compiles inference graphs): call "
                "the model under torch.no_grad() or torch.inference_mode()"
            )
        self.key = _key(self.gm, plan, self.target, self.options)
        entry = self.options.cache_dir / self.key
        known = read_entry(entry)
        try:
            if known is None:
                known = compile_into(
                    entry,
                    self._module(plan),
                    _examples(plan),
                    self.options.tune_kwargs(),
                    {"graph": self.name, "target": self.target},
                )
            elif known.get("fallback"):
                unsupported = known.get("unsupported", []) if known.get("pieces") != 0 else []
                raise RunsInPyTorch(f"{known['fallback']} (remembered in {entry})", unsupported)
            elif self.options.progress:
                self._say(f"{self.name} loaded from the cache ({entry}): {known.get('summary', '')}".rstrip(": "))
            return _CompiledRunner(self, plan, load_library(entry))
        except RunsInPyTorch as why:
            split = self._split(plan, why.unsupported, entry) if why.unsupported else None
            return _CompiledRunner(self, plan, split) if split is not None else self._in_pytorch(str(why))

    def _split(self, plan: GraphPlan, refused: list[str], entry: Path) -> Any:
        """The graph in pieces: those TVM takes tuned (or loaded) one by one, the rest in PyTorch; None
        where no piece is worth it (remembered in the graph's ``entry``), or splitting fails."""
        from tuner.partition.split import split_graph

        try:
            split = split_graph(self._module(plan), _examples(plan), refused)
        except Exception as err:  # noqa: BLE001 - export and partitioning are torch's: the whole graph in PyTorch
            self._say(f"{self.name}: splitting it around {', '.join(refused)} failed ({error_line(err)})")
            return None
        if split is None:
            annotate(entry, pieces=0)  # the next process does not export it again to find that out
            return None
        for piece in split.pieces:
            described = {"piece": piece.module.code, "inputs": [[list(x.shape), str(x.dtype)] for x in piece.examples]}
            described |= {"target": self.target, "options": self.options.key_fields()}
            entry = self.options.cache_dir / key_of(described, graph_constants(piece.module))
            try:
                known = read_entry(entry)
                if known is None:
                    record = {"graph": f"{self.name} {piece.name}", "target": self.target}
                    known = compile_into(entry, piece.module, piece.examples, self.options.tune_kwargs(), record)
                if known.get("fallback"):
                    continue
                split.install(piece, load_library(entry))
            except RunsInPyTorch:
                continue  # this piece stays in PyTorch
        if not split.installed:
            return None
        self._say(
            f"{self.name}: TVM cannot take {', '.join(split.refused)}: those run in PyTorch, the rest in "
            f"{len(split.installed)} compiled piece(s)"
        )
        return split

    def _module(self, plan: GraphPlan) -> Any:
        import torch

        return static_module(torch, self.gm, plan, "torch_compile_" + _identifier(self.name))

    def _in_pytorch(self, why: str) -> Callable[[tuple], Any]:
        self.fallback = why
        self._say(f"{self.name} runs in PyTorch: {why}")
        return self._eager

    def _eager(self, args: tuple) -> Any:
        return self.gm(*args)

    def _say(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            print(f"tuner: torch.compile: {text}", file=sys.stderr, flush=True)


class _CompiledRunner:
    """Calls of the compiled graph: the runtime inputs to TVM (or to the split graph), the output
    structure rebuilt. A call it does not fit (another shape, changed weights) runs in PyTorch."""

    def __init__(self, graph: TunedGraph, plan: GraphPlan, compiled: Any):
        self.graph = graph
        self.plan = plan
        self.compiled = compiled
        self.input_args = [i for i, slot in enumerate(plan.slots) if slot.kind == "input"]
        self.value_args = [(i, plan.values[slot.index]) for i, slot in enumerate(plan.slots) if slot.kind == "value"]
        self.weights = [(i, plan.weights[plan.slots[i].index]) for i in plan.weight_args]
        self.versions = [w._version for _, w in self.weights]
        self.shapes = [tuple(x.shape) for x in plan.inputs]

    def __call__(self, args: tuple) -> Any:
        misfit = self._misfit(args)
        if misfit is not None:
            self.graph._say(f"{self.graph.name}: {misfit}: that call runs in PyTorch")
            return self.graph.gm(*args)
        out = self.compiled(*[args[i] for i in self.input_args])
        return self.plan.output(out if isinstance(out, list) else [out])

    def _misfit(self, args: tuple) -> str | None:
        for (i, weight), version in zip(self.weights, self.versions, strict=True):
            if args[i] is not weight or weight._version != version:
                return "its weights changed since it was compiled (torch._dynamo.reset() compiles it again)"
        if self.plan.dynamic:
            for i, value in self.value_args:
                if args[i] != value:
                    return f"it was tuned for size {value}, this call has {args[i]}"
            for i, shape in zip(self.input_args, self.shapes, strict=True):
                if tuple(args[i].shape) != shape:
                    return f"it was tuned for input shape {shape}, this call has {tuple(args[i].shape)}"
        return None


def cache_key(gm: Any, args: Sequence[Any], options: BackendOptions | None = None) -> str:
    """The cache key of graph ``gm`` called with ``args``, as the backend computes it when dynamo hands
    it the graph: its code, input shapes and dtypes, specialised numbers, the weights' shapes, dtypes and
    contents, the resolved target, the options that change the result (dtype, budget), and the tuner's,
    TVM's and torch's versions. A TunerError where the graph would run in PyTorch (no entry of its own).
    Call it inside a backend: dynamo keeps the metadata that tells buffers from inputs only until then."""
    from tuner.targets import resolve_target

    options = options or BackendOptions()
    target = str(resolve_target(options.target))
    try:
        plan = plan_graph(gm, tuple(args), target, read_placeholders(gm))
    except RunsInPyTorch as why:
        raise TunerError(f"the graph runs in PyTorch: {why}") from None
    return _key(gm, plan, target, options)


def _key(gm: Any, plan: GraphPlan, target: str, options: BackendOptions) -> str:
    described = {
        "code": gm.code,
        "inputs": [[list(x.shape), str(x.dtype)] for x in plan.inputs],
        "values": [repr(v) for v in plan.values],
        "slots": [slot.kind for slot in plan.slots],
        "weights": [[list(w.shape), str(w.dtype)] for w in plan.weights],
        "outputs": [repr(leaf) for leaf in plan.out_leaves],
        "target": target,
        "options": options.key_fields(),
    }
    return key_of(described, plan.weights)


def _examples(plan: GraphPlan) -> list[Any]:
    return [x.detach().cpu() for x in plan.inputs]


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _grad_wanted(args: tuple) -> bool:
    import torch

    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in args)
