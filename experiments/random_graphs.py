"""Small random PyTorch graphs for the correctness suite (experiments/correctness.py).

``random_graph(seed)`` builds an eval-mode module of 2-8 steps in a chain or DAG, fixed by the seed:
convolutions (kernel 1/3/5, stride 1/2, dense/depthwise/grouped, dilated, symmetric or TF-style
asymmetric padding through ``F.pad``), calibrated batch norms, activations, residual adds, pooling
(padded, ceil mode), concatenations of convolutions, channel shuffles, permutes and reshapes,
slices, zero padding consumed by pooling or adds, upsampling, and on sequences linear layers, layer
norms, softmax and batched matmuls of two activations. Weights are He-initialised and the batch
norms' running statistics set from the data, so that outputs are of order 1. Each step is applied to
the real tensors while the graph is built, so every shape is valid by construction.

``bundle(seeds)`` puts several graphs in one module (one input each, a tuple of outputs), so that
one tune() call checks them all.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu6": F.relu6,
    "gelu": F.gelu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
}
ASYMMETRIC_PADS = [(0, 1, 0, 1), (1, 2, 1, 2), (1, 0, 1, 0), (0, 1, 1, 0), (2, 1, 0, 2), (0, 2, 0, 2)]
MAX_CHANNELS = 64


class Step(nn.Module):
    """One step of a random graph: ``fn(modules, *values)`` on the graph's values ``inputs``."""

    def __init__(self, label: str, inputs: tuple[int, ...], fn: Callable, modules: dict[str, nn.Module] | None = None):
        super().__init__()
        self.label, self.inputs, self.fn = label, inputs, fn
        self.mods = nn.ModuleDict(modules or {})

    def forward(self, *values: torch.Tensor) -> torch.Tensor:
        return self.fn(self.mods, *values)


class RandomGraph(nn.Module):
    """Value 0 is the input; each step appends one value; the last value is the output."""

    def __init__(self, steps: list[Step], description: str):
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.description = description

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = [x]
        for step in self.steps:
            values.append(step(*[values[i] for i in step.inputs]))
        return values[-1]


class Bundle(nn.Module):
    """Several graphs side by side: one input per graph, a tuple of their outputs."""

    def __init__(self, graphs: Sequence[nn.Module]):
        super().__init__()
        self.graphs = nn.ModuleList(graphs)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(graph(x) for graph, x in zip(self.graphs, inputs, strict=True))


class _Builder:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.steps: list[Step] = []
        self.values: list[torch.Tensor] = []

    # -- helpers ------------------------------------------------------------------------------
    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def he(self, module: nn.Module) -> nn.Module:
        """He-initialise a conv or linear layer (biases small), fixed by the builder's generator."""
        weight = module.weight
        fan_in = weight[0].numel()
        with torch.no_grad():
            weight.copy_(self.randn(*weight.shape) * math.sqrt(2.0 / fan_in))
            if getattr(module, "bias", None) is not None:
                module.bias.copy_(self.randn(*module.bias.shape) * 0.1)
        return module

    def layer_norm(self, size: int) -> nn.LayerNorm:
        norm = nn.LayerNorm(size)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.2 * self.randn(size))
            norm.bias.copy_(0.1 * self.randn(size))
        return norm

    def add(self, label: str, fn: Callable, inputs: tuple[int, ...] | None = None, **modules: nn.Module) -> int:
        """Append a step (on the current value unless ``inputs``), run it, return its value's index."""
        step = Step(label, inputs if inputs is not None else (len(self.values) - 1,), fn, modules).eval()
        with torch.no_grad():
            self.values.append(step(*[self.values[i] for i in step.inputs]))
        self.steps.append(step)
        return len(self.values) - 1

    @property
    def x(self) -> torch.Tensor:
        return self.values[-1]

    def choice(self, options: Sequence):
        return options[self.rng.randrange(len(options))]

    # -- image ops (N, C, H, W) ----------------------------------------------------------------
    def conv_module(self, channels: int, height: int, width: int, same: bool = False) -> tuple[nn.Conv2d, str, tuple]:
        """A random conv on ``channels`` inputs and the asymmetric pad before it (or ()); ``same``:
        stride 1, output channels and size those of the input."""
        rng = self.rng
        kernel = self.choice([1, 3, 3, 5]) if min(height, width) >= 5 else self.choice([1, 3])
        stride = 1 if same else self.choice([1, 1, 2])
        dilation = 2 if kernel == 3 and min(height, width) >= 8 and rng.random() < 0.2 else 1
        mode = self.choice(["dense", "dense", "depthwise", "grouped"])
        divisors = [g for g in range(2, channels) if channels % g == 0]
        mode = "dense" if mode == "grouped" and not divisors else mode
        if mode == "depthwise":
            groups, out = channels, channels * (2 if not same and channels <= 16 and rng.random() < 0.3 else 1)
        elif mode == "grouped":
            groups = self.choice(divisors)
            out = channels if same else groups * rng.randint(1, max(1, 32 // groups))
        else:
            groups, out = 1, channels if same else rng.randint(4, 32)
        reach = dilation * (kernel - 1)
        pad: tuple = ()
        padding = reach // 2
        if not same and kernel > 1 and rng.random() < 0.35:
            pad, padding = self.choice(ASYMMETRIC_PADS), 0
        elif not same and rng.random() < 0.15:
            padding = 0
        padded_h = height + (pad[2] + pad[3] if pad else 2 * padding)
        padded_w = width + (pad[0] + pad[1] if pad else 2 * padding)
        if min(padded_h, padded_w) <= reach:
            pad, padding = (), reach // 2
        conv = nn.Conv2d(channels, out, kernel, stride, padding, dilation, groups, bias=rng.random() < 0.6)
        text = f"conv{kernel}x{kernel}/s{stride}" + (f"/d{dilation}" if dilation > 1 else "")
        text += f"/{mode}{'' if mode != 'grouped' else groups} {channels}->{out}"
        text += f" pad{list(pad)}" if pad else f" p{padding}"
        return self.he(conv), text, pad

    def conv(self) -> int:
        _, c, h, w = self.x.shape
        conv, text, pad = self.conv_module(c, h, w)
        if pad:
            return self.add(text, lambda m, x, p=pad: m["conv"](F.pad(x, p)), conv=conv)
        return self.add(text, lambda m, x: m["conv"](x), conv=conv)

    def batch_norm(self) -> int:
        c = self.x.shape[1]
        bn = nn.BatchNorm2d(c).eval()
        calibrated = self.rng.random() < 0.7
        with torch.no_grad():
            bn.weight.copy_(0.5 + self.randn(c).abs())
            bn.bias.copy_(0.1 * self.randn(c))
            if calibrated:
                bn.running_mean.copy_(self.x.mean((0, 2, 3)) + 0.05 * self.randn(c))
                bn.running_var.copy_(
                    self.x.var((0, 2, 3), unbiased=False).clamp_min(0.05) * (1 + 0.2 * self.randn(c).abs())
                )
            else:
                bn.running_mean.copy_(0.1 * self.randn(c))
                bn.running_var.copy_(0.5 + self.randn(c).abs())
        return self.add(f"bn{'(calibrated)' if calibrated else ''}", lambda m, x: m["bn"](x), bn=bn)

    def activation(self) -> int:
        name = self.choice(list(ACTIVATIONS))
        return self.add(name, lambda m, x, f=ACTIVATIONS[name]: f(x))

    def residual(self) -> int:
        same = [i for i, v in enumerate(self.values[:-1]) if v.shape == self.x.shape]
        if same and self.rng.random() < 0.6:
            j = self.choice(same)
            return self.add(f"add(v{j})", lambda m, a, b: a + b, (len(self.values) - 1, j))
        _, c, h, w = self.x.shape
        conv, text, _ = self.conv_module(c, h, w, same=True)
        act = self.choice(list(ACTIVATIONS))
        return self.add(f"x+{act}({text})", lambda m, x, f=ACTIVATIONS[act]: x + f(m["conv"](x)), conv=conv)

    def pool(self) -> int:
        rng = self.rng
        kind = self.choice(["max", "avg"])
        kernel, stride = self.choice([2, 3]), self.choice([1, 2, 2])
        padding = rng.randint(0, kernel // 2)
        ceil = rng.random() < 0.3
        if kind == "max":
            pool: nn.Module = nn.MaxPool2d(kernel, stride, padding, ceil_mode=ceil)
        else:
            pool = nn.AvgPool2d(kernel, stride, padding, ceil_mode=ceil, count_include_pad=rng.random() < 0.5)
        text = f"{kind}pool{kernel}/s{stride}/p{padding}" + ("/ceil" if ceil else "")
        text += "/excl-pad" if kind == "avg" and not pool.count_include_pad else ""
        return self.add(text, lambda m, x: m["pool"](x), pool=pool)

    def adaptive_pool(self) -> int:
        size = self.choice([1, 1, 2, 3])
        return self.add(f"adaptive_avgpool{size}", lambda m, x, s=size: F.adaptive_avg_pool2d(x, s))

    def concat(self) -> int:
        _, c, h, w = self.x.shape
        current = len(self.values) - 1
        earlier = [i for i, v in enumerate(self.values[:-1]) if v.shape[2:] == self.x.shape[2:]]
        j = self.choice(earlier) if earlier and self.rng.random() < 0.3 else None
        if j is not None and c + self.values[j].shape[1] <= MAX_CHANNELS:
            return self.add(f"cat(v{j})", lambda m, a, b: torch.cat([a, b], 1), (current, j))
        # two or three convolution branches of the current value, all stride 1 and "same" size
        branches, texts = {}, []
        for k in range(self.rng.choice([2, 2, 3])):
            kernel = self.choice([1, 3]) if min(h, w) >= 3 else 1
            out = self.rng.randint(4, 16)
            branches[f"b{k}"] = self.he(nn.Conv2d(c, out, kernel, 1, kernel // 2, bias=self.rng.random() < 0.5))
            texts.append(f"conv{kernel}x{kernel}->{out}")
        act = self.choice(["relu", "none"])

        def fn(m, x, a=act):
            y = torch.cat([m[name](x) for name in sorted(m.keys())], 1)
            return F.relu(y) if a == "relu" else y

        return self.add(f"cat[{', '.join(texts)}]" + ("+relu" if act == "relu" else ""), fn, **branches)

    def shuffle(self) -> int:
        c = self.x.shape[1]
        groups = [g for g in (2, 4) if c % g == 0 and c > g]
        if not groups:
            return self.transpose_hw()
        g = self.choice(groups)

        def fn(m, x, g=g):
            n, c, h, w = x.shape
            return x.reshape(n, g, c // g, h, w).transpose(1, 2).reshape(n, c, h, w)

        return self.add(f"channel_shuffle{g}", fn)

    def transpose_hw(self) -> int:
        return self.add("transpose(H,W)", lambda m, x: x.transpose(2, 3))

    def channels_last_norm(self) -> int:
        fn = lambda m, x: m["ln"](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.add("permute->layernorm(C)->permute", fn, ln=self.layer_norm(self.x.shape[1]))

    def space_to_depth(self) -> int:
        _, c, h, w = self.x.shape
        if h % 2 or w % 2 or 4 * c > MAX_CHANNELS or min(h, w) < 4:
            return self.transpose_hw()

        def fn(m, x):
            n, c, h, w = x.shape
            return x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(n, 4 * c, h // 2, w // 2)

        return self.add("space_to_depth2", fn)

    def slice(self) -> int:
        _, c, h, w = self.x.shape
        options = []
        if h >= 3:
            options.append(("x[:,:,1:,:]", lambda m, x: x[:, :, 1:, :]))
        if w >= 3:
            options.append(("x[:,:,:,:-1]", lambda m, x: x[:, :, :, :-1]))
        if min(h, w) >= 4:
            options.append(("x[:,:,::2,::2]", lambda m, x: x[:, :, ::2, ::2]))
            options.append(("x[:,:,1::2,:]", lambda m, x: x[:, :, 1::2, :]))
        if c >= 6:
            lo, hi = 1, c - self.rng.randint(1, c // 3)
            options.append((f"x[:,{lo}:{hi}]", lambda m, x, lo=lo, hi=hi: x[:, lo:hi]))
        if not options:
            return self.activation()
        text, fn = self.choice(options)
        return self.add(text, fn)

    def pad_then(self) -> int:
        """Zero padding after an activation, consumed by something other than a conv."""
        _, c, h, w = self.x.shape
        pad = self.choice([*ASYMMETRIC_PADS, (1, 1, 1, 1)])
        act = self.choice(list(ACTIVATIONS))
        consumer = self.choice(["maxpool", "avgpool", "add-mean", "add-param", "add-act"])
        f = ACTIVATIONS[act]
        label = f"pad{list(pad)}({act})->{consumer}"
        if consumer == "maxpool":
            return self.add(label, lambda m, x: F.max_pool2d(F.pad(f(x), pad), 2, 2))
        if consumer == "avgpool":
            return self.add(label, lambda m, x: F.avg_pool2d(F.pad(f(x), pad), 3, 1))
        if consumer == "add-mean":
            return self.add(label, lambda m, x: (lambda z: z + z.mean((2, 3), keepdim=True))(F.pad(f(x), pad)))
        if consumer == "add-act":
            return self.add(label, lambda m, x: (lambda z: z + torch.sigmoid(z))(F.pad(f(x), pad)))
        holder = nn.Module()
        holder.param = nn.Parameter(0.5 * self.randn(1, c, h + pad[2] + pad[3], w + pad[0] + pad[1]))
        return self.add(label, lambda m, x: F.pad(f(x), pad) + m["p"].param, p=holder)

    def upsample(self) -> int:
        if max(self.x.shape[2:]) > 16:
            return self.pool()
        return self.add("upsample_nearest2", lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"))

    def to_sequence(self) -> int:
        _, c, h, w = self.x.shape
        if h * w > 256 or h * w < 2:
            return self.pool()
        return self.add("flatten(2).transpose->seq", lambda m, x: x.flatten(2).transpose(1, 2))

    def head(self) -> int:
        _, c, h, w = self.x.shape
        out = self.rng.randint(4, 32)
        if c * h * w <= 2048 and self.rng.random() < 0.5:
            linear = self.he(nn.Linear(c * h * w, out))
            return self.add(f"flatten->linear({c * h * w}->{out})", lambda m, x: m["fc"](x.flatten(1)), fc=linear)
        linear = self.he(nn.Linear(c, out))
        return self.add(f"gap->flatten->linear({c}->{out})", lambda m, x: m["fc"](x.mean((2, 3))), fc=linear)

    # -- sequence / vector ops (N, L, D) or (N, D) -----------------------------------------------
    def linear(self) -> int:
        d = self.x.shape[-1]
        out = self.rng.randint(8, 48)
        act = self.choice(["none", "gelu", "relu"])
        f = ACTIVATIONS.get(act, lambda x: x)
        return self.add(
            f"linear({d}->{out})" + ("" if act == "none" else f"+{act}"),
            lambda m, x: f(m["fc"](x)),
            fc=self.he(nn.Linear(d, out, bias=self.rng.random() < 0.7)),
        )

    def seq_norm(self) -> int:
        d = self.x.shape[-1]
        return self.add(f"layernorm({d})", lambda m, x: m["ln"](x), ln=self.layer_norm(d))

    def softmax(self) -> int:
        if self.x.shape[-1] < 2:
            return self.seq_norm()
        return self.add("softmax(-1)", lambda m, x: torch.softmax(x, -1))

    def seq_residual(self) -> int:
        d = self.x.shape[-1]
        fc = self.he(nn.Linear(d, d))
        return self.add(f"x+gelu(linear({d}))", lambda m, x: x + F.gelu(m["fc"](x)), fc=fc)

    def attention(self) -> int:
        if self.x.dim() != 3:
            return self.linear()
        _, length, d = self.x.shape
        heads = self.choice([h for h in (1, 2, 4) if d % h == 0 and d // h >= 2] or [1])
        dk = d // heads
        mods = {name: self.he(nn.Linear(d, d)) for name in ("q", "k", "v")}

        def fn(m, x, h=heads, dk=dk):
            n, length, d = x.shape
            q, k, v = (m[name](x).reshape(n, length, h, dk).transpose(1, 2) for name in ("q", "k", "v"))
            scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dk), -1)
            return (scores @ v).transpose(1, 2).reshape(n, length, d)

        return self.add(f"attention({heads} heads, L={length}, d={d})", fn, **mods)

    def gram(self) -> int:
        if self.x.dim() != 3:
            return self.linear()
        d = self.x.shape[-1]
        return self.add(
            "softmax(x@x^T/sqrt d)@x", lambda m, x: torch.softmax(x @ x.transpose(1, 2) / math.sqrt(d), -1) @ x
        )

    def seq_transpose_linear(self) -> int:
        if self.x.dim() != 3:
            return self.linear()
        length = self.x.shape[1]
        out = self.rng.randint(4, 32)
        fc = self.he(nn.Linear(length, out))
        return self.add(f"transpose(1,2)->linear({length}->{out})", lambda m, x: m["fc"](x.transpose(1, 2)), fc=fc)

    def mean_tokens(self) -> int:
        if self.x.dim() != 3:
            return self.seq_norm()
        return self.add("mean(tokens)", lambda m, x: x.mean(1))

    # -- the graph ---------------------------------------------------------------------------
    IMAGE_OPS = [
        ("conv", 6), ("batch_norm", 3), ("activation", 3), ("residual", 3), ("pool", 2), ("adaptive_pool", 1),
        ("concat", 3), ("shuffle", 1), ("transpose_hw", 1), ("channels_last_norm", 1), ("space_to_depth", 1),
        ("slice", 2), ("pad_then", 2), ("upsample", 1), ("to_sequence", 1), ("head", 1),
    ]  # fmt: skip
    SEQUENCE_OPS = [
        ("linear", 4), ("seq_norm", 2), ("softmax", 1), ("seq_residual", 2), ("attention", 2), ("gram", 1),
        ("seq_transpose_linear", 1), ("mean_tokens", 1), ("activation", 2),
    ]  # fmt: skip

    def build(self) -> tuple[RandomGraph, torch.Tensor]:
        rng = self.rng
        if rng.random() < 0.8:
            shape = (1, rng.randint(4, 32), rng.randint(8, 32), rng.randint(8, 32))
            if rng.random() < 0.6:
                shape = (*shape[:3], shape[2])
        else:
            shape = (1, rng.randint(8, 32), rng.randint(8, 32))
        example = self.randn(*shape)
        self.values.append(example)
        wanted, attempts = rng.randint(2, 8), 0
        while len(self.steps) < wanted and attempts < 50:
            attempts += 1
            ops = self.IMAGE_OPS if self.x.dim() == 4 else self.SEQUENCE_OPS
            name = rng.choices([n for n, _ in ops], [w for _, w in ops])[0]
            kept = len(self.steps)
            try:
                getattr(self, name)()
            except RuntimeError:  # a shape this op cannot take (too small a map): drawn again
                del self.steps[kept:], self.values[kept + 1 :]
        text = f"in{list(shape)}: " + " -> ".join(
            s.label if s.inputs == (i,) else f"{s.label}{list(s.inputs)}" for i, s in enumerate(self.steps)
        )
        return RandomGraph(self.steps, text).eval(), example


def random_graph(seed: int) -> tuple[nn.Module, list[torch.Tensor]]:
    """A small random eval-mode module and its one input (batch 1), both fixed by ``seed``."""
    with torch.random.fork_rng(devices=[]):  # layers' own default init must not move the global RNG
        module, example = _Builder(seed).build()
    return module, [example]


def describe(seed: int) -> str:
    """A one-line description of graph ``seed``: its input shape and its steps (``[i, j]``: values read)."""
    return random_graph(seed)[0].description


def bundle(seeds: Sequence[int]) -> tuple[nn.Module, list[torch.Tensor]]:
    """Graphs ``seeds`` in one module: one input per graph, a tuple of their outputs in that order."""
    graphs, inputs = [], []
    for seed in seeds:
        module, example = random_graph(seed)
        graphs.append(module)
        inputs += example
    return Bundle(graphs).eval(), inputs


if __name__ == "__main__":  # .venv/bin/python experiments/random_graphs.py N: graphs 0..N-1 described
    import sys

    for s in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        print(s, describe(s))
