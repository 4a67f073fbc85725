"""Upload a local folder as a new dataset version: check the files, validate, and commit only if valid.

The commit equals the folder: files on the branch that are not in the folder are removed, so a dataset
version is exactly what was validated. Appending samples = add files to the folder and upload again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from trainyard.data.kinds import VALIDATORS
from trainyard.data.store import Entry, NotFound, StoreError, check_path, ensure_repo, tree_digest
from trainyard.errors import PermanentError

KIND_MARKERS = {
    "image_classification": ("classes.json", "labels.csv"),
    "coco_detection": ("annotations.json",),
    "parallel_text": ("pairs.tsv",),
}


class UploadError(StoreError, PermanentError):
    """The folder was refused (unreadable, unknown kind, failed validation): fix the folder."""


def collect_folder(folder: str | Path) -> dict[str, Path]:
    """Repo path -> local file for every file under ``folder``.

    Refused: a missing or empty folder, symlinks that lead outside it, anything but regular files."""
    root = Path(folder)
    if not root.is_dir():
        raise UploadError(f"{folder}: not a directory")
    root = root.resolve()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = path.resolve()
                if root != target and root not in target.parents:
                    raise UploadError(f"{rel}: symlink points outside the folder ({target})")
                if target.is_dir():
                    raise UploadError(f"{rel}: symlinked directories are not followed; copy the files instead")
            if name in dirnames and not path.is_symlink():
                continue
            if not path.is_file():
                raise UploadError(f"{rel}: not a regular file")
            files[check_path(rel)] = path
    if not files:
        raise UploadError(f"{folder}: the folder has no files; nothing to upload")
    return files


def folder_digest(files: dict[str, Path]) -> str:
    """The tree digest the store will give these files; it ties a validation to the exact bytes."""
    entries = []
    for rel, path in files.items():
        data = path.read_bytes()
        entries.append(Entry(rel, hashlib.sha256(data).hexdigest(), len(data)))
    return tree_digest(entries)


def detect_kind(folder: str | Path) -> str:
    root = Path(folder)
    for kind, markers in KIND_MARKERS.items():
        if all((root / m).exists() for m in markers):
            return kind
    if (root / "pairs.jsonl").exists():
        return "parallel_text"
    top = [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []
    if top and all(p.is_dir() for p in top):
        return "image_folder"  # a folder per class, nothing else at the top (torchvision's ImageFolder)
    raise UploadError(
        f"{folder}: cannot tell the data kind; expected one of: "
        + "; ".join(f"{k} ({' + '.join(m)})" for k, m in KIND_MARKERS.items())
        + "; image_folder (only a folder per class at the top, images inside)"
    )


def validate_folder(folder: str | Path, kind: str, docs_dir: str | Path | None = None):
    """Run the data kind's expectation suite(s) over a dataset folder; returns a ValidationReport."""
    import importlib

    if kind not in VALIDATORS:
        raise UploadError(f"unknown data kind {kind!r}; allowed: {sorted(VALIDATORS)}")
    module, function = VALIDATORS[kind].split(":")
    return getattr(importlib.import_module(module), function)(folder, docs_dir=docs_dir)


def upload_folder(
    store,
    repo: str,
    branch: str,
    folder: str | Path,
    *,
    kind: str = "auto",
    message: str = "",
    metadata: dict | None = None,
    expected_digest: str | None = None,
) -> dict:
    """Validate ``folder`` and commit it to ``repo``/``branch``. Nothing is staged if validation fails.

    ``expected_digest`` (from an earlier validation) makes the commit refuse files changed since."""
    files = collect_folder(folder)
    digest = folder_digest(files)
    if expected_digest and digest != expected_digest:
        raise UploadError(f"{folder}: files changed since validation (digest {digest[:12]} != {expected_digest[:12]})")
    kind = detect_kind(folder) if kind == "auto" else kind
    report = validate_folder(folder, kind)
    if not report.success:
        raise UploadError(f"{folder} failed validation; nothing committed.\n{report.summary()}")
    ensure_repo(store, repo, branch)
    try:
        head = store.resolve(repo, branch)
    except NotFound:  # a new repo or branch: no commit yet
        head = None
    # One atomic call: concurrent uploads to one branch each get a commit equal to their own folder, and
    # every one of them lands in the branch's history (a stage-then-commit would mix them).
    commit = store.commit_files(
        repo,
        branch,
        {rel: path.read_bytes() for rel, path in files.items()},
        message or f"upload {Path(folder).name}",
        {"kind": kind, "validated_by": report.suite, "digest": digest, **(metadata or {})},
        replace=True,
    )
    return {
        "repo": repo,
        "branch": branch,
        "commit": commit.id,
        # False when the folder equals the branch's head: nothing was committed, nothing is announced
        "new_commit": commit.id != head,
        "kind": kind,
        "files": len(files),
        "digest": digest,
        "validation": report.summary(),
        "store": store.kind,
    }
