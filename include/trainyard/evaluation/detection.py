"""COCO box mAP through the COCO evaluation libraries (faster-coco-eval or pycocotools).

This module is glue: the matching, the 101-point interpolated precision and the area ranges are the
library's ``COCOeval(iouType="bbox")``; we only build its inputs from in-memory dicts and read its
``stats``. Both backends implement the same protocol and agree to float precision (see the tests);
faster-coco-eval, a C++ port, is the default: 0.28 s against pycocotools' 1.74 s on 3,000 images with
7,490 boxes and 10,862 detections, with identical mAP.

Inputs:

* ``gt``: a COCO dict as ``trainyard.data.detection.load_coco`` returns it (images, annotations,
  categories). It is deep-copied, never modified.
* ``detections``: ``[{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...]`` in pixels.

The returned dict holds ``map`` (AP averaged over IoU .50:.05:.95), ``map_50``, ``map_75`` and
``map_small`` / ``map_medium`` / ``map_large`` (COCO's area ranges: < 32², 32²..96², > 96² px), all at
100 detections per image. COCOeval reports -1 for a figure that has *no ground truth* to measure (e.g.
no large boxes in the set, or no annotations at all); -1 would read as a score, so it becomes None here.
A figure with ground truth but no matching detections is 0.0, not None.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from typing import TYPE_CHECKING, Literal, cast, get_args

if TYPE_CHECKING:
    from pycocotools.coco import _Dataset  # the stubs' TypedDict of a COCO dict

log = logging.getLogger(__name__)

Backend = Literal["pycocotools", "faster_coco_eval"]
BACKENDS: tuple[str, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "faster_coco_eval"

# COCOeval.stats[0:6], in this order, for iouType="bbox"
STAT_KEYS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large")

_DETECTION_KEYS = ("image_id", "category_id", "bbox", "score")


def _prepared_gt(gt: dict) -> dict:
    """A copy of ``gt`` that COCOeval scores correctly.

    * Annotation ids are renumbered 1..n: COCOeval records a match as the matched ground truth's id and
      treats id 0 as "unmatched", so a box with id 0 could never count as found (pycocotools scores a
      perfect detection of it as 0), and duplicate ids would collapse in its index.
    * ``area`` (used only for the small/medium/large split) defaults to w*h and ``iscrowd`` to 0, as our
      importers write them, because many exporters omit both and pycocotools needs ``area``.
    """
    gt = copy.deepcopy(gt)
    for new_id, ann in enumerate(gt["annotations"], start=1):
        ann["id"] = new_id
        ann.setdefault("area", ann["bbox"][2] * ann["bbox"][3])
        ann.setdefault("iscrowd", 0)
    return gt


def _check_detections(gt: dict, detections: list[dict]) -> list[dict]:
    image_ids = {img["id"] for img in gt["images"]}
    for i, det in enumerate(detections):
        missing = [k for k in _DETECTION_KEYS if k not in det]
        if missing:
            raise ValueError(f"detections[{i}] lacks {missing} (needs {list(_DETECTION_KEYS)})")
        if det["image_id"] not in image_ids:
            raise ValueError(f"detections[{i}]: image_id {det['image_id']!r} is not an image of the ground truth")
    # loadRes writes id/area/segmentation into the dicts it is given
    return copy.deepcopy(list(detections))


def _pycocotools_eval(gt: dict, detections: list[dict]):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    coco_gt = COCO()
    coco_gt.dataset = cast("_Dataset", gt)  # the COCO dict of the module docstring, as loadRes expects it
    coco_gt.createIndex()
    if detections:
        coco_dt = coco_gt.loadRes(detections)
    else:  # pycocotools' loadRes indexes anns[0]; an empty result set is built by hand instead
        coco_dt = COCO()
        coco_dt.dataset = {"images": gt["images"], "categories": gt["categories"], "annotations": []}
        coco_dt.createIndex()
    return COCOeval(coco_gt, coco_dt, iouType="bbox")


def _faster_coco_eval_eval(gt: dict, detections: list[dict]):
    from faster_coco_eval import COCO, COCOeval_faster

    # faster-coco-eval logs instead of printing; keep its chatter at debug level
    coco_gt = COCO(gt, print_function=log.debug)
    coco_dt = coco_gt.loadRes(detections)  # handles an empty list itself
    return COCOeval_faster(coco_gt, coco_dt, iouType="bbox", print_function=log.debug)


def coco_map(gt: dict, detections: list[dict], *, backend: str = DEFAULT_BACKEND) -> dict[str, float | None]:
    """Box mAP of ``detections`` against the COCO dict ``gt``; see the module docstring for the keys.

    No detections at all gives 0.0 wherever there is ground truth. Detections of a category id that has
    no ground truth (or is not in ``gt["categories"]``) do not count: COCO averages over the categories
    that have ground truth.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    gt = _prepared_gt(gt)
    detections = _check_detections(gt, detections)
    make = _pycocotools_eval if backend == "pycocotools" else _faster_coco_eval_eval
    # pycocotools prints progress and the summary table to stdout; task logs do not need them
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = make(gt, detections)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {
        key: (None if value == -1 else float(value)) for key, value in zip(STAT_KEYS, evaluator.stats[:6], strict=True)
    }
