"""Test helper: write a {relative path: bytes} mapping (a dataset's files) into a folder."""

from pathlib import Path


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder
