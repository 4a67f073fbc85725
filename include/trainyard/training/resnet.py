"""ResNet (He et al., 2015) for the ``resnet_classifier`` recipe, and the image batches it trains on.

The modules carry torchvision's parameter names (``conv1``, ``bn1``, ``layer1.0.conv1``, ``downsample.0``,
``fc``...), so a torchvision ResNet checkpoint of the same depth at width 64 loads into it as it is
(``load_initial_weights``); nothing of torchvision is imported (its wheels do not load with the CPU torch
this project pins).

Images arrive as encoded files (the records hold a file's bytes) and are decoded per batch with Pillow:
training takes a random resized crop (a quarter to all of the image, aspect 3/4 to 4/3) and a horizontal
flip at random, evaluation resizes the short side to ``size / 0.875`` and takes the centre; both then
normalise with the ImageNet mean and standard deviation, as the torchvision checkpoints expect. The
random draws come from torch's generator: in the training process the trainer seeds it and checkpoints
its state, so a resumed run draws the same crops; a DataLoader worker (``dataset.loader_workers``) has
its own, seeded by torch per worker and not checkpointed, so a resumed run's crops differ there.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255
EVAL_CROP = 0.875


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _shortcut(cin: int, cout: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, planes * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


LAYOUTS: dict[int, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    10: (BasicBlock, (1, 1, 1, 1)),
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
}


class ResNet(nn.Module):
    def __init__(self, num_classes: int, depth: int = 18, width: int = 64, image_size: int = 224) -> None:
        super().__init__()
        if depth not in LAYOUTS:
            raise ValueError(f"depth {depth} is not one of {sorted(LAYOUTS)}")
        self.config = {"num_classes": num_classes, "depth": depth, "width": width, "image_size": image_size}
        block, counts = LAYOUTS[depth]
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = width
        stages = []
        for i, n in enumerate(counts):
            planes, stride = width * 2**i, 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, stride if j == 0 else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def load_initial_weights(model: ResNet, path: Path) -> str:
    """Copy a checkpoint's tensors into ``model`` (torchvision's layout, or one saved by trainyard; a DDP
    ``module.`` prefix is dropped). Every tensor but the classifier's must be there with its shape, else
    ValueError naming the first that are not; a classifier of another class count is left as initialised.
    Returns what was done, for the log. Read with ``weights_only``: a checkpoint cannot run code."""
    raw = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path.name}: not a state dict (a mapping of parameter names to tensors)")
    given = {k.removeprefix("module."): v for k, v in raw.items() if isinstance(v, torch.Tensor)}
    own = model.state_dict()
    # BatchNorm's step counters are not weights: torchvision's older files lack them (it fills them in)
    body = [k for k in own if not k.startswith("fc.") and not (k.endswith(".num_batches_tracked") and k not in given)]
    wrong = [
        f"{k} (missing)" if k not in given else f"{k} {tuple(given[k].shape)} != {tuple(own[k].shape)}"
        for k in body
        if k not in given or given[k].shape != own[k].shape
    ]
    if wrong:
        cfg = model.config
        raise ValueError(
            f"{path.name} does not fit a ResNet-{cfg['depth']} of width {cfg['width']}: {len(wrong)} tensors "
            f"differ, e.g. {', '.join(wrong[:3])}; use the checkpoint's depth (and width 64 for torchvision's)"
        )
    head = [k for k in own if k.startswith("fc.")]
    fits = all(k in given and given[k].shape == own[k].shape for k in head)
    load = {k: given[k] for k in body + (head if fits else [])}
    model.load_state_dict({**own, **load})
    kept = "classifier too" if fits else f"classifier re-initialised for {model.config['num_classes']} classes"
    return f"initial weights from {path.name}: {len(load)} tensors loaded, {kept}"


def _random_crop(width: int, height: int, generator: torch.Generator | None) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (scale 0.25-1, ratio 3/4-4/3): (left, top, right, bottom)."""
    area = width * height
    for _ in range(10):
        target = area * (0.25 + 0.75 * float(torch.rand(1, generator=generator)))
        ratio = math.exp(math.log(3 / 4) + math.log(16 / 9) * float(torch.rand(1, generator=generator)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            return left, top, left + w, top + h
    side = min(width, height)  # a very long image: its centre square
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def _centre_crop(width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """The box that, resized to ``size``, is evaluation's resize-short-side-then-centre-crop."""
    side = min(width, height) * EVAL_CROP
    left, top = (width - side) / 2, (height - side) / 2
    return left, top, left + side, top + side


def decode(data: np.ndarray, size: int, train: bool, generator: torch.Generator | None = None) -> np.ndarray:
    """One encoded image (its file's bytes) -> (size, size, 3) uint8, cropped as training or evaluation
    crops."""
    from PIL import Image

    with Image.open(io.BytesIO(data.tobytes())) as img:
        # JPEG: decode at a reduced scale when the image is much larger, keeping at least the pixels the
        # crop needs (a quarter of the area is half the side: twice the size; the centre crop: 1/0.875)
        keep = 2 * size if train else math.ceil(size / EVAL_CROP)
        img.draft("RGB", (keep, keep))
        rgb = img.convert("RGB")
    if train:
        box = _random_crop(*rgb.size, generator)
        out = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box)
        if float(torch.rand(1, generator=generator)) < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    else:
        out = rgb.resize((size, size), Image.Resampling.BILINEAR, box=_centre_crop(*rgb.size, size))
    return np.asarray(out)


def normalise(images: np.ndarray) -> torch.Tensor:
    """(N, S, S, 3) uint8 -> (N, 3, S, S) float32, ImageNet-normalised."""
    x = (images.astype(np.float32) - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def image_batch(batch, size: int, train: bool) -> list[torch.Tensor]:
    """A RecordBatch of encoded images -> [inputs (N, 3, size, size), int64 labels]."""
    arrays = batch.arrays if isinstance(batch.arrays, list) else list(batch.arrays)
    images = np.stack([decode(a, size, train) for a in arrays])
    return [normalise(images), torch.from_numpy(batch.labels)]
