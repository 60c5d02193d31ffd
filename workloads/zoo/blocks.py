"""Small blocks of larger models, quick to tune end to end."""

from __future__ import annotations

from torch import nn


class AttentionBlock(nn.Module):
    """A diffusion-UNet-style block: group norm, SiLU and a 3x3 convolution, then 4-head
    self-attention (torch's MultiheadAttention) over the 16x16 = 256 positions of a 64-channel map,
    with residual connections and a closing 3x3 convolution."""

    def __init__(self, channels: int = 64, heads: int = 4, groups: int = 8):
        super().__init__()
        self.norm_in = nn.GroupNorm(groups, channels)
        self.conv_in = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm_attn = nn.GroupNorm(groups, channels)
        self.attention = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.conv_out = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(nn.functional.silu(self.norm_in(x)))
        batch, channels, height, width = h.shape
        tokens = self.norm_attn(h).flatten(2).transpose(1, 2)
        attended, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        h = h + attended.transpose(1, 2).reshape(batch, channels, height, width)
        return x + self.conv_out(h)
