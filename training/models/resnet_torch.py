"""ResNet-18 in 3D (volumes) and 2D (images) for PyTorch, written out here because
torchvision's wheels do not import beside the pinned CPU torch.

The 3D model follows r3d_18 (Tran et al., "A Closer Look at Spatiotemporal Convolutions"):
a (3,7,7) stem with stride (1,2,2), four stages of two basic blocks (64, 128, 256, 512
channels), global average pooling and a linear head. Inputs are channels-last, as stored:
volumes (N, X, Y, Z, C) and images (N, H, W, C); the model moves channels first itself.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, conv: Callable[..., nn.Module], norm: Callable[[int], nn.Module], cin: int, cout: int,
                 stride: int) -> None:
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = conv(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(conv(cin, cout, 1, stride=stride, bias=False), norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = self.relu(out + (x if self.down is None else self.down(x)))
        return out


class ResNet18(nn.Module):
    """ResNet-18; ``dims`` 3 for volumes (N, X, Y, Z, C), 2 for images (N, H, W, C)."""

    def __init__(self, in_channels: int, num_outputs: int, dims: int = 3, width: int = 64) -> None:
        super().__init__()
        self.dims = dims
        stages = tuple(width * m for m in (1, 2, 4, 8))
        conv, norm = (nn.Conv3d, nn.BatchNorm3d) if dims == 3 else (nn.Conv2d, nn.BatchNorm2d)
        if dims == 3:
            stem: nn.Module = nn.Conv3d(in_channels, width, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False)
            layers: list[nn.Module] = [stem, norm(width), nn.ReLU(inplace=True)]
        else:
            stem = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            layers = [stem, norm(width), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
        cin = width
        for i, cout in enumerate(stages):
            stride = 1 if i == 0 else 2
            layers += [_Block(conv, norm, cin, cout, stride), _Block(conv, norm, cout, cout, 1)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool3d(1) if dims == 3 else nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(stages[-1], num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # 3D: (N, X, Y, Z, C) -> (N, C, Z, X, Y), depth being the short Z axis; 2D: (N, H, W, C) -> (N, C, H, W)
        x = x.permute(0, 4, 3, 1, 2) if self.dims == 3 else x.permute(0, 3, 1, 2)
        x = self.features(x.contiguous())
        logits: torch.Tensor = self.head(torch.flatten(self.pool(x), 1))
        return logits


def build(input_shape: tuple[int, ...], num_outputs: int, width: int = 64) -> ResNet18:
    """3D model for (X, Y, Z, C) inputs, 2D for (H, W, C); ``width`` 64 is ResNet-18."""
    if len(input_shape) == 4:
        return ResNet18(input_shape[-1], num_outputs, dims=3, width=width)
    if len(input_shape) == 3:
        return ResNet18(input_shape[-1], num_outputs, dims=2, width=width)
    raise ValueError(f"no model for sample shape {input_shape}: need (X, Y, Z, C) volumes or (H, W, C) images")


def parameter_count(model: nn.Module) -> dict[str, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() for name, b in model.named_buffers() if not name.endswith("num_batches_tracked"))
    return {"trainable": trainable, "non_trainable": buffers, "total": trainable + buffers}
