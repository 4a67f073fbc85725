"""Every benchmark of `make bench` runs (at a tiny size) and prints the figures BENCHMARKS.md is made of;
the orchestration benchmark's, which needs a running Airflow, in tests/integration/test_rest_api.py against
that test's. Benchmarks are not tests: nothing here asserts a speed."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_every_benchmark_runs_and_reports(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "all.py"), "--smoke", "--skip", "orchestration", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert re.search(r"^- CPU: .+ cores usable$", text, re.M) and "- commit " in text
    for expected in (
        r"1 process\(es\): trainyard \d\.\d+x the hand loop's samples/s \(median of 1 epoch pairs, 95% interval "
        r"\d\.\d+-\d\.\d+x\): goal 0\.97x (met|missed|not shown)",
        r"median epoch: hand +[\d.]+ ms \(\d+ samples/s\) +trainyard +[\d.]+ ms \(\d+ samples/s\) +\(1 runs x 1 epochs",
        r"start-up, warm-up and exit: hand -?[\d.]+ s +trainyard -?[\d.]+ s +\([+-][\d.]+ s\)",
        r"tracking: on \d\.\d+x off's samples/s, overhead [+-][\d.]+% \(95% interval [+-][\d.]+% to [+-][\d.]+%",
        r"without the checkpoints \(each side's epochs less its own save\): trainyard \d\.\d+x the hand loop's "
        r"samples/s \(95% interval \d\.\d+-\d\.\d+x\)",
        r"checkpoints: 1 an epoch, [\d.]+ ms stall each = [\d.]+ steps \([\d.]+ ms a step\); [\d.]+% of an epoch; "
        r"the hand loop's torch\.save [\d.]+ ms",
        r"lmdb +1x .* \| +w0: +[\d.]+ +\d+ \( *[\d.]+x\) \|",
        r"tfrecord +1x",
        r"100 rows: +[\d.]+ s +\d+ rows/s",
        r"faster-coco-eval [\d.]+ s +pycocotools [\d.]+ s +ratio [\d.]+x faster",
        r"every AP figure equal within 1e-9: True",
        r"sacrebleu BLEU \+ chrF, 40 sentences",
        r"resnet_classifier \(ResNet-18, 64 px\) +1 +2 +[\d.]+ +[\d.]+ +[\d.]+x",
        r"transformer_translator \(greedy, 31 tokens\)",
        r"train_pipeline\.py +21 +\d+ ms",
        r"cpu-smoke \(tiny\), batch 4, bf16, compile False, best of 1:\n +hand +\d+ tokens/s +MFU",
        r"\n +trainyard +\d+ tokens/s +MFU [\d.]+% \(6N\)",
        r"preemption on: 1 traces, utilisation \d\.\d+x the reference at worst .* GPU-s lost at most [\d.]+%",
        r'"started_inside_the_band": [\d.]+',
        r"200 waiting: a decision round [\d.]+ s \([\d.]+ s with 1000 finished jobs in the history\), the policy "
        r"alone [\d.]+ CPU-s, start estimates [\d.]+ CPU-s \(\d+ jobs given a start\), [\d.]+ admissions/s",
    ):
        assert re.search(expected, text), f"{expected!r} not in\n{text}"
    assert text.count("\n## ") == 10


def test_the_gpu_benchmark_says_it_skipped_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: bench/gpu.py measures instead of skipping")
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--out", str(out)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped: no CUDA GPU" in proc.stdout
    assert "no CUDA GPU" in json.loads(out.read_text())["skipped"]


def test_the_export_parity_benchmark_runs_and_summarises(tmp_path):
    """bench/export_parity.py (not part of `make bench`: it trains 20 models per recipe) at one run of the
    two cheapest recipes; each recipe's faithful export passes its gate and its perturbed one is rejected."""
    out = tmp_path / "parity.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "export_parity.py"),
            "--runs",
            "1",
            "--recipes",
            "digits_cnn",
            "resnet_classifier",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"digits_cnn", "resnet_classifier"}
    for name, s in summary.items():
        assert s["faithful_passed"] == s["perturbed_rejected"] == 1, (name, s)
        assert f"{name:24s} faithful pass 1/1, perturbed rejected 1/1" in proc.stdout


def test_two_cpu_trainings_of_one_spec_on_two_processes_are_bit_exact(tmp_path):
    """bench/reproducibility.py (not part of `make bench`) at its smallest: docs/jobs.md's claim that CPU
    training over gloo with 2 processes gives the same weights and metrics every time, which is what lets
    `trainyard replay` hold a CPU job to a tolerance of 0."""
    out = tmp_path / "repro.json"
    argv = ["--runs", "2", "--procs", "2", "--epochs", "1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "reproducibility.py"), *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["backend"], report["procs"]) == ("gloo", 2)
    (again,) = report["against_the_first"]
    assert again["bit_exact"] and again["weights_max_abs_diff"] == 0.0, report
    assert report["first"]["val_accuracy"] > 0.1  # it trained (chance is 0.1)
