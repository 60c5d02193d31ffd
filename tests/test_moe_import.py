"""Mixture-of-experts decoders, built with transformers' own classes and their default experts
(a grouped matrix product over the rows sorted by expert, ``histc`` counting them), import, compile
and match PyTorch; and the rewrites that make them import (workloads/moe_prepass.py), each alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from workloads import load_workload

torch = pytest.importorskip("torch")

TOKENS = 16
VOCAB = 100
EXPERTS = 4


def _run(workload, *inputs):
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _relative_error(got, expected):
    return float(np.abs(got - expected).max()) / float(np.abs(expected).max())


class GroupedExperts(torch.nn.Module):
    """transformers' grouped_mm experts path: rows sorted by expert, counted with ``histc``, offsets
    by ``cumsum``, one grouped product (through the custom op of fp32 weights), the rows put back in
    their order (a sort may order equal ids either way)."""

    def __init__(self):
        super().__init__()
        pytest.importorskip("transformers.integrations.moe")  # registers torch.ops.transformers.grouped_mm_fallback

        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, 8, 6, generator=torch.Generator().manual_seed(3)))

    def forward(self, x, expert_ids):
        sorted_ids, order = torch.sort(expert_ids)
        counts = torch.histc(sorted_ids.float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        rows = x[order // 2]  # two rows per token, as top-2 routing makes them
        out = torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offsets)
        unsorted = torch.empty_like(order)
        unsorted[order] = torch.arange(order.shape[0])
        return out[unsorted], counts


def _routed_inputs():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(TOKENS, 8, generator=generator)
    ids = torch.randint(0, EXPERTS - 1, (2 * TOKENS,), generator=generator)  # the last expert gets no row
    return x, ids


def test_the_grouped_product_and_histc_import_and_match():
    module = GroupedExperts().eval()
    x, ids = _routed_inputs()
    workload = load_workload(module, example_inputs=[x, ids])
    with torch.no_grad():
        expected = [t.numpy() for t in module(x, ids)]
    got = _run(workload, x.numpy(), ids.numpy())
    np.testing.assert_array_equal(got[1], expected[1])  # rows per expert, the empty one included
    assert expected[1][-1] == 0
    assert _relative_error(got[0], expected[0]) < 1e-6


def test_torchs_own_grouped_product_of_bf16_weights_imports_and_matches():
    """``aten._grouped_mm``, what transformers calls for bf16 weights (torch exports it for bf16 only)."""

    class BF16Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            weight = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(3))
            self.weight = torch.nn.Parameter(weight.bfloat16())

        def forward(self, x, offsets):
            return torch._grouped_mm(x.bfloat16(), self.weight, offs=offsets).float()

    module = BF16Experts().eval()
    x, offsets = torch.randn(10, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([3, 3, 10]).int()
    workload = load_workload(module, example_inputs=[x, offsets])
    with torch.no_grad():
        expected = module(x, offsets).numpy()
    assert _relative_error(_run(workload, x.numpy(), offsets.numpy())[0], expected) < 1e-2  # bf16 products


def test_the_dense_forms_equal_torchs_operators():
    from workloads.moe_prepass import grouped_mm_dense, histogram_one_hot

    x, ids = _routed_inputs()
    weight = GroupedExperts().weight.detach()
    offsets = torch.tensor([5, 5, 20, 30], dtype=torch.int32)  # an empty run; rows 30, 31 past the end
    expected = torch.ops.transformers.grouped_mm_fallback(x[torch.arange(2 * TOKENS) // 2], weight, offsets)
    got = grouped_mm_dense(x[torch.arange(2 * TOKENS) // 2], weight, offsets)
    assert float((got - expected).abs().max()) < 1e-5
    assert not got[30:].any()
    values = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.9, 3.0, 3.5])  # outside, on edges, the maximum itself
    for bins, low, high in ((4, 0.0, 3.0), (3, 0.0, 3.0), (2, 0.5, 3.0)):
        torch.testing.assert_close(histogram_one_hot(values, bins, low, high), torch.histc(values, bins, low, high))


def test_an_integer_tensor_divided_by_a_number_imports():
    class Divided(torch.nn.Module):
        def forward(self, x):
            order = torch.argsort(x)
            return order // 2, torch.div(order, 3, rounding_mode="floor")

    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    module = Divided().eval()
    workload = load_workload(module, example_inputs=[x])
    for got, expected in zip(_run(workload, x.numpy()), module(x), strict=True):
        np.testing.assert_array_equal(got, expected.numpy())


def test_an_inverse_permutation_by_index_put_compiles_through_the_tuner(tmp_path):
    """transformers' experts put the rows back in order with ``inv[perm] = arange``: topi's index_put
    kernel, whose top block is its own (no "root"), with constant arguments the lowering inspects."""
    from tuner import tune

    class Unsort(torch.nn.Module):
        def forward(self, x):
            order = torch.argsort(x)
            unsorted = torch.empty_like(order)
            unsorted[order] = torch.arange(order.shape[0])
            return x[order][unsorted] * 2.0

    x = torch.randn(12, generator=torch.Generator().manual_seed(0))
    result = tune(Unsort().eval(), example_inputs=[x], trials=0, work_dir=tmp_path, progress=False)
    got = result.run(x.numpy())
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, list | tuple) else got), x.numpy() * 2.0)


def _mixtral():
    import transformers

    config = transformers.MixtralConfig(
        num_hidden_layers=1,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    return transformers.MixtralModel(config)


def test_a_tiny_mixtral_as_users_build_it_compiles_and_matches_pytorch(tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face models need transformers: pip install '.[hf]'")
    from tuner import tune
    from workloads.torch_prepass import torch_leaves

    torch.manual_seed(0)
    model = _mixtral().eval()
    assert model.config._experts_implementation == "grouped_mm"  # the default a user's model comes with
    inputs = [torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    result = tune(model, example_inputs=inputs[:1], trials=0, work_dir=tmp_path, progress=False)
    outputs = []
    for ids in inputs:
        with torch.no_grad():
            expected = torch_leaves(model(ids))[0].numpy()
        got = result.run(ids.numpy())
        got = np.asarray(got[0] if isinstance(got, list | tuple) else got)
        assert got.shape == expected.shape == (1, TOKENS, 64)
        assert _relative_error(got, expected) < 1e-5
        outputs.append(expected)
    assert not np.allclose(*outputs)  # the output follows the input


def test_transformers_experts_export_every_token_through_every_expert_and_come_back_as_they_were():
    """Exported through the dense experts, a Mixtral layer has no sort, histogram or grouped product: each
    token meets each expert once (top-k times fewer products than the grouped form's dense rewrite)."""
    pytest.importorskip("transformers", reason="the Hugging Face models need transformers: pip install '.[hf]'")
    from workloads.moe_experts import dense_experts
    from workloads.torch_prepass import FlatOutputs

    torch.manual_seed(0)
    model = _mixtral().eval()
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
        with dense_experts(model):
            dense = model(ids).last_hidden_state
            exported = torch.export.export(FlatOutputs(model), (ids,))
    assert model.config._experts_implementation == "grouped_mm"
    assert _relative_error(dense.numpy(), expected.numpy()) < 1e-6
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert not any(op in name for name in targets for op in ("sort", "histc", "grouped_mm"))
