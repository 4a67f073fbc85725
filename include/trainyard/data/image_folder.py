"""The image-folder dataset layout (torchvision's ImageFolder): a folder per class of image files.

Layout of a dataset commit::

    <class>/<file>.jpg            any of IMAGE_EXTENSIONS, any size, RGB, grayscale or palette;
    <class>/<sub/folders>/<file>  sub-folders inside a class are the class's too

The classes are the top-level folders, sorted (label = index in that order); a sample's key is its
path in the commit (``cat/0001.jpg``), so uploading the same folder again gives the same keys, hence
the same split. Preparation stores each file's bytes as they are (encoded JPEG/PNG...) in the records;
the recipe decodes, crops and resizes per batch.

Validation (``image_folder`` and ``image_folder_classes`` suites) decodes every file. Each check is a
column that is empty for a good file and says what is wrong (with the key) for a bad one, so the report
names the files: an unknown extension, a file that is not an image or does not decode, an image smaller
than MIN_SIDE, a decompression bomb (more than MAX_PIXELS pixels: refused from its header, never decoded),
the same bytes under two classes, or twice in one class (the split could put the copies in train and
val), a file outside any class folder; and a class folder with no image. Hidden folders (``.git``) are
not part of the dataset.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from trainyard.errors import DataFormatError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
# what Pillow must find inside a file, whatever its name says
IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WEBP", "PPM", "MPO")
MIN_SIDE = 8
MAX_PIXELS = 50_000_000  # below Pillow's own bomb warning (89 MP): about 8660 x 5770
# the columns of the files table that name a file's problem (empty where it has none): the suite expects null
PROBLEMS = ("not_an_image", "undecodable", "too_small", "bomb", "same_content_in_another_class", "same_content_twice")


@dataclass(frozen=True)
class Sample:
    key: str  # path in the commit: <class>/<...>/<file>
    label: int
    path: Path


@dataclass
class ImageFolder:
    classes: list[str]
    samples: list[Sample]  # the image files, by key
    other_files: list[str]  # keys of files that are not under a class folder or have no image extension
    empty_classes: list[str]


def scan(root: str | Path) -> ImageFolder:
    """The layout of a dataset folder, without opening a file."""
    root = Path(root)
    if not root.is_dir():
        raise DataFormatError(f"{root}: not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataFormatError(f"{root}: no class folders; expected <class>/<image> files (ImageFolder layout)")
    label = {c: i for i, c in enumerate(classes)}
    samples, other, counts = [], [], dict.fromkeys(classes, 0)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # .git, .ipynb_checkpoints
        for name in sorted(filenames):
            key = (Path(dirpath) / name).relative_to(root).as_posix()
            top = key.split("/", 1)[0]
            if "/" not in key or top not in label or Path(name).suffix.lower() not in IMAGE_EXTENSIONS:
                other.append(key)
                continue
            samples.append(Sample(key, label[top], Path(dirpath) / name))
            counts[top] += 1
    return ImageFolder(classes, samples, other, [c for c, n in counts.items() if n == 0])


@dataclass
class Probe:
    width: int | None = None
    height: int | None = None
    error: str | None = None  # does not open or decode
    bomb: bool = False


def probe(path: Path) -> Probe:
    """Open and fully decode one image; a header that claims more than MAX_PIXELS is not decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    return Probe(width, height, bomb=True)
                if img.format not in IMAGE_FORMATS:
                    return Probe(width, height, error=f"a {img.format} file, not one of {IMAGE_FORMATS}")
                img.load()
                return Probe(width, height)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        return Probe(bomb=True, error=str(err))  # Pillow's own limit: its message gives the size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as err:
        return Probe(error=f"{type(err).__name__}: {str(err).replace(str(path), path.name)}")


def profile_files(folder: ImageFolder):
    """One row per file, a column per check: None where the file passes, else what is wrong."""
    import pandas as pd

    rows: list[dict[str, object]] = []
    keys_of: dict[str, list[str]] = defaultdict(list)  # content digest -> keys, in sample order
    for s in folder.samples:
        digest = hashlib.sha256(s.path.read_bytes()).hexdigest()
        keys_of[digest].append(s.key)
        p = probe(s.path)
        small = p.width is not None and p.height is not None and min(p.width, p.height) < MIN_SIDE and not p.bomb
        rows.append(
            {
                "key": s.key,
                "label": s.label,
                "width": p.width,
                "height": p.height,
                "sha256": digest,
                "not_an_image": None,
                "undecodable": f"{s.key}: {p.error}" if p.error and not p.bomb else None,
                "too_small": f"{s.key}: {p.width}x{p.height} < {MIN_SIDE} px" if small else None,
                "bomb": (f"{s.key}: {p.error or f'{p.width}x{p.height} > {MAX_PIXELS} pixels'}" if p.bomb else None),
            }
        )
    for row in rows:
        key = str(row["key"])
        cls = key.split("/", 1)[0]
        first_in: dict[str, str] = {}  # another class -> its first key with these bytes
        twins = []  # other keys with these bytes in this class
        for other in keys_of[str(row["sha256"])]:
            other_cls = other.split("/", 1)[0]
            if other_cls != cls:
                first_in.setdefault(other_cls, other)
            elif other != key:
                twins.append(other)
        elsewhere = sorted(first_in.values())
        row["same_content_in_another_class"] = f"{key} = {', '.join(elsewhere)}" if elsewhere else None
        row["same_content_twice"] = f"{key} = {', '.join(twins[:3])}" if twins else None
    for key in folder.other_files:
        why = "outside any class folder" if "/" not in key else f"extension not one of {', '.join(IMAGE_EXTENSIONS)}"
        rows.append({"key": key, "label": -1, "not_an_image": f"{key}: {why}"})
    return pd.DataFrame(rows, columns=["key", "label", "width", "height", "sha256", *PROBLEMS])


def profile_classes(folder: ImageFolder):
    import pandas as pd

    counts: dict[int, int] = defaultdict(int)
    for s in folder.samples:
        counts[s.label] += 1
    return pd.DataFrame(
        {
            "class": folder.classes,
            "images": [counts[i] for i in range(len(folder.classes))],
            "empty": [f"class {c!r} has no image" if c in folder.empty_classes else None for c in folder.classes],
        }
    )


def validate_image_folder(root: str | Path, docs_dir: str | Path | None = None):
    """Both suites over a dataset folder; one merged report (Data Docs under docs_dir/files, /classes)."""
    from trainyard.data.validation import load_suite_config, merge_reports, validate_dataframe

    folder = scan(root)
    sub = (lambda name: Path(docs_dir) / name) if docs_dir is not None else (lambda name: None)
    files = validate_dataframe(profile_files(folder), load_suite_config("image_folder", {}), sub("files"))
    classes = validate_dataframe(profile_classes(folder), load_suite_config("image_folder_classes", {}), sub("classes"))
    return merge_reports("image_folder", files, classes)


def samples(root: str | Path):
    """(keys, key -> (key, label, file bytes as uint8, None), meta) for ``prepare_records``."""
    import numpy as np

    folder = scan(root)
    by_key = {s.key: s for s in folder.samples}

    def record(key: str) -> tuple:
        s = by_key[key]
        return key, s.label, np.frombuffer(s.path.read_bytes(), dtype=np.uint8), None

    return list(by_key), record, {"kind": "image_folder", "classes": folder.classes}
