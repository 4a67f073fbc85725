"""``make bench``: every benchmark, one after the other, into BENCHMARKS.md with the machine it ran on.

Each benchmark is its own script in ``bench/`` that measures both sides of each ratio in the same run (the
machines are shared and noisy) and prints its figures; this runs them with their default sizes, keeps
what each printed on stdout, and writes BENCHMARKS.md: the machine, the commit, and per benchmark the
command and its output. ``--smoke`` runs each at a tiny size (the test suite does, so none rots: all but
the orchestration benchmark through this, that one against the REST test's Airflow); ``--only`` picks
benchmarks by name, ``--skip`` leaves some out.

    .venv/bin/python bench/all.py [--only loop data ...] [--skip NAME ...] [--smoke] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    argv: tuple[str, ...]  # the script and its default arguments
    smoke: tuple[str, ...]  # the same script's tiny size
    in_all: bool = True  # False: only with --only (too long for every `make bench`)


# The policy alone on the replay's traces: a trace per seed and load (bench/scheduler.py --policy-only)
REPLAY_TRACES = ("--policy-only", "1", "2", "3", "4", "5", "6", "--loads", "1.0", "1.25", "1.5")
BENCHES = (
    Bench(
        "orchestration",
        "Orchestration: the pipeline under the real scheduler against the same steps in one process",
        ("bench/orchestration.py", "--runs", "3"),
        # one epoch learns too little for the default gate (val_accuracy >= 0.9): no gate at this size
        (
            "bench/orchestration.py",
            "--runs",
            "1",
            "--conf",
            '{"hyperparameters": {"epochs": 1}, "resources": {"gpus_per_node": 1}, "gates": []}',
        ),
    ),
    Bench(
        "loop",
        "Training loop: trainyard's worker against a hand-written PyTorch loop (digits defaults)",
        ("bench/loop.py", "--reps", "8", "--procs", "1", "2"),
        ("bench/loop.py", "--reps", "1", "--procs", "1", "--epochs", "2"),
    ),
    Bench(
        "data",
        "Data: worker memory against dataset size, the loader against the trainer's consumption, a split "
        "bigger than the memory limit",
        ("bench/data.py",),
        ("bench/data.py", "--samples", "400", "--scales", "1", "--workers", "0", "--limit-mb", "0"),
    ),
    Bench(
        "validation",
        "Validation: great-expectations rows/s against dataset size",
        ("bench/validation.py",),
        ("bench/validation.py", "--rows", "100", "--reps", "1"),
    ),
    Bench(
        "evaluation",
        "Evaluation: faster-coco-eval against pycocotools, and sacrebleu",
        ("bench/evaluation.py",),
        ("bench/evaluation.py", "--images", "40", "--sentences", "40", "--reps", "1"),
    ),
    Bench(
        "inference",
        "Inference: onnxruntime against eager PyTorch, per recipe model",
        ("bench/inference.py",),
        ("bench/inference.py", "--iters", "2", "--threads", "1", "--batches", "2"),
    ),
    Bench(
        "gpu",
        "GPU: GPT-2 small in bf16 through trainyard's loop against a plain loop, tokens/s and MFU",
        ("bench/gpu.py",),  # says it skipped where there is no CUDA GPU; the device machine runs it
        ("bench/gpu.py", "--cpu-smoke", "--no-compile"),
    ),
    Bench(
        "parse",
        "DAG parse time per file",
        ("bench/parse.py",),
        ("bench/parse.py", "--reps", "1"),
    ),
    Bench(
        "scheduler",
        "Scheduler replay: one multi-team job stream, static per-team partitions against trainyard's queueing",
        ("bench/scheduler.py", "--png", "docs"),
        # not in `make test` (test_cluster_profile.py replays a small trace through run_trace on its own cluster)
        ("bench/scheduler.py", "--scenarios", "trainyard", "--types", "h100-80gb", "--window", "30"),
        in_all=False,
    ),
    Bench(
        "preemption",
        "Preemption: the lender's wait, the GPU time lost, and what the stop word costs the loop",
        ("bench/scheduler.py", *REPLAY_TRACES, "--preemption"),
        ("bench/scheduler.py", "--policy-only", "1", "--loads", "1.25", "--preemption"),
    ),
    Bench(
        "start-estimates",
        "Start estimates: the expected start, its band and the latest start against when jobs started",
        ("bench/scheduler.py", *REPLAY_TRACES, "--start-estimates"),
        ("bench/scheduler.py", "--policy-only", "1", "--loads", "1.25", "--start-estimates"),
    ),
    Bench(
        "admission-scale",
        "The admission ledger with 1,000 and 10,000 jobs waiting on PostgreSQL",
        ("bench/admission_scale.py",),
        ("bench/admission_scale.py", "--waiting", "200", "--admit", "40", "--history", "1000", "--procs", "2"),
    ),
    Bench(
        "node-loss",
        "Node loss on the Kubernetes path: going on elastic against waiting for the new pod",
        ("bench/node_loss.py",),
        ("bench/node_loss.py",),  # one size: the timeouts it measures are fixed
        in_all=False,  # root, network namespaces; about two minutes
    ),
    Bench(
        "worker-loss",
        "A lost host on the cluster profile: a 2-node job going on elastic, a dead worker's job retried on another",
        ("bench/worker_loss.py",),
        ("bench/worker_loss.py",),  # one size: the timeouts it measures are fixed
        in_all=False,  # the cluster profile; about eight minutes
    ),
    Bench(
        "preemption-resume",
        "Preemption under the real executor: many borrowers preempted at once, each resumed with one version",
        ("bench/preemption_resume.py",),
        ("bench/preemption_resume.py", "--borrowers", "2"),
        in_all=False,  # an Airflow and 21 jobs' pipelines; about 21 minutes
    ),
    Bench(
        "scheduler-celery",
        "Scheduler replay on the cluster profile: the same job stream through the CeleryExecutor, the ledger in "
        "PostgreSQL",
        ("bench/scheduler.py", "--executor", "celery", "--scenarios", "trainyard"),
        (
            "bench/scheduler.py",
            "--executor",
            "celery",
            "--scenarios",
            "trainyard",
            "--types",
            "h100-80gb",
            "--window",
            "30",
        ),  # fmt: skip
        in_all=False,
    ),
)


def _first_line(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _commit() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()


def machine() -> list[str]:
    import numpy
    import onnxruntime
    import torch

    mem_kb = _first_line("/proc/meminfo", "MemTotal").split()[0]
    commit = _commit()
    return [
        f"- CPU: {_first_line('/proc/cpuinfo', 'model name')}, {len(os.sched_getaffinity(0))} cores usable",
        f"- memory: {int(mem_kb) / (1 << 20):.0f} GiB; GPU: "
        + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"),
        f"- Python {platform.python_version()}, torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"numpy {numpy.__version__}; {platform.system()} {platform.release()}",
        f"- commit {commit or 'unknown'}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    ]


def run(bench: Bench, smoke: bool) -> tuple[str, str, float]:
    """(the command as a user types it, its stdout, seconds)."""
    argv = bench.smoke if smoke else bench.argv
    env = {**os.environ, "AIRFLOW_HOME": os.environ.get("AIRFLOW_HOME", str(REPO / ".airflow"))}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"bench {bench.name} failed ({' '.join(argv)}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return ".venv/bin/python " + " ".join(shlex.quote(a) for a in argv), proc.stdout.rstrip(), took


def _sections(text: str) -> dict[str, list[str]]:
    """The benchmark sections of a BENCHMARKS.md by title, each as its lines (from the blank before it)."""
    sections: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
            sections[title] = ["", line]
        elif title is not None:
            sections[title].append(line)
    for lines in sections.values():
        while lines and not lines[-1].strip():
            lines.pop()
    return sections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHES])
    parser.add_argument("--skip", nargs="+", default=[], choices=[b.name for b in BENCHES])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that each benchmark runs")
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    args = parser.parse_args()
    chosen = [b for b in BENCHES if (b.name in args.only if args.only else b.in_all) and b.name not in args.skip]
    # --only and --skip keep the other benchmarks' sections of the file (not at a smoke size: not figures)
    keep = (args.only or args.skip) and not args.smoke and args.out.exists()
    sections = _sections(args.out.read_text()) if keep else {}
    for bench in chosen:
        print(f"== {bench.name}: {' '.join(bench.smoke if args.smoke else bench.argv)}", file=sys.stderr, flush=True)
        command, output, took = run(bench, args.smoke)
        print(output, file=sys.stderr, flush=True)
        when = f"{took:.0f} s, commit {_commit() or 'unknown'}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d}"
        sections[bench.title] = ["", f"## {bench.title}", "", f"`{command}` ({when})", "", "```", output, "```"]
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`bench/all.py`; `--only NAME` rewrites that benchmark's section and keeps the"
        " others, as `--skip NAME` keeps those it leaves out). Each ratio is measured side by side in the same"
        " run; the figures are this machine's, at the"
        " commit each section names. How each is measured: the docstring of its script.",
        "",
        *machine(),
    ]
    order = [b.title for b in BENCHES]
    for title in sorted(sections, key=lambda t: order.index(t) if t in order else len(order)):
        lines += sections[title]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
