"""The parallel-text (translation pairs) dataset layout, its profile, and its validation.

Layout of a dataset commit, exactly one of::

    pairs.tsv      UTF-8, tab-separated, header line ``key<TAB>source<TAB>target``, one pair per line.
                   No quoting: a field cannot contain a tab or a newline (quote characters are literal).
    pairs.jsonl    UTF-8, one JSON object per line: {"key": ..., "source": ..., "target": ...}

``load_pairs`` only rejects what cannot be read as pairs (bad header, wrong field count, bad JSON,
missing keys); empty sides, duplicate keys and odd length ratios are left to the ``parallel_text``
suite so that every breach is reported together.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from trainyard.data.validation import ValidationReport, load_suite_config, validate_dataframe
from trainyard.errors import DataFormatError

FIELDS = ["key", "source", "target"]


@dataclass
class Pair:
    key: str | None
    source: str | None
    target: str | None


def _read_text(path: Path) -> list[str]:
    try:
        # utf-8-sig: tolerate the BOM that spreadsheet tools put in front of exported TSV
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{path}: not valid UTF-8: {exc}") from None


def _load_tsv(path: Path) -> list[Pair]:
    lines = _read_text(path)
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header != FIELDS:
        raise DataFormatError(f"{path}: header must be 'key<TAB>source<TAB>target', got {header}")
    pairs = []
    for lineno, row in enumerate(reader, start=2):
        if not row:  # blank line, e.g. a trailing one
            continue
        if len(row) != 3:
            raise DataFormatError(f"{path}:{lineno}: expected 3 tab-separated fields, got {len(row)}")
        pairs.append(Pair(*row))
    return pairs


def _load_jsonl(path: Path) -> list[Pair]:
    pairs = []
    for lineno, line in enumerate(_read_text(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{lineno}: not valid JSON: {exc}") from None
        if not isinstance(obj, dict) or any(f not in obj for f in FIELDS):
            raise DataFormatError(f"{path}:{lineno}: expected an object with keys {FIELDS}")
        for f in ("source", "target"):
            if obj[f] is not None and not isinstance(obj[f], str):
                raise DataFormatError(f"{path}:{lineno}: {f} must be a string, got {type(obj[f]).__name__}")
        # keys may be numbers in JSON; compare them as text like the TSV ones
        key = obj["key"] if obj["key"] is None else str(obj["key"])
        pairs.append(Pair(key, obj["source"], obj["target"]))
    return pairs


def load_pairs(root: str | Path) -> list[Pair]:
    """Read ``root/pairs.tsv`` or ``root/pairs.jsonl``. Raises ValueError naming the file and line."""
    root = Path(root)
    found = [p for p in (root / "pairs.tsv", root / "pairs.jsonl") if p.exists()]
    if len(found) != 1:
        # both present would leave it unclear which one is the dataset
        names = [p.name for p in found]
        raise DataFormatError(f"dataset at {root} needs exactly one of pairs.tsv, pairs.jsonl; found {names}")
    return _load_tsv(found[0]) if found[0].suffix == ".tsv" else _load_jsonl(found[0])


def _tokens(text: str | None) -> int:
    return len(text.split()) if text else 0


def profile_pairs(pairs: list[Pair]):
    """One row per pair: what the ``parallel_text`` suite checks. Lengths are whitespace tokens;
    length_ratio = target_len / source_len, null when either side is empty."""
    import pandas as pd

    src = [_tokens(p.source) for p in pairs]
    tgt = [_tokens(p.target) for p in pairs]
    return pd.DataFrame(
        {
            "key": pd.Series([p.key or None for p in pairs], dtype=object),  # "" counts as no key
            "source_len": src,
            "target_len": tgt,
            "length_ratio": [t / s if s and t else float("nan") for s, t in zip(src, tgt, strict=True)],
            "source_empty": [n == 0 for n in src],
            "target_empty": [n == 0 for n in tgt],
        }
    )


def validate_parallel_text(
    root: str | Path,
    min_ratio: float = 1 / 3,
    max_ratio: float = 3.0,
    config_dir: Path | None = None,
    docs_dir: str | Path | None = None,
) -> ValidationReport:
    """The ``parallel_text`` suite over a dataset folder (Data Docs under ``docs_dir`` when given)."""
    suite = load_suite_config("parallel_text", {"min_ratio": min_ratio, "max_ratio": max_ratio}, config_dir)
    return validate_dataframe(profile_pairs(load_pairs(root)), suite, docs_dir)
