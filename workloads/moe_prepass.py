"""Mixture-of-experts operators of a torch.export program, rewritten before TVM's importer reads it
(``torch_prepass.prepare_exported_program`` calls ``rewrite_experts``).

transformers' experts (Mixtral, Qwen2-MoE, OLMoE, ...: ``integrations/moe.py``, the default
``experts_implementation="grouped_mm"``) sort the (token, chosen expert) rows by expert, count the rows
of each expert with ``histc`` and multiply each expert's run of rows by its weights with a grouped
matrix product: ``transformers::grouped_mm_fallback`` (an opaque custom op, what fp32 weights export
to) or ``aten._grouped_mm`` (bf16 weights). The importer takes neither, nor ``histc``. The "eager"
implementation does not export at all (a loop over ``nonzero()``'s experts), so the default is the door.

* A grouped product ``out[s] = x[s] @ w[g]`` for the row ``s`` in expert ``g``'s run
  (``offs[g-1] <= s < offs[g]``, ``offs`` the runs' cumulative ends; rows past ``offs[-1]`` are zeros)
  becomes a dense product of every row with every expert's weights, ``(E, S, N)``, masked by the
  rows' experts and summed over the experts. That is E times the products the routing needs, and at a
  fixed token count the only static-shaped form: how many rows each expert gets is data, and a
  product per expert over a gather of its rows would have to take all S rows anyway. The mask comes
  from ``offs`` itself, so the rewrite holds whatever produced the offsets.
* ``histc(x, bins, min, max)`` (``min < max``) becomes a one-hot sum: each value's bin
  ``floor((x - min) * bins / (max - min))``, ``max`` itself in the last bin, values outside
  ``[min, max]`` in none. PyTorch searches the bin edges near that position, so a value within rounding
  of an edge may land a bin over from PyTorch's; integer expert ids with ``bins = E`` do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.node import map_arg

_GROUPED_MM_FALLBACK = "transformers.grouped_mm_fallback.default"


def rewrite_experts(graph: torch.fx.Graph) -> bool:
    """Rewrite ``graph``'s grouped matrix products and histograms in place; whether any was."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if str(node.target) == _GROUPED_MM_FALLBACK:
            changed |= _replace(graph, node, grouped_mm_dense, list(node.args))
        elif node.target == torch.ops.aten._grouped_mm.default:
            changed |= _replace_aten_grouped_mm(graph, node)
        elif node.target == torch.ops.aten.histc.default:
            changed |= _replace_histc(graph, node)
    return changed


def grouped_mm_dense(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``x`` (S, K) by ``weight`` (E, K, N), each row by its expert's weights (``offs``: the experts'
    cumulative row counts), as a masked dense product."""
    rows = torch.arange(x.shape[0], device=x.device)
    expert = (rows[:, None] >= offs[None, :]).to(torch.int64).sum(-1)  # E for the rows past offs[-1]
    mask = expert[None, :] == torch.arange(weight.shape[0], device=x.device)[:, None]  # (E, S)
    return (torch.matmul(x.unsqueeze(0), weight) * mask.unsqueeze(-1).to(x.dtype)).sum(0)


def histogram_one_hot(x: torch.Tensor, bins: int, low: float, high: float) -> torch.Tensor:
    """``torch.histc(x, bins, low, high)`` for ``low < high``, as a sum of one-hot rows."""
    values = x.reshape(-1)
    position = torch.floor((values - low) * (bins / (high - low))).to(torch.int64)
    position = torch.where(values == high, bins - 1, position)
    inside = (values >= low) & (values <= high)
    hits = (position[:, None] == torch.arange(bins, device=x.device)[None, :]) & inside[:, None]
    return hits.to(x.dtype).sum(0)


def _replace_aten_grouped_mm(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    args = _arguments(node, ("self", "mat2", "offs", "bias", "out_dtype"))
    x, weight, offs = args["self"], args["mat2"], args.get("offs")
    shapes = [_value(x), _value(weight)]
    if offs is None or args.get("bias") is not None or any(not isinstance(v, torch.Tensor) for v in shapes):
        return False
    if (shapes[0].dim(), shapes[1].dim()) != (2, 3):
        return False  # the other layouts (3-D by 2-D, 2-D by 2-D) group along another dimension
    dtype = args.get("out_dtype") or shapes[0].dtype
    return _replace(graph, node, lambda a, b, o: grouped_mm_dense(a, b, o).to(dtype), [x, weight, offs])


def _replace_histc(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    args = {"bins": 100, "min": 0, "max": 0, **_arguments(node, ("self", "bins", "min", "max"))}
    bins, low, high = int(args["bins"]), float(args["min"]), float(args["max"])
    if not low < high:
        return False  # the range is the data's own minimum and maximum
    return _replace(graph, node, lambda v: histogram_one_hot(v, bins, low, high), [args["self"]])


def _arguments(node: torch.fx.Node, names: tuple[str, ...]) -> dict[str, Any]:
    """``node``'s arguments by their schema's names, positional or keyword."""
    return {**dict(zip(names, node.args, strict=False)), **node.kwargs}


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, fn: Callable[..., torch.Tensor], inputs: list[Any]) -> bool:
    """Replace ``node`` by ``fn(*inputs)`` traced to aten operators and inlined; whether it was."""
    values = [_value(x) for x in inputs]
    if any(not isinstance(v, torch.Tensor) for v in values):
        return False
    # traced at the inputs' shapes and dtypes; torch.empty's memory is never read
    empties = [torch.empty(v.shape, dtype=v.dtype, device=v.device) for v in values]
    traced = make_fx(fn, tracing_mode="fake")(*empties)
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    mapping = dict(zip(placeholders, inputs, strict=True))
    with graph.inserting_before(node):
        out = graph.graph_copy(traced.graph, mapping)
    for new in mapping.values():
        if new not in inputs and new.op == "call_function":
            # values in the program's own fake mode, not the trace's
            args, kwargs = map_arg((new.args, new.kwargs), _value)
            new.meta["val"] = new.target(*args, **kwargs)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node
