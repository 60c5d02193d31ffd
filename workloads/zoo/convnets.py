"""ResNet-18/50, MobileNetV2, VGG-16, SqueezeNet 1.1 and ConvNeXt-T, as their papers define them."""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(
    cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: type[nn.Module] | None = nn.ReLU
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


def _keep_activations_in_range(model: nn.Module) -> None:
    """He initialisation over each filter's fan-in. With PyTorch's default initialisation the
    activations of MobileNetV2 and SqueezeNet shrink layer by layer until the output is the
    classifier's bias whatever the input, and comparing a compiled model's output with PyTorch's
    checks nothing; a trained network's batch norms keep them in range, as this does."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_in")
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0, 0.01)
            nn.init.zeros_(module.bias)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, width, 3, stride), _conv_bn(width, width, 3, act=None))
        self.shortcut = _conv_bn(cin, width, 1, stride, act=None) if stride != 1 or cin != width else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        out = width * self.expansion
        self.body = nn.Sequential(
            _conv_bn(cin, width, 1), _conv_bn(width, width, 3, stride), _conv_bn(width, out, 1, act=None)
        )
        self.shortcut = _conv_bn(cin, out, 1, stride, act=None) if stride != 1 or cin != out else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """He et al. 2016, ImageNet configuration."""

    def __init__(
        self,
        block: type[nn.Module],
        depths: list[int],
        widths=(64, 128, 256, 512),
        stem: int = 64,
        classes: int = 1000,
        small_input: bool = False,
    ):
        super().__init__()
        if small_input:  # CIFAR-style stem for 32x32 images
            self.stem = _conv_bn(3, stem, 3)
        else:
            self.stem = nn.Sequential(_conv_bn(3, stem, 7, 2), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], stem
        for i, (depth, width) in enumerate(zip(depths, widths, strict=True)):
            for j in range(depth):
                layers.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def resnet18() -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3])


def tiny_resnet() -> ResNet:
    """Two residual stages on 32x32 images: small enough to tune end to end in a minute."""
    return ResNet(BasicBlock, [1, 1], widths=(16, 32), stem=16, classes=10, small_input=True)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn(cin, hidden, 1, act=nn.ReLU6)]
        layers += [
            _conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            _conv_bn(hidden, cout, 1, act=None),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    """Sandler et al. 2018, width multiplier 1.0."""

    SETTINGS = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)
        # activations 1e-8 at the classifier with PyTorch's defaults; with this, std 2-5 and 7-12% clipped at 6
        _keep_activations_in_range(self)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class VGG16(nn.Module):
    """Simonyan & Zisserman 2015, configuration D, without batch norm."""

    CONFIG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for item in self.CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, item, 3, padding=1), nn.ReLU(inplace=True)]
                cin = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(inplace=True))
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x):
        x = self.squeeze(x)
        return torch.cat([self.expand1(x), self.expand3(x)], 1)


class SqueezeNet11(nn.Module):
    """Iandola et al. 2016, version 1.1."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), pool(),
            Fire(64, 16, 64), Fire(128, 16, 64), pool(),
            Fire(128, 32, 128), Fire(256, 32, 128), pool(),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        )  # fmt: skip
        self.classifier = nn.Sequential(nn.Conv2d(512, classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        _keep_activations_in_range(self)  # the output did not depend on the input with PyTorch's defaults

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class ChannelsFirstLayerNorm(nn.Module):
    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=eps)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.scale = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))) * self.scale
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtT(nn.Module):
    """Liu et al. 2022, ConvNeXt-T: depths (3, 3, 9, 3), widths (96, 192, 384, 768)."""

    def __init__(self, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), classes: int = 1000):
        super().__init__()
        stages: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), ChannelsFirstLayerNorm(dims[0])]
        for i, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
            if i > 0:
                stages += [ChannelsFirstLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            stages += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.stages(x).mean(dim=(2, 3))))
