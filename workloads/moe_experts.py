"""transformers' mixture-of-experts layers exported in a static form TVM tiles well: every token through
every expert, as two batched products, the outputs weighed by the routing.

transformers' default experts (``integrations/moe.py``, ``experts_implementation="grouped_mm"``) sort
the (token, chosen expert) pairs by expert and multiply each expert's run of rows by its weights; at a
fixed token count the run lengths are data, and the only static form of that grouped product
(``moe_prepass``) multiplies every pair's row by every expert's weights: E x top-k products per token.
Exporting through this implementation instead (registered in transformers' ``ExpertsInterface`` as
``DENSE_EXPERTS`` and chosen for the export only, the module given back as it came) takes each token
once through each expert: E products per token, top-k times fewer (Mixtral's 4 experts, top-2: 36.9 ms
after 8 trials per kernel through the grouped form, its expert products 34 ms of it). The routing
weights become a dense (tokens, experts) matrix, zero where a token did not choose the expert; the sum
over experts is the sum over the chosen ones. Expert parallelism's sentinels do not arise in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

DENSE_EXPERTS = "tensor_tuner_dense"


def dense_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts forward (``self`` an experts module: ``gate_up_proj`` or ``up_proj``,
    ``down_proj``, their biases, the gate) with every token through every expert."""
    up, up_bias = (self.gate_up_proj, "gate_up_proj_bias") if self.has_gate else (self.up_proj, "up_proj_bias")
    experts = up.shape[0]
    chosen = top_k_index.unsqueeze(-1) == torch.arange(experts, device=top_k_index.device)  # (T, k, E)
    routing = (chosen.to(top_k_weights.dtype) * top_k_weights.unsqueeze(-1)).sum(1)  # (T, E)
    projected = _linear(self, hidden_states.unsqueeze(0), up, up_bias)  # (E, T, I or 2I)
    projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
    out = _linear(self, projected, self.down_proj, "down_proj_bias")  # (E, T, H)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * routing.t().unsqueeze(-1).to(out.dtype)).sum(0).to(hidden_states.dtype)  # (T, H)


def _linear(experts: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias_name: str) -> torch.Tensor:
    """``x`` (1 or E, T, in) by each expert's ``weight`` ((E, in, out) where the experts keep it
    transposed, else (E, out, in)), plus the expert's bias where the experts have one."""
    out = torch.matmul(x, weight if experts.is_transposed else weight.transpose(-2, -1))
    return out + getattr(experts, bias_name).unsqueeze(1) if experts.has_bias else out


@contextlib.contextmanager
def dense_experts(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s transformers experts layers (those of the default grouped implementation) run
    ``dense_experts_forward`` inside the block, their own again after it; a module without any, or without
    transformers installed, is left alone."""
    configs = [
        config
        for config in {id(c): c for c in _configs(module)}.values()
        if getattr(config, "_experts_implementation", None) == "grouped_mm"
    ]
    if configs:
        from transformers.integrations.moe import ExpertsInterface

        ExpertsInterface.register(DENSE_EXPERTS, dense_experts_forward)
    for config in configs:
        config._experts_implementation = DENSE_EXPERTS
    try:
        yield
    finally:
        for config in configs:
            config._experts_implementation = "grouped_mm"


def _configs(module: torch.nn.Module) -> Iterator[Any]:
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None:
            yield config
