"""Classification metrics on a prepared split."""

from __future__ import annotations

import numpy as np


def predict(model, x, batch: int = 512) -> np.ndarray:
    import torch

    with torch.no_grad():
        return np.concatenate([model(x[i : i + batch]).numpy() for i in range(0, len(x), batch)])


def classification_metrics(
    logits: np.ndarray, labels: np.ndarray, prefix: str = "val", top5: bool = False
) -> dict[str, float]:
    """Accuracy, macro-F1 and the sample count; with ``top5`` also the share whose label is among the five
    highest scores (all of them, with five classes or fewer)."""
    from sklearn.metrics import accuracy_score, f1_score

    pred = logits.argmax(axis=1)
    out = {
        f"{prefix}_accuracy": float(accuracy_score(labels, pred)),
        f"{prefix}_macro_f1": float(f1_score(labels, pred, average="macro")),
        f"{prefix}_samples": float(len(labels)),
    }
    if top5:
        k = min(5, logits.shape[1])
        best = np.argpartition(-logits, k - 1, axis=1)[:, :k]
        out[f"{prefix}_top5_accuracy"] = float((best == labels[:, None]).any(axis=1).mean()) if len(labels) else 0.0
    return out


def evaluate_model(model_path: str, fmt: str, path: str, prefix: str = "val") -> dict[str, float]:
    from trainyard.data import formats
    from trainyard.recipes import load_model
    from trainyard.training.model import to_input

    _, labels, images, meta = formats.read(fmt, path)
    logits = predict(load_model(model_path), to_input(images, meta["pixel_max"]))
    return classification_metrics(logits, labels, prefix)
