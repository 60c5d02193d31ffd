"""A graph dynamo captured, made a model of its own: which of its arguments are runtime inputs, which
are weights (parameters and buffers, baked in as constants) and which are numbers (specialised to the
first call's), where its tensor outputs go in the structure it returns, and what keeps it from being
compiled at all (an in-place write to an input, a non-tensor output). ``tuner.torch_compile.backend`` uses it;
torch is imported only inside the functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GraphPlan",
    "Placeholders",
    "RunsInPyTorch",
    "Slot",
    "graph_constants",
    "plan_graph",
    "read_placeholders",
    "static_module",
]


class RunsInPyTorch(Exception):
    """Why a graph (or a call of it) runs in PyTorch instead, in words for the stderr line;
    ``unsupported``: the operators TVM's importer named, where that is why."""

    def __init__(self, why: str, unsupported: Sequence[str] = ()):
        super().__init__(why)
        self.unsupported = list(unsupported)


@dataclass(frozen=True)
class Slot:
    """What one argument of the graph is to the compiled model."""

    kind: str  # "input" (a runtime input), "weight" (baked in), "value" (a number, specialised)
    index: int  # of the runtime input, the weight or the value


@dataclass(frozen=True)
class Placeholders:
    """What dynamo's metadata says of a graph's arguments, read when the backend is handed the graph
    (dynamo drops the placeholders' ``grapharg`` once it is compiled)."""

    weights: frozenset[int]  # positions of modules' parameters and buffers
    dynamic: tuple[str, ...]  # the symbols of the dims dynamo made dynamic


def read_placeholders(gm: Any) -> Placeholders:
    import torch

    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    weights = frozenset(i for i, node in enumerate(placeholders) if _is_module_state(node))
    dynamic = [symbol for node in placeholders for symbol in _symbols(torch, node.meta.get("example_value"))]
    return Placeholders(weights, tuple(sorted(set(dynamic))))


@dataclass
class GraphPlan:
    """The graph at its first call: what each argument is, and where its tensor outputs go."""

    slots: list[Slot]
    inputs: list[Any]  # the first call's runtime input tensors
    weights: list[Any]  # baked-in tensors: dynamo's parameters and buffers, and the graph's own constants
    weight_args: list[int]  # argument positions of the weights passed as arguments
    values: list[Any]  # the first call's numbers (SymInt arguments), specialised
    out_spec: Any  # the pytree structure of the graph's output
    out_leaves: list[Any]  # None where a tensor output goes, else the constant leaf itself
    dynamic: list[str]  # the symbols of the dims dynamo made dynamic

    def assemble(self, inputs: Sequence[Any], weights: Sequence[Any]) -> list[Any]:
        """The graph's arguments from the runtime inputs and the weights."""
        pools = {"input": inputs, "weight": weights, "value": self.values}
        return [pools[slot.kind][slot.index] for slot in self.slots]

    def output(self, tensors: Sequence[Any]) -> Any:
        """The graph's output structure around the compiled model's tensors."""
        from torch.utils import _pytree as pytree

        produced = iter(tensors)
        leaves = [next(produced) if leaf is None else leaf for leaf in self.out_leaves]
        return pytree.tree_unflatten(leaves, self.out_spec)


def plan_graph(gm: Any, args: tuple, target: str, known: Placeholders) -> GraphPlan:
    """What each argument of ``gm`` is, from the placeholders' dynamo metadata (``known``) and the real
    ``args``; RunsInPyTorch where the graph cannot be compiled as a model."""
    import torch
    from torch.utils import _pytree as pytree

    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(args):
        raise RunsInPyTorch(f"it takes {len(placeholders)} arguments but was called with {len(args)}")
    mutated = _mutated_inputs(gm)
    if mutated:
        raise RunsInPyTorch(f"it writes to its input(s) {', '.join(mutated)} in place, which a compiled model cannot")
    device = "cuda" if target.split()[0] == "cuda" else "cpu"
    slots, inputs, weights, weight_args, values = [], [], [], [], []
    for position, (node, arg) in enumerate(zip(placeholders, args, strict=True)):
        if isinstance(arg, torch.Tensor):
            if arg.device.type != device:
                raise RunsInPyTorch(
                    f"its tensors are on {arg.device.type} but the target is {target.split()[0]}: pass "
                    f"options={{'target': '{'cuda' if arg.device.type == 'cuda' else 'llvm'}'}}"
                )
            if position in known.weights or isinstance(arg, torch.nn.Parameter):
                slots.append(Slot("weight", len(weights)))
                weights.append(arg)
                weight_args.append(position)
            else:
                slots.append(Slot("input", len(inputs)))
                inputs.append(arg)
        elif isinstance(arg, (int, float, bool)):
            slots.append(Slot("value", len(values)))
            values.append(arg)
        else:
            raise RunsInPyTorch(f"its argument {node.name} is a {type(arg).__name__}, not a tensor or a number")
    if not inputs:
        raise RunsInPyTorch("it takes no input tensors (only weights): nothing to compile")
    output = next(node for node in gm.graph.nodes if node.op == "output")
    leaves, spec = pytree.tree_flatten(output.args[0])
    out_leaves = []
    for leaf in leaves:
        if isinstance(leaf, torch.fx.Node):
            value = leaf.meta.get("example_value")
            if value is not None and not isinstance(value, torch.Tensor):
                raise RunsInPyTorch(f"it returns a {type(value).__name__} ({leaf.name}), not only tensors")
            out_leaves.append(None)
        else:
            out_leaves.append(leaf)
    if all(leaf is not None for leaf in out_leaves):
        raise RunsInPyTorch("it returns no tensors")
    for attr in graph_constants(gm):  # tensors the graph holds itself (non-inlined modules, constants)
        weights.append(attr)
    return GraphPlan(slots, inputs, weights, weight_args, values, spec, out_leaves, list(known.dynamic))


def _is_module_state(node: Any) -> bool:
    """A parameter or buffer of a module, which dynamo passes as an argument (its ``source`` says)."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return False
    try:
        from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    except ImportError:  # a torch without it: only Parameters are weights, buffers stay inputs
        return False
    return bool(is_from_unspecialized_param_buffer_source(source))


def _symbols(torch: Any, example: Any) -> list[str]:
    if isinstance(example, (torch.SymInt, torch.SymFloat)):
        dims = [example]
    elif isinstance(example, torch.Tensor):
        dims = [d for d in example.shape if isinstance(d, torch.SymInt)]
    else:
        return []
    return [str(d) for d in dims if not str(d).lstrip("-").replace(".", "", 1).isdigit()]  # not a constant


_INPLACE_OPERATORS = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor"}
_INPLACE_OPERATORS |= {"ilshift", "irshift", "imatmul", "setitem"}


def _mutated_inputs(gm: Any) -> list[str]:
    """Arguments of ``gm`` an in-place operation writes to (``x.add_(1)``, ``x += 1``, ``x[0] = 1``,
    ``F.relu(x, inplace=True)``): a compiled model returns new tensors instead."""
    mutated = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or not node.args:
            continue
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))
        name = str(name).split(".")[0]
        inplace = (name.endswith("_") and not name.startswith("_")) or name in _INPLACE_OPERATORS
        inplace = inplace or node.kwargs.get("inplace") is True
        first = node.args[0]
        if inplace and getattr(first, "op", None) == "placeholder" and first.name not in mutated:
            mutated.append(first.name)
    return mutated


def graph_constants(gm: Any) -> list[Any]:
    """Tensors ``gm`` holds itself, in a fixed order: its state dict and the constants its get_attr
    nodes read."""
    import torch

    tensors = [t for _, t in sorted(gm.state_dict(keep_vars=True).items())]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value: Any = gm
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor) and not any(value is t for t in tensors):
                tensors.append(value)
    return tensors


def static_module(torch: Any, gm: Any, plan: GraphPlan, name: str) -> Any:
    """``gm`` as an ``nn.Module`` of its runtime inputs alone: its weights as buffers (constants to
    TVM), its numbers fixed at the first call's, its tensor outputs as a flat tuple."""
    from torch.utils import _pytree as pytree

    passed = len(plan.weight_args)  # the weights dynamo passes; the rest are gm's own

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph_module = gm
            for i, weight in enumerate(plan.weights[:passed]):
                self.register_buffer(f"weight{i}", weight.detach().cpu())

        def forward(self, *inputs: Any) -> tuple:
            weights = [getattr(self, f"weight{i}") for i in range(passed)]
            leaves = pytree.tree_leaves(self.graph_module(*plan.assemble(inputs, weights)))
            return tuple(leaf for leaf, slot in zip(leaves, plan.out_leaves, strict=True) if slot is None)

    Graph.__name__ = Graph.__qualname__ = name
    return Graph().eval()
