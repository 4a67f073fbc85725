"""Import images from the layouts people have into the image-folder layout (a folder per class).

Three layouts are recognised:

* **class folders** (torchvision's ImageFolder): ``<src>/<class>/.../<image>``; copied as they are.
* **split folders** (Keras, many Kaggle and ImageNet-style downloads): ``<src>/<split>/<class>/<image>``
  with ``<split>`` among ``train``, ``val``, ``valid``, ``validation``, ``test``; becomes
  ``<class>/<split>/<image>``. trainyard splits by a hash of each key, so the given split is not kept as
  such; the split name stays in the key, so two files of the same name in two splits stay apart.
* **a CSV of labels**: ``file,label`` rows (header names ``file``/``filename``/``image``/``path``/``id``
  and ``label``/``class``/``category``), files relative to ``images_dir``; becomes ``<label>/<file>``.

Only image files (``IMAGE_EXTENSIONS``) are taken; hidden files (``.DS_Store``) and other files are
skipped and counted. Symlinks are not followed, a CSV path may not leave ``images_dir``, and a class
name must be a plain folder name. Everything is checked before the first file is written, into a new or
empty ``dest``; the result is then validated by ``trainyard data import`` like any upload.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from trainyard.data.image_folder import IMAGE_EXTENSIONS

SPLITS = ("train", "val", "valid", "validation", "test")
FILE_COLUMNS = ("file", "filename", "image", "path", "id")
LABEL_COLUMNS = ("label", "class", "category")
CLASS_RE = re.compile(r"[^/\\\x00]{1,200}")


def _class_name(name: str, where: str) -> str:
    name = name.strip()
    if not CLASS_RE.fullmatch(name) or name.startswith(".") or name in ("..", "."):
        raise ValueError(f"{where}: {name!r} cannot be a class folder name (no '/', not hidden, 1-200 chars)")
    return name


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def _walk(root: Path) -> tuple[list[Path], list[str]]:
    """(image files under ``root``, relative paths of what was skipped), symlinks never followed."""
    images, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or path.is_symlink() or not _is_image(path):
                skipped.append(path.relative_to(root).as_posix())
            else:
                images.append(path)
    return images, skipped


def detect_layout(src: Path) -> str:
    """ "splits" when every top-level folder is a split name, else "classes"."""
    top = [p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if not top:
        raise ValueError(f"{src}: no folders; expected <class>/<image> or <split>/<class>/<image>")
    return "splits" if all(p.name.lower() in SPLITS for p in top) else "classes"


def plan_folders(src: str | Path) -> tuple[dict[str, Path], list[str], str]:
    """(destination key -> source file, skipped, layout) of a class-folder or split-folder tree."""
    src = Path(src)
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory")
    layout = detect_layout(src)
    plan: dict[str, Path] = {}
    images, skipped = _walk(src)
    for path in images:
        parts = path.relative_to(src).parts
        if layout == "splits":
            if len(parts) < 3:
                skipped.append("/".join(parts))  # a file directly in a split folder has no class
                continue
            split, cls, rest = parts[0], parts[1], parts[2:]
            key = PurePosixPath(_class_name(cls, str(path)), split, *rest).as_posix()
        else:
            if len(parts) < 2:
                skipped.append("/".join(parts))  # a file at the top has no class
                continue
            key = PurePosixPath(_class_name(parts[0], str(path)), *parts[1:]).as_posix()
        plan[key] = path
    return plan, skipped, layout


def plan_csv(labels_csv: str | Path, images_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """(destination key -> source file, skipped) of a CSV of file,label rows."""
    labels_csv, images_dir = Path(labels_csv), Path(images_dir).resolve()
    with open(labels_csv, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        file_col = next((c for c in FILE_COLUMNS if c in header), None)
        label_col = next((c for c in LABEL_COLUMNS if c in header), None)
        if file_col is None or label_col is None:
            raise ValueError(
                f"{labels_csv}: header {reader.fieldnames} needs a file column (one of {FILE_COLUMNS}) and a "
                f"label column (one of {LABEL_COLUMNS})"
            )
        original = dict(zip(header, reader.fieldnames or [], strict=True))
        plan: dict[str, Path] = {}
        skipped = []
        for line, row in enumerate(reader, start=2):
            where = f"{labels_csv}:{line}"
            name, label = (row[original[file_col]] or "").strip(), row[original[label_col]] or ""
            candidates = [name] if Path(name).suffix else [name, *(name + ext for ext in IMAGE_EXTENSIONS)]
            path = next((p for c in candidates if (p := _inside(images_dir, c, where)).is_file()), None)
            if path is None:
                raise ValueError(f"{where}: {name!r} not found in {images_dir}")
            if not _is_image(path):
                skipped.append(name)
                continue
            key = PurePosixPath(_class_name(label, where), path.relative_to(images_dir).as_posix()).as_posix()
            if key in plan:
                raise ValueError(f"{where}: {name!r} is listed twice under {label!r}")
            plan[key] = path
    return plan, skipped


def _inside(images_dir: Path, name: str, where: str) -> Path:
    """``images_dir / name`` resolved, when it stays inside ``images_dir`` and is no symlink; else ValueError
    (``images_dir`` is resolved)."""
    path = images_dir / name
    if not name or images_dir not in path.resolve().parents or path.is_symlink():
        raise ValueError(f"{where}: {name!r} is not a file inside {images_dir} (or is a symlink)")
    return path.resolve()  # "a/../b.jpg" is keyed as b.jpg


def write_plan(plan: dict[str, Path], dest_dir: str | Path) -> Path:
    dest = Path(dest_dir)
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"destination {dest} is not empty")
    links = [str(p) for p in plan.values() if p.is_symlink()]  # again at copy time: a file can change
    if links:
        raise ValueError(f"symlinks are not followed: {links[:5]}")
    for key, path in plan.items():
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def import_image_folder(src: str | Path, dest_dir: str | Path) -> dict:
    """Class folders or split folders -> ``dest_dir`` in the image-folder layout; a summary."""
    plan, skipped, layout = plan_folders(src)
    if not plan:
        raise ValueError(f"{src}: no image files found ({', '.join(IMAGE_EXTENSIONS)})")
    write_plan(plan, dest_dir)
    return _summary(plan, skipped, layout)


def import_labels_csv(labels_csv: str | Path, images_dir: str | Path, dest_dir: str | Path) -> dict:
    """A CSV of file,label rows -> ``dest_dir`` in the image-folder layout; a summary."""
    plan, skipped = plan_csv(labels_csv, images_dir)
    if not plan:
        raise ValueError(f"{labels_csv}: no image files listed")
    write_plan(plan, dest_dir)
    return _summary(plan, skipped, "csv")


def _summary(plan: dict[str, Path], skipped: list[str], layout: str) -> dict:
    classes = sorted({k.split("/", 1)[0] for k in plan})
    return {
        "layout": layout,
        "images": len(plan),
        "classes": len(classes),
        "skipped": len(skipped),
        "skipped_examples": skipped[:5],
    }
