"""Part of a graph in TVM, the rest in PyTorch.

Where TVM's importer refuses some operators of a graph, the graph is exported to ATen operators (as
the importer sees it) and cut by torch.fx's ``CapabilityBasedPartitioner`` into pieces of the
operators TVM takes, with the refused ones between them. Each piece that holds a matmul or a
convolution is tuned and compiled as a model of its own; the rest runs in PyTorch (a tuning run
for a few elementwise operators would cost more than it could save). Torch is imported only inside
the functions.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HEAVY_OPS", "Piece", "Split", "split_graph"]

# ATen operators (as the export leaves them) worth a tuning run of their own
HEAVY_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "matmul", "linear"})
PIECE_PREFIX = "tvm_piece_"


@dataclass
class Piece:
    """A part of the split graph that TVM takes: a GraphModule of ATen operators, its weights held as
    attributes, and its inputs at the first call."""

    name: str  # its submodule's name in the split graph
    module: Any
    examples: list[Any]

    @property
    def returns_tuple(self) -> bool:
        output = next(node for node in self.module.graph.nodes if node.op == "output")
        return isinstance(output.args[0], (tuple, list))


@dataclass
class Split:
    """The graph with its pieces as submodules: called with the runtime inputs, it returns the graph's
    tensor outputs as a flat tuple; a piece runs in PyTorch until ``install`` gives it a compiled model."""

    graph: Any
    pieces: list[Piece]
    refused: list[str]  # the operators that run in PyTorch
    installed: list[str] = field(default_factory=list)

    def install(self, piece: Piece, compiled: Any) -> None:
        """Run ``piece`` with ``compiled`` (a ``tuner.runtime.compiled_model.CompiledModel`` of it) from now on."""
        setattr(self.graph, piece.name, _compiled_piece(compiled, piece.returns_tuple))
        self.installed.append(piece.name)

    def __call__(self, *inputs: Any) -> list[Any]:
        return list(self.graph(*inputs))


def split_graph(module: Any, examples: Sequence[Any], refused: Collection[str]) -> Split | None:
    """``module`` (an ``nn.Module`` of ``examples`` returning a tuple of tensors) cut into pieces TVM
    takes around the ATen operators in ``refused`` (as TVM's importer names them, e.g.
    ``"erfinv.default"``); None where no piece is worth tuning."""
    import torch
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    refused = set(refused)

    class TvmTakes(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            if node.op == "get_attr":  # weights go into the piece that uses them, as constants
                return True
            return node.op == "call_function" and _op_name(node) not in refused

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation notices
        graph = torch.export.export(module, tuple(examples)).run_decompositions().module()
    partitioner = CapabilityBasedPartitioner(graph, TvmTakes(), allows_single_node_partition=True)
    partitions = [
        partition
        for partition in partitioner.propose_partitions()
        if any(_op_name(node).split(".")[0] in HEAVY_OPS for node in partition.nodes)
    ]
    if not partitions:
        return None
    graph = partitioner.fuse_partitions(partitions, prefix=PIECE_PREFIX)
    examples_of = _piece_inputs(torch, graph, examples)
    pieces = [
        Piece(name, submodule, examples_of[name])
        for name, submodule in graph.named_children()
        if name.startswith(PIECE_PREFIX) and name in examples_of
    ]
    left = sorted({_op_name(node) for node in graph.graph.nodes if _op_name(node) in refused})
    return Split(graph, sorted(pieces, key=lambda piece: piece.name), left)


def _op_name(node: Any) -> str:
    return getattr(node.target, "__name__", "") if node.op == "call_function" else ""


def _piece_inputs(torch: Any, graph: Any, examples: Sequence[Any]) -> dict[str, list[Any]]:
    """Each piece's arguments when the split graph runs on ``examples``."""
    seen: dict[str, list[Any]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if str(target).startswith(PIECE_PREFIX):
                seen[str(target)] = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(graph).run(*examples)
    return seen


def _compiled_piece(compiled: Any, returns_tuple: bool) -> Any:
    """A submodule that runs a piece with its compiled model, returning what the piece returned."""
    import torch

    class CompiledPiece(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.compiled = compiled

        def forward(self, *args: Any) -> Any:
            out = self.compiled(*args)
            out = out if isinstance(out, list) else [out]
            return tuple(out) if returns_tuple else out[0]

    return CompiledPiece()
