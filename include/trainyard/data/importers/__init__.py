"""Importers: turn annotation-tool exports into trainyard dataset layouts (see detection.py and
classification.py). Each returns a summary dict and refuses, with a ValueError naming the entry or
task, anything it cannot convert faithfully."""

from trainyard.data.importers.coco import import_coco
from trainyard.data.importers.labelstudio import import_labelstudio

__all__ = ["import_coco", "import_labelstudio"]
