"""Small CNN for image classification (the digits recipe)."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, height: int, width: int) -> None:
        super().__init__()
        self.config = {"num_classes": num_classes, "height": height, "width": width}
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * (height // 2) * (width // 2), 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def to_input(images, pixel_max: float) -> torch.Tensor:
    """uint8 (N, H, W) numpy images -> float (N, 1, H, W) in [0, 1], the model's input."""
    return torch.from_numpy(images).float().div_(float(pixel_max)).unsqueeze(1)
