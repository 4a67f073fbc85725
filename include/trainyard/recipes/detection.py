"""``centernet_detector``: object detection on COCO-format data with a small CenterNet.

Data: any dataset commit in the COCO layout of :mod:`trainyard.data.detection` (``annotations.json`` +
``images/``): the built-in synthetic shapes, a COCO export, or a Label Studio import. Preparation
resizes every image to ``image_size`` square RGB and keeps the original boxes and size with the record,
so evaluation maps the predictions back and scores them against the original annotations with COCO's
own evaluator: faster-coco-eval by default, pycocotools with ``coco_backend`` (the same figures; the tests
check the two against each other).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from pydantic import Field

from trainyard.evaluation.detection import DEFAULT_BACKEND, Backend
from trainyard.recipes.base import Options, Recipe
from trainyard.recipes.shared import companion_model, read_split, save_input_example, verify_export

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData
    from trainyard.training.centernet import CenterNet

BATCH = 128


def _load_image(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB from a PNG/JPEG (anything Pillow reads) or an .npy of (H, W[, C])."""
    from PIL import Image

    if path.suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.ndim == 2:
            arr = np.stack([arr] * 3, axis=-1)
        if arr.dtype != np.uint8:
            arr = np.clip(arr, 0, 255).astype(np.uint8)
        return arr[..., :3]
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    if image.shape[0] == size and image.shape[1] == size:
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))


def ground_truth(targets: list[dict], meta: dict) -> dict:
    """The split's COCO ground truth for ``coco_map``: original image sizes, boxes, areas and crowd flags
    (COCOeval ignores detections on crowd regions rather than counting them as false positives)."""
    images: list[dict] = []
    annotations: list[dict] = []
    for t in targets:
        images.append({"id": t["image_id"], "file_name": t["file_name"], "width": t["width"], "height": t["height"]})
        n = len(t["boxes"])
        for box, cat, area, crowd in zip(
            t["boxes"], t["category_ids"], t.get("areas", [None] * n), t.get("iscrowd", [0] * n), strict=True
        ):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": t["image_id"],
                    "category_id": cat,
                    "bbox": box,
                    "area": box[2] * box[3] if area is None else area,
                    "iscrowd": crowd,
                }
            )
    return {"images": images, "annotations": annotations, "categories": meta["categories"]}


def training_boxes(target: dict, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """The non-crowd boxes of one record in model-input pixels, and their category indices."""
    size = meta["image_size"]
    index = {c["id"]: i for i, c in enumerate(meta["categories"])}
    crowd = target.get("iscrowd", [0] * len(target["boxes"]))
    keep = [i for i, c in enumerate(crowd) if not c]
    scale = np.array([size / target["width"], size / target["height"]] * 2, dtype=np.float64)
    boxes = np.asarray([target["boxes"][i] for i in keep], dtype=np.float64).reshape(-1, 4) * scale
    return boxes, np.array([index[target["category_ids"][i]] for i in keep], dtype=int)


def detection_batch(batch, meta: dict) -> list[torch.Tensor]:
    """A RecordBatch of (S, S, 3) uint8 images with their targets -> [images (N, 3, S, S) in [0, 1], then
    the dense CenterNet targets], built per batch (not held for the split: 80 classes at 512 px would be
    ~5 MB of targets an image)."""
    from trainyard.training.centernet import STRIDE, gaussian_targets

    x = torch.from_numpy(np.ascontiguousarray(batch.arrays.transpose(0, 3, 1, 2))).float().div_(255.0)
    grid = meta["image_size"] // STRIDE
    per_image = [gaussian_targets(*training_boxes(t, meta), len(meta["categories"]), grid) for t in batch.targets]
    return [x, *(torch.from_numpy(np.stack(maps)) for maps in zip(*per_image, strict=True))]


def detections(heads: list[np.ndarray], targets: list[dict], meta: dict, top_k: int) -> list[dict]:
    """COCO result dicts from the model's raw maps, boxes scaled back to each original image."""
    from trainyard.training.centernet import decode

    size = meta["image_size"]
    cats = [c["id"] for c in meta["categories"]]
    out = []
    heatmap, sizes, offsets = heads
    for t, dets in zip(targets, decode(heatmap, sizes, offsets, top_k=top_k), strict=True):
        sx, sy = t["width"] / size, t["height"] / size
        for c, score, (x, y, w, h) in dets:
            out.append(
                {
                    "image_id": t["image_id"],
                    "category_id": cats[c],
                    "score": score,
                    "bbox": [x * sx, y * sy, w * sx, h * sy],
                }
            )
    return out


def torch_heads(model, x: torch.Tensor, device=None, dtype=torch.float32) -> list[np.ndarray]:
    was_training = model.training
    model.eval()
    parts = []
    with torch.no_grad():
        for i in range(0, len(x), BATCH):
            xb = x[i : i + BATCH] if device is None else x[i : i + BATCH].to(device, dtype)
            parts.append([o.float().cpu().numpy() for o in model(xb)])
    model.train(was_training)
    return [np.concatenate(p) for p in zip(*parts, strict=True)]


def onnx_heads(session, x: np.ndarray) -> list[np.ndarray]:
    parts = [session.run(None, {"image": x[i : i + BATCH]}) for i in range(0, len(x), BATCH)]
    return [np.concatenate(p) for p in zip(*parts, strict=True)]


def prefixed(metrics: dict, split: str) -> dict[str, float]:
    """coco_map's dict as ``<split>_map`` etc.; figures COCO could not measure (None) are left out."""
    return {f"{split}_{k}": float(v) for k, v in metrics.items() if v is not None}


class DetectionOptions(Options):
    """``recipe_options`` of centernet_detector."""

    image_size: int = Field(
        64,
        ge=16,
        le=1024,
        multiple_of=4,
        description=(
            "side of the square model input in pixels, a multiple of 4 (the output stride) in 16..1024; "
            "images are resized to it when the data is prepared"
        ),
    )
    width: int = Field(32, ge=4, le=512, description="channels of the first backbone stage, in 4..512")
    top_k: int = Field(50, ge=1, le=1000, description="detections kept per image, in 1..1000")
    coco_backend: Backend = Field(
        DEFAULT_BACKEND,
        description="the COCO evaluator: faster_coco_eval (C++, about 6x faster) or pycocotools (the same figures)",
    )


class CenterNetDetector(Recipe[DetectionOptions]):
    name = "centernet_detector"
    data_kind = "coco_detection"
    options_model = DetectionOptions
    metrics = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large")
    epoch_metrics = ("loss", "map", "map_50")
    export_rtol = 4e-6  # 20 trainings: faithful exports <= 4.3e-7 of scale, one moved weight >= 9.2e-5

    # -- data ----------------------------------------------------------------------------------------------
    def validate(self, dataset_dir, docs_dir):
        from trainyard.data.detection import validate_detection

        return validate_detection(dataset_dir, docs_dir=docs_dir)

    def samples(self, dataset_dir, options: DetectionOptions):
        from trainyard.data.detection import load_coco

        root = Path(dataset_dir)
        coco = load_coco(root)
        size = options.image_size
        boxes: dict[int, list] = {img["id"]: [] for img in coco["images"]}
        for ann in coco["annotations"]:
            boxes[ann["image_id"]].append(ann)
        images = {f"image-{img['id']}": img for img in coco["images"]}

        def record(key: str) -> tuple:
            img = images[key]
            anns = boxes[img["id"]]
            # crowd regions are kept for scoring (COCO ignores detections on them) but never trained on
            target = {
                "image_id": img["id"],
                "file_name": img["file_name"],
                "width": img["width"],
                "height": img["height"],
                "boxes": [[float(v) for v in a["bbox"]] for a in anns],
                "category_ids": [a["category_id"] for a in anns],
                "areas": [float(a.get("area", a["bbox"][2] * a["bbox"][3])) for a in anns],
                "iscrowd": [int(a.get("iscrowd", 0)) for a in anns],
            }
            return key, len(anns), _resize(_load_image(root / "images" / img["file_name"]), size), target

        categories = [{"id": c["id"], "name": c["name"]} for c in sorted(coco["categories"], key=lambda c: c["id"])]
        return list(images), record, {"kind": self.data_kind, "categories": categories, "image_size": size}

    def variant(self, options: DetectionOptions):
        return f"{self.name}:{options.image_size}"

    # -- training ------------------------------------------------------------------------------------------
    @staticmethod
    def _tensors(data: PreparedData, split: str):
        """(images as one float tensor, targets, meta) of a split, for evaluation and export."""
        _, _, images, meta, targets = read_split(data, split)
        x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).float().div_(255.0)
        return x, targets, meta

    def load(self, cfg):
        from trainyard.training.data import RecordDataset, load_split

        cache_mb = cfg.spec.dataset.memory_cache_mb
        train, val = load_split(cfg.data, "train", cache_mb), load_split(cfg.data, "val", cache_mb)
        collate = functools.partial(detection_batch, meta=train.meta)
        val_data = {"dataset": RecordDataset(val, collate), "top_k": self.opts(cfg.spec).top_k, "meta": train.meta}
        return RecordDataset(train, collate), val_data, train.meta

    def build_model(self, meta, options: DetectionOptions):
        from trainyard.training.centernet import CenterNet

        return CenterNet(len(meta["categories"]), meta["image_size"], options.width)

    def loss(self, model, batch):
        from trainyard.training.centernet import loss

        x, *maps = batch
        return loss(model(x), *maps)

    def val_metrics(self, model, val, device, dtype=torch.float32):
        from trainyard.evaluation.detection import coco_map
        from trainyard.training.centernet import loss

        was_training = model.training
        model.eval()
        losses, targets, found = [], [], []
        dataset, meta = val["dataset"], val["meta"]
        with torch.no_grad():
            for records, (x, *maps) in dataset.record_batches(BATCH):
                out = [o.float().cpu() for o in model(x.to(device, dtype))]
                losses.append(float(loss(out, *maps)) * len(x))
                found += detections([o.numpy() for o in out], records.targets, meta, val["top_k"])
                targets += records.targets  # the boxes only: the split's maps and images are never held
        model.train(was_training)
        val_loss = sum(losses) / max(len(dataset), 1)
        m = coco_map(ground_truth(targets, meta), found)
        return {"val_loss": val_loss, "val_map": m["map"] or 0.0, "val_map_50": m["map_50"] or 0.0}

    def model_blob(self, model, meta):
        return {**super().model_blob(model, meta), "categories": meta["categories"]}

    def model_from_blob(self, blob):
        from trainyard.training.centernet import CenterNet

        model = CenterNet(**blob["config"])
        model.load_state_dict(blob["state_dict"])
        model.categories = blob["categories"]
        return model.eval()

    # -- evaluation and export -----------------------------------------------------------------------------
    def _split_metrics(self, heads, targets, meta, split, options: DetectionOptions) -> dict[str, float]:
        """COCO mAP figures of the split; ``<split>_map`` is 0.0 (not absent) when the split has no boxes."""
        from trainyard.evaluation.detection import coco_map

        gt = ground_truth(targets, meta)
        found = detections(heads, targets, meta, options.top_k)
        return {f"{split}_map": 0.0, **prefixed(coco_map(gt, found, backend=options.coco_backend), split)}

    def evaluate(self, model_path, data, split, options):
        from trainyard.recipes import load_model

        x, targets, meta = self._tensors(data, split)
        heads = torch_heads(load_model(model_path), x)
        metrics = self._split_metrics(heads, targets, meta, split, options)
        return metrics, {"coco_backend": options.coco_backend, "coco_iou_type": "bbox"}

    def export(self, model_path, data, out_dir, export, options):
        from trainyard.export.onnx_export import export as to_onnx
        from trainyard.export.onnx_export import onnx_session
        from trainyard.recipes import load_model

        model = load_model(model_path)
        x, targets, meta = self._tensors(data, "val")
        batch = torch.export.Dim("batch", min=1, max=65536)
        onnx_path = to_onnx(
            model,
            x[:2],
            Path(out_dir) / "model.onnx",
            input_names=("image",),
            output_names=("heatmap", "size", "offset"),
            dynamic_shapes={"x": {0: batch}},
        )
        session = onnx_session(onnx_path)
        heads_torch, heads_onnx = torch_heads(model, x), onnx_heads(session, x.numpy())
        fixed = slice(0, 16)
        map_torch = self._split_metrics(heads_torch, targets, meta, "val", options)["val_map"]
        map_onnx = self._split_metrics(heads_onnx, targets, meta, "val", options)["val_map"]
        return verify_export(
            onnx_path=onnx_path,
            torch_outputs=[h[fixed] for h in heads_torch],
            onnx_outputs=[h[fixed] for h in heads_onnx],
            export=export,
            default_rtol=self.export_rtol,
            metric="val_map",
            torch_metric=map_torch,
            onnx_metric=map_onnx,
            model=model,
            inputs=x[fixed],
            out_dir=out_dir,
            extra={"input_example": save_input_example(out_dir, {"image": x[:1].numpy()})},
        )

    def onnx_metrics(self, onnx_path, data, options):
        """A registered version's val mAP through its ONNX file. Its categories and input size come from
        its own model.pt; a champion trained on other categories or another input size is not comparable."""
        from trainyard.export.onnx_export import onnx_session

        x, targets, meta = self._tensors(data, "val")
        champion = cast("CenterNet", companion_model(onnx_path))  # registered under this recipe's model name
        theirs = [(c["id"], c["name"]) for c in champion.categories]
        ours = [(c["id"], c["name"]) for c in meta["categories"]]
        if theirs != ours or champion.config["image_size"] != meta["image_size"]:
            raise ValueError(
                f"the registered model at {onnx_path} was trained on categories {theirs} at "
                f"{champion.config['image_size']} px; this data has {ours} at {meta['image_size']} px: "
                "not comparable on this data"
            )
        return self._split_metrics(onnx_heads(onnx_session(onnx_path), x.numpy()), targets, meta, "val", options)
