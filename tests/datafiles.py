"""Test helpers: write a {relative path: bytes} mapping (a dataset's files) into a folder; the record of data
prepared in a folder, for a test that reads only its paths."""

from pathlib import Path

from trainyard.data import formats
from trainyard.data.prepare import PreparedData


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def prepared_in(folder: Path | str, counts: dict[str, int] | None = None, fmt: str = "lmdb") -> PreparedData:
    """A :class:`PreparedData` whose split files are ``folder``'s train and val files in ``fmt`` (named as
    ``prepare_records`` names them; the files themselves are the test's to write, if it reads them)."""
    folder = Path(folder)
    return PreparedData(
        commit="c" * 64,
        format=fmt,
        val_fraction=0.2,
        test_fraction=0.0,
        seed=0,
        counts=counts or {"train": 8, "val": 2},
        path=str(folder),
        train=str(folder / formats.filename("train", fmt)),
        val=str(folder / formats.filename("val", fmt)),
    )
