"""Rewrites of a torch.export program, before TVM's importer (``from_exported_program``) reads it,
for what PyTorch accepts and the importer does not.

* ``aten.cat`` skips an input of shape ``(0,)`` whatever the other inputs' rank (a legacy rule of
  ``torch.cat``); Relax's ``concat`` requires one rank ("Concat expects all input tensors to have
  same ndim. However, the input contains tensors with ndim 1 and 4"). Hugging Face decoders hit it
  whenever their key/value cache is on (``use_cache=True``, the default of GPT-2, Llama, Qwen2, ...):
  ``DynamicCache`` starts each layer from ``torch.tensor([])`` and concatenates the new keys and
  values to it. The empty inputs are dropped (cast where they took part in the output's dtype); a
  ``cat`` left with one input becomes that input.

* ``aten.im2col`` and ``aten.col2im`` (``F.unfold``/``F.fold``), which the importer takes as advanced
  indexing and fails on ("index_tensor: cannot broadcast index shapes": MobileViTV2), where their
  patches do not overlap (kernel = stride, no padding or dilation) are a reshape, a permute and a
  reshape: each patch's pixels are a block of the image.

* ``aten.topk`` with ``sorted=False``, which the importer refuses ("Currently supports only sorted
  output for topk operator": DeepSeek-V3's choice of expert groups and of experts), is asked for its
  values sorted: an unsorted top-k promises no order, so the sorted one is one of its results.

* ``aten.index.Tensor`` by a constant index list with negative entries (Falcon's ``qkv[..., [-2], :]``),
  which the importer takes as Relax's ``take`` in its "fast" mode: no wrapping, a read before the
  data. The constant's negative entries are counted from the end, as PyTorch counts them.

* ``aten.arange`` of integers with a negative step (Funnel's relative positions), whose length Relax's
  ``arange`` gets wrong (``arange(127, -129, -1)``: 258 values, not 256), is the same values counted up
  with a positive step, then flipped.

The program is changed in place; the graph's nodes that only fed a dropped input are removed too
(its lifted constants stay in the signature: the importer binds them, and nothing uses them).

A module whose output is not a tensor or a tuple of tensors (a dict; a transformers ``ModelOutput``)
is exported through ``FlatOutputs``: its output's tensors in pytree order (``torch_leaves``, which the
reference the compiled model is checked against uses too). What is not a tensor is left out: numbers,
and a transformers ``DynamicCache`` (``past_key_values``, with ``use_cache`` on), which is no pytree
unless registered as one. (Exporting the ``ModelOutput`` itself, cache registered, fails in torch:
``run_decompositions``, which TVM's importer calls, loses the cache's lifted constants.)
"""

from __future__ import annotations

from typing import Any

import torch

from .moe_prepass import _arguments, rewrite_experts

_CATS = (torch.ops.aten.cat.default, torch.ops.aten.concat.default)
_PATCH_OPS = (torch.ops.aten.im2col.default, torch.ops.aten.col2im.default)
_RESHAPE, _PERMUTE = torch.ops.aten.reshape.default, torch.ops.aten.permute.default
_TO_COPY = torch.ops.aten._to_copy.default
_TOPK = torch.ops.aten.topk.default
_INDEX = torch.ops.aten.index.Tensor
_ARANGE, _FLIP = torch.ops.aten.arange.start_step, torch.ops.aten.flip.default
_TOPK_ARGUMENTS = ("self", "k", "dim", "largest", "sorted")
_DIVISIONS = (torch.ops.aten.floor_divide.default, torch.ops.aten.div.Tensor_mode)
_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# producers of a dropped empty input that nothing else reads (a lifted constant's copy and detach)
_REMOVABLE = (
    torch.ops.aten.lift_fresh_copy.default,
    torch.ops.aten.detach_.default,
    torch.ops.aten.detach.default,
    torch.ops.aten.clone.default,
)


class FlatOutputs(torch.nn.Module):
    """``module`` returning its output's tensors as a tuple (see ``torch_leaves``)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *inputs: Any) -> tuple[Any, ...]:
        return tuple(torch_leaves(self.module(*inputs)))


def plain_output(out: Any) -> bool:
    """Whether torch.export and TVM's importer take ``out`` as it is: a tensor, or a tuple or list of them."""
    if isinstance(out, tuple | list):
        return type(out) in (tuple, list) and all(isinstance(x, torch.Tensor) for x in out)
    return isinstance(out, torch.Tensor)


def torch_leaves(out: Any) -> list[Any]:
    """The tensors of a module's output (a tensor; a tuple, list or dict of them; a ``ModelOutput``) in
    pytree order, the order of the exported program's outputs."""
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]


def prepare_exported_program(exported: Any) -> Any:
    """``exported`` rewritten for TVM's importer (the same object); the rewrites keep its outputs."""
    graph = exported.graph_module.graph
    dropped: list[Any] = []
    changed = rewrite_experts(graph)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _CATS:
            dropped += _drop_empty_cat_inputs(graph, node)
        elif node.op == "call_function" and node.target in _PATCH_OPS:
            changed |= _patches_as_layout(graph, node)
        elif node.op == "call_function" and node.target in _DIVISIONS:
            changed |= _typed_divisor(graph, node)
        elif node.op == "call_function" and node.target == _TOPK:
            changed |= _sorted_topk(node)
        elif node.op == "call_function" and node.target == _ARANGE:
            changed |= _ascending_arange(graph, node)
        elif node.op == "call_function" and node.target == _INDEX:
            _wrap_negative_indices(exported, node)  # changes constants, not the graph
    if dropped:
        _remove_unused(graph, dropped)
    if dropped or changed:
        graph.lint()
        exported.graph_module.recompile()
    return exported


def _value(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


def _is_legacy_empty(node: Any) -> bool:
    value = _value(node)
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == 0


def _drop_empty_cat_inputs(graph: Any, node: Any) -> list[Any]:
    """The inputs dropped from the ``cat`` at ``node`` (none where it has no legacy empty input)."""
    inputs = list(node.args[0])
    kept = [x for x in inputs if not _is_legacy_empty(x)]
    out = _value(node)
    if len(kept) == len(inputs) or not kept or not isinstance(out, torch.Tensor):
        return []
    if any(not isinstance(_value(x), torch.Tensor) or _value(x).dim() != out.dim() for x in kept):
        return []  # not the legacy case (or shapes unknown): leave it to the importer
    with graph.inserting_before(node):
        kept = [
            x if _value(x).dtype == out.dtype else _call(graph, _TO_COPY, x, dtype=out.dtype) for x in kept
        ]  # the dropped inputs took part in the type promotion
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
    return [x for x in inputs if _is_legacy_empty(x)]


def _patches_as_layout(graph: Any, node: Any) -> bool:
    """``node`` (an im2col or col2im of 4-D images) as reshape, permute, reshape where its patches
    tile the image without overlap; whether it was replaced."""
    unfold = node.target == torch.ops.aten.im2col.default
    data, *size, kernel, dilation, padding, stride = node.args
    image = _value(data) if unfold else _value(node)
    if not isinstance(image, torch.Tensor) or image.dim() != 4 or list(kernel) != list(stride):
        return False
    (kh, kw), (batch, channels, height, width) = kernel, image.shape
    if list(dilation) != [1, 1] or any(padding) or height % kh or width % kw:
        return False
    rows, columns = height // kh, width // kw
    if unfold:  # x[b, c, r*kh + i, q*kw + j] at [b, (c*kh + i)*kw + j, r*columns + q]
        steps = [
            (batch, channels, rows, kh, columns, kw),
            [0, 1, 3, 5, 2, 4],
            (batch, channels * kh * kw, rows * columns),
        ]
    else:
        steps = [(batch, channels, kh, kw, rows, columns), [0, 1, 4, 2, 5, 3], (batch, channels, height, width)]
    value = data
    with graph.inserting_before(node):
        for step, target in zip(steps, (_RESHAPE, _PERMUTE, _RESHAPE), strict=True):
            value = _call(graph, target, value, list(step))
    node.replace_all_uses_with(value)
    graph.erase_node(node)
    return True


def _typed_divisor(graph: Any, node: Any) -> bool:
    """The Python integer divisor of an integer tensor's floor division at ``node`` as a 0-d tensor of its
    dtype; whether it was one."""
    dividend, divisor = _value(node.args[0]), node.args[1]
    if not isinstance(dividend, torch.Tensor) or dividend.dtype not in _INTEGERS or type(divisor) is not int:
        return False
    if node.target == torch.ops.aten.div.Tensor_mode and node.kwargs.get("rounding_mode") != "floor":
        return False  # a true division's result is float: left to the importer
    with graph.inserting_before(node):
        typed = graph.call_function(torch.ops.aten.scalar_tensor.default, (divisor,), {"dtype": dividend.dtype})
    typed.meta["val"] = dividend.new_full((), divisor)  # in the program's fake mode
    node.args = (node.args[0], typed, *node.args[2:])
    return True


def _sorted_topk(node: Any) -> bool:
    """The top-k at ``node`` asked for its values in order where it was not; whether it was not."""
    args = {"dim": -1, "largest": True, "sorted": True, **_arguments(node, _TOPK_ARGUMENTS)}
    if args["sorted"]:
        return False
    node.args, node.kwargs = (*(args[name] for name in _TOPK_ARGUMENTS[:-1]), True), {}  # all positional
    return True


def _ascending_arange(graph: Any, node: Any) -> bool:
    """The integer ``arange`` at ``node`` with a negative step as an ascending one, flipped; whether it was."""
    start, end, step = (*node.args, 1)[:3]
    if not all(type(v) is int for v in (start, end, step)) or step >= 0 or not range(start, end, step):
        return False
    values = range(start, end, step)
    with graph.inserting_before(node):
        ascending = graph.call_function(_ARANGE, (values[-1], start + 1, -step), dict(node.kwargs))
        ascending.meta["val"] = _value(node)  # the same shape and dtype
        flipped = graph.call_function(_FLIP, (ascending, [0]))
        flipped.meta["val"] = _value(node)
    node.replace_all_uses_with(flipped)
    graph.erase_node(node)
    return True


def _wrap_negative_indices(exported: Any, node: Any) -> None:
    """The lifted constant indices of the ``aten.index.Tensor`` at ``node`` that are negative counted from
    the end of their dimension (a new tensor in the program's constants; the module's own is kept)."""
    data, indices = _value(node.args[0]), node.args[1]
    if not isinstance(data, torch.Tensor):
        return
    constants = exported.graph_signature.inputs_to_lifted_tensor_constants
    for dim, index in enumerate(indices):
        source = index
        while source is not None and source.op == "call_function" and source.target in _REMOVABLE:
            source = source.args[0] if len(source.users) == 1 else None  # a copy only this index reads
        if source is None or source.op != "placeholder" or len(source.users) != 1 or source.name not in constants:
            continue
        value = exported.constants.get(constants[source.name])
        if isinstance(value, torch.Tensor) and value.dtype in _INTEGERS and bool((value < 0).any()):
            exported.constants[constants[source.name]] = torch.remainder(value, data.shape[dim])


def _call(graph: Any, target: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
    """A new node ``target(node, *args, **kwargs)``, its value (shape and dtype) computed from ``node``'s."""
    call = graph.call_function(target, (node, *args), kwargs)
    call.meta["val"] = target(_value(node), *args, **kwargs)
    return call


def _remove_unused(graph: Any, dropped: list[Any]) -> None:
    """Remove the copies and detaches that fed only a dropped input (``eliminate_dead_code`` keeps
    ``detach_``: its schema says it mutates)."""
    pending, erased = list(dropped), set()
    while pending:
        node = pending.pop()
        if node in erased or node.op != "call_function" or node.target not in _REMOVABLE or node.users:
            continue
        pending += node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
