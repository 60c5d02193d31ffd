"""Attention over a token count that tiles badly, padded with zero tokens (tuner/lowering/attention_padding.py)."""

import numpy as np
import pytest

from tuner.lowering import LoweringOptions
from tuner.lowering.attention_padding import padded_tokens
from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

torch = pytest.importorskip("torch")
TOKENS = 197  # a ViT's: a prime


class _Attention(torch.nn.Module):
    """Self-attention of 2 heads over x's rows, as ViTs write it (``written_out``), by
    scaled_dot_product_attention (``sdpa``, ``causal``), or with a bias of a row per query added (``bias``)."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.qkv = torch.nn.Linear(64, 192)
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("bias", torch.rand(TOKENS, TOKENS, generator=generator) * 4)

    def forward(self, x):
        q, k, v = (t.reshape(1, -1, 2, 32).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.form == "written_out":
            out = torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, dim=-1) @ v
        elif self.form == "bias":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.form == "causal")
        return out.transpose(1, 2).reshape(1, -1, 64)


def test_token_counts_are_padded_to_whole_vectors_only_where_it_costs_little():
    assert padded_tokens(197) == 208 and padded_tokens(257) == 272  # ViT, DINOv2: 5-6% more
    assert padded_tokens(128) == 128 and padded_tokens(208) == 208  # whole vectors already
    assert padded_tokens(49) == 49  # a Swin window: 31% more, not worth it
    assert padded_tokens(1) == 1


@pytest.mark.parametrize(
    "form", ["written_out", *(pytest.param(form, marks=pytest.mark.slow) for form in ("sdpa", "causal", "bias"))]
)
def test_attention_over_a_prime_token_count_is_padded_and_matches_pytorch(form, llvm_target):
    from lowered_models import error_against_torch

    model = _Attention(form).eval()
    x = np.random.default_rng(0).standard_normal((1, TOKENS, 64)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    lowered = lower_workload(workload, llvm_target)
    tasks = {t.name: t for t in extract_tasks(workload, llvm_target, lowered)}
    softmax = [t for name, t in tasks.items() if "softmax" in name]
    assert len(softmax) == 1 and "T.int64(208), T.int64(208)" in softmax[0].mod.script(), list(tasks)
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
    unpadded = lower_workload(workload, llvm_target, LoweringOptions(pad_attention_tokens=False))
    assert "208" not in unpadded.script()
