"""Evaluation: COCO box mAP by faster-coco-eval (trainyard's default) against pycocotools, and sacrebleu.

COCO: ``--images`` synthetic images of 640x480 with 1-4 ground-truth boxes each over 10 categories, and
detections made from them (each box jittered, with a score; some missed; false positives added), so the
AP is neither 0 nor 1. Both backends score the same data through ``trainyard.evaluation.detection.coco_map``
(evaluate, accumulate, summarize), alternating, ``--reps`` times; medians, their ratio, and whether every
AP figure agrees are printed. sacrebleu: corpus BLEU + chrF of ``--sentences`` synthetic sentence pairs
through ``trainyard.evaluation.translation.corpus_scores``.

    .venv/bin/python bench/evaluation.py [--images 3000] [--sentences 5000] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def synthetic_coco(images: int, seed: int = 0) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(seed)
    cats = [{"id": i + 1, "name": f"c{i}"} for i in range(10)]
    gt_images, annotations, detections = [], [], []
    for image_id in range(1, images + 1):
        gt_images.append({"id": image_id, "file_name": f"{image_id}.jpg", "width": 640, "height": 480})
        for _ in range(int(rng.integers(1, 5))):
            w, h = rng.uniform(10, 200, size=2)
            x, y = rng.uniform(0, 640 - w), rng.uniform(0, 480 - h)
            cat = int(rng.integers(1, 11))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cat,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
            if rng.random() < 0.85:  # found, a little off
                jitter = rng.normal(0, 0.08, size=4) * [w, h, w, h]
                box = [max(x + jitter[0], 0), max(y + jitter[1], 0), max(w + jitter[2], 1), max(h + jitter[3], 1)]
                detections.append({"image_id": image_id, "category_id": cat, "bbox": box, "score": rng.uniform(0.3, 1)})
        for _ in range(int(rng.integers(0, 3))):  # false positives
            w, h = rng.uniform(10, 150, size=2)
            box = [rng.uniform(0, 640 - w), rng.uniform(0, 480 - h), w, h]
            detections.append(
                {
                    "image_id": image_id,
                    "category_id": int(rng.integers(1, 11)),
                    "bbox": box,
                    "score": rng.uniform(0, 0.7),
                }
            )
    return {"images": gt_images, "annotations": annotations, "categories": cats}, detections


def sentences(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(3000)]
    refs, hyps = [], []
    for _ in range(n):
        ref = [words[int(i)] for i in rng.integers(0, len(words), size=int(rng.integers(8, 30)))]
        hyp = [w if rng.random() < 0.7 else words[int(rng.integers(0, len(words)))] for w in ref]
        refs.append(" ".join(ref) + ".")  # detokenized, as sacrebleu expects
        hyps.append(" ".join(hyp) + ".")
    return hyps, refs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--sentences", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from trainyard.evaluation.detection import coco_map
    from trainyard.evaluation.translation import corpus_scores

    gt, found = synthetic_coco(args.images)
    times: dict[str, list[float]] = {"faster_coco_eval": [], "pycocotools": []}
    results = {}
    for _ in range(args.reps):
        for backend in times:
            t0 = time.perf_counter()
            results[backend] = coco_map(gt, found, backend=backend)
            times[backend].append(time.perf_counter() - t0)
    fast, slow = statistics.median(times["faster_coco_eval"]), statistics.median(times["pycocotools"])
    same = all(
        (a is None and b is None) or abs(a - b) <= 1e-9
        for a, b in zip(results["faster_coco_eval"].values(), results["pycocotools"].values(), strict=True)
    )
    print(
        f"COCO mAP, {len(gt['images'])} images, {len(gt['annotations'])} boxes, {len(found)} detections "
        f"(median of {args.reps}):"
    )
    print(f"  faster-coco-eval {fast:.3f} s  pycocotools {slow:.3f} s  ratio {slow / fast:.1f}x faster")
    print(f"  mAP {results['faster_coco_eval']['map']:.4f}; every AP figure equal within 1e-9: {same}")

    hyps, refs = sentences(args.sentences)
    spent = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        scores = corpus_scores(hyps, refs)
        spent.append(time.perf_counter() - t0)
    words = sum(len(r.split()) for r in refs)
    took = statistics.median(spent)
    print(f"sacrebleu BLEU + chrF, {len(refs)} sentences, {words} reference words (median of {args.reps}):")
    print(f"  {took:.3f} s, {len(refs) / took:.0f} sentences/s (BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f})")


if __name__ == "__main__":
    main()
