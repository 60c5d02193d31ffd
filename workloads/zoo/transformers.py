"""BERT-base and a Llama-style decoder layer, written out op by op (no fused attention kernels),
so that every kernel is TVM's to tune."""

from __future__ import annotations

import math

import torch
from torch import nn


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(hidden, intermediate), nn.GELU(), nn.Linear(intermediate, hidden))
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).reshape(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(batch, seq, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ffn(x))


class BertBase(nn.Module):
    """Devlin et al. 2019, BERT-base (uncased vocabulary): 12 layers, hidden 768, 12 heads."""

    def __init__(
        self,
        seq: int = 128,
        vocab: int = 30522,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        intermediate: int = 3072,
    ):
        super().__init__()
        self.words = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.token_type = nn.Parameter(torch.randn(hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.Sequential(*[BertLayer(hidden, heads, intermediate) for _ in range(layers)])

    def forward(self, input_ids):
        return self.layers(self.norm(self.words(input_ids) + self.positions + self.token_type))


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaDecoderLayer(nn.Module):
    """One decoder layer at Llama-3-8B's size: hidden 4096, 32 query heads sharing 8 key/value heads
    (grouped-query attention), head dim 128, SwiGLU MLP 14336, RMSNorm, rotary embedding
    (theta 500000), causal attention over ``seq`` tokens."""

    def __init__(
        self,
        seq: int = 128,
        hidden: int = 4096,
        heads: int = 32,
        kv_heads: int = 8,
        intermediate: int = 14336,
        theta: float = 500000.0,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.input_norm = RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.post_norm = RMSNorm(hidden)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def _rotate(self, x):
        half = self.head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos.to(x.dtype) + rotated * self.sin.to(x.dtype)

    def forward(self, x):
        batch, seq, hidden = x.shape
        h = self.input_norm(x)
        q = self._rotate(self.q(h).reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2))
        k = self._rotate(self.k(h).reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2))
        v = self.v(h).reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        k = (
            k[:, :, None]
            .expand(batch, self.kv_heads, group, seq, self.head_dim)
            .reshape(batch, self.heads, seq, self.head_dim)
        )
        v = (
            v[:, :, None]
            .expand(batch, self.kv_heads, group, seq, self.head_dim)
            .reshape(batch, self.heads, seq, self.head_dim)
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + self.mask.to(x.dtype)
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, hidden)
        x = x + self.o(context)
        h = self.post_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))
