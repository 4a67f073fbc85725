"""Data validation: great-expectations rows/s against dataset size.

The ``image_classification`` suite (13 expectations) over its per-sample profile (key, label, height,
width, pixel_min, pixel_max) at each ``--rows`` size, in one process (the first run pays GX's import and
set-up, reported apart); the median of ``--reps`` per size. A suite's cost is a fixed part (context,
suite and checkpoint set-up) plus a per-row part; rows/s shows where the fixed part stops mattering.

    .venv/bin/python bench/validation.py [--rows 1000 10000 100000 1000000] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def profile(rows: int):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "key": [f"s{i:09d}" for i in range(rows)],
            "label": rng.integers(0, 10, rows),
            "height": np.full(rows, 28),
            "width": np.full(rows, 28),
            "pixel_min": np.zeros(rows),
            "pixel_max": rng.integers(200, 256, rows).astype(float),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    t0 = time.perf_counter()
    from trainyard.data.validation import load_suite_config, validate_dataframe

    values = {"max_label": 9, "all_labels": list(range(10)), "height": 28, "width": 28, "pixel_max": 255}
    suite = load_suite_config("image_classification", values)
    first = validate_dataframe(profile(100), suite)
    assert first.success, first.summary()
    print(f"great-expectations, suite {suite['name']!r} ({len(suite['expectations'])} expectations):")
    print(f"  import + first validation of 100 rows: {time.perf_counter() - t0:.2f} s")
    for rows in args.rows:
        df = profile(rows)
        spent = []
        for _ in range(args.reps):
            t = time.perf_counter()
            report = validate_dataframe(df, suite)
            spent.append(time.perf_counter() - t)
        assert report.success, report.summary()
        took = statistics.median(spent)
        print(f"  {rows:>9} rows: {took:7.3f} s  {rows / took:>10.0f} rows/s", flush=True)


if __name__ == "__main__":
    main()
