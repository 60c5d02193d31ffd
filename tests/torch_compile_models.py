"""Small PyTorch models for the torch.compile door's tests (tests/test_torch_compile.py), importable
by the fresh processes those tests start: the same seed gives the same weights, so the same cache key."""

from __future__ import annotations

import torch


class TinyNet(torch.nn.Module):
    """Linear, ReLU, Linear, times a buffer: parameters and a buffer for the cache key to hash."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


class SplitNet(torch.nn.Module):
    """Two graphs (a graph break between them): Linear and ReLU, which TVM takes, then erfinv, which
    TVM's importer does not; it returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.fc(x))
        torch._dynamo.graph_break()
        return torch.erfinv(torch.tanh(y) * 0.5), y


class MixedNet(torch.nn.Module):
    """One graph with erfinv (which TVM's importer does not take) after a Linear and a ReLU (which it
    does): split, the Linear and ReLU compiled, erfinv in PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.fc(x))
        return torch.erfinv(torch.tanh(y) * 0.5) + 1, y


def tiny_net() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()


def example(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 16, generator=torch.Generator().manual_seed(1))
