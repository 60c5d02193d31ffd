"""Attention over long sequences, a block of queries at a time (tuner/lowering/attention_blocks.py)."""

import numpy as np
import pytest

from tuner.lowering import LoweringOptions, attention_blocks
from tuner.lowering.attention_blocks import query_blocks
from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

torch = pytest.importorskip("torch")
BLOCKS = LoweringOptions(attention_blocks=True)  # off by default (see the module's docstring)


class _Attention(torch.nn.Module):
    """Self-attention of 2 heads over x's rows: by scaled_dot_product_attention (``sdpa``; ``causal``;
    with a ``mask`` of a row per query added, as decoders pass theirs), or written out (scores scaled,
    softmax, product) as many models write it."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.qkv = torch.nn.Linear(64, 192)
        self.register_buffer("mask", torch.rand(256, 256, generator=torch.Generator().manual_seed(0)) * 4)

    def forward(self, x):
        q, k, v = (t.reshape(1, -1, 2, 32).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.form == "written_out":
            out = torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, dim=-1) @ v
        elif self.form == "mask":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.form == "causal")
        return out.transpose(1, 2).reshape(1, -1, 64)


def test_blocks_are_the_fewest_whose_scores_fit():
    # Whisper's encoder: 1,500 queries, 6 heads of 1,500 keys: 15 blocks of 100 queries (3.6 MB each)
    assert query_blocks(1500, 6 * 1500 * 4) == 15
    assert query_blocks(128, 12 * 128 * 4) == 1  # BERT's 128 tokens: small enough as they are
    assert query_blocks(1499, 6 * 1499 * 4) == 1  # a prime length splits into no equal blocks


@pytest.mark.parametrize(
    "form", ["sdpa", *(pytest.param(form, marks=pytest.mark.slow) for form in ("written_out", "causal", "mask"))]
)
def test_long_attention_is_computed_in_blocks_and_matches_pytorch(form, llvm_target, monkeypatch):
    from lowered_models import error_against_torch

    # scores of 2 x 256 x 256 floats (512 KB) made "long": blocks of 32 queries
    monkeypatch.setattr(attention_blocks, "MIN_SCORE_BYTES", 256 << 10)
    monkeypatch.setattr(attention_blocks, "BLOCK_SCORE_BYTES", 64 << 10)
    model = _Attention(form).eval()
    x = np.random.default_rng(0).standard_normal((1, 256, 64)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    lowered = lower_workload(workload, llvm_target, BLOCKS)
    tasks = {t.name: t for t in extract_tasks(workload, llvm_target, lowered)}
    softmax = [t for name, t in tasks.items() if "softmax" in name]
    assert len(softmax) == 1 and "T.int64(32), T.int64(256)" in softmax[0].mod.script(), list(tasks)
    assert any("concatenate" in name for name in tasks), list(tasks)
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_attention_is_left_whole_by_default_and_when_short(llvm_target, monkeypatch):
    model = _Attention("sdpa").eval()
    x = np.random.default_rng(0).standard_normal((1, 256, 64)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    tasks = extract_tasks(workload, llvm_target, lower_workload(workload, llvm_target, BLOCKS))
    (softmax,) = [t for t in tasks if "softmax" in t.name]
    assert "T.int64(256), T.int64(256)" in softmax.mod.script()
    assert not any("concatenate" in t.name for t in tasks), [t.name for t in tasks]
    # long enough to split, but not asked for
    monkeypatch.setattr(attention_blocks, "MIN_SCORE_BYTES", 256 << 10)
    monkeypatch.setattr(attention_blocks, "BLOCK_SCORE_BYTES", 64 << 10)
    assert not any("concatenate" in t.name for t in extract_tasks(workload, llvm_target)), [t.name for t in tasks]
