"""What training the same job twice gives: the digits recipe trained ``--runs`` times with one spec (seed,
data, world size), through the local launcher and the one worker loop as every run trains, and each run's
val metrics and final weights compared with the first run's. It fills the reproducibility table of docs/jobs.md:
bit-exact (every metric and every weight equal), or by how much they differ, which is what
``trainyard replay``'s tolerance must allow.

    python bench/reproducibility.py [--runs 3] [--procs 2] [--precision fp32] [--epochs 3] [--out r.json]

On CPU the workers talk over gloo; with a CUDA GPU (one process per GPU, ``--procs`` at most the GPUs)
over NCCL, and bf16 is possible. It needs no Airflow or MLflow (the device machine runs it as it is).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "include"))
sys.path.insert(0, str(REPO / "tests"))  # datafiles: the digits written as an image folder

import torch  # noqa: E402

from trainyard.data.prepare import PreparedData  # noqa: E402


def train_once(prepared: PreparedData, out: Path, procs: int, precision: str, epochs: int) -> tuple[dict, dict]:
    """One training in the pipeline's run layout; (its result record, its final weights)."""
    from trainyard import pipeline
    from trainyard.spec import parse_spec
    from trainyard.training import metrics
    from trainyard.training.launchers import local
    from trainyard.training.run_config import RunConfig, work_dir

    spec = parse_spec(
        {
            "hyperparameters": {"epochs": epochs, "batch_size": 32, "seed": 7},
            "distributed": {"strategy": "ddp", "precision": precision},
            "resources": {"gpus_per_node": procs},
        }
    )
    work = Path(work_dir(str(out)))
    work.mkdir(parents=True)
    cfg = RunConfig(
        spec=spec, data=prepared, out_dir=str(work), metrics_file=str(metrics.metrics_path(out)), tensorboard_dir=None
    )
    config = cfg.dump(out / "run_config.json")
    local.launch(spec, prepared, run_dir=str(out), config_path=str(config), on_line=lambda line: None)
    result = pipeline.built_in_result(out)
    blob = torch.load(result["model_path"], map_location="cpu", weights_only=True)
    weights = blob.get("state_dict", blob) if isinstance(blob, dict) else {}
    return result, {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2, help="worker processes (GPUs, where there are)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", help="also write the figures here (JSON)")
    args = parser.parse_args()
    from datafiles import write_files
    from trainyard.data.classification import digits_files
    from trainyard.recipes.digits import prepare_classification

    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the workers may run as a sandbox user
        prepared = prepare_classification(write_files(root / "digits", digits_files()), "d" * 64, root / "p", 0.2, 0)
        runs = [
            train_once(prepared, root / f"run{i}", args.procs, args.precision, args.epochs) for i in range(args.runs)
        ]
    (first, w0), rows = runs[0], []
    if not w0:
        raise SystemExit(f"{first['model_path']} held no weights to compare: is it still a state dict?")
    names = sorted(k for k in first if k.startswith("val_"))
    for i, (result, weights) in enumerate(runs[1:], start=1):
        same_keys = weights.keys() == w0.keys() and all(weights[k].shape == w0[k].shape for k in w0)
        worst = (
            max((float((weights[k].double() - w0[k].double()).abs().max()) for k in w0), default=0.0)
            if same_keys
            else None
        )
        rows.append(
            {
                "run": i,
                "metrics": {n: result.get(n) - first[n] for n in names},
                "weights_max_abs_diff": worst,
                "bit_exact": same_keys
                and all(torch.equal(weights[k], w0[k]) for k in w0)
                and all(result.get(n) == first[n] for n in names),
            }
        )
    cuda = torch.cuda.is_available()
    report = {
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "backend": "nccl" if cuda else "gloo",
        "procs": args.procs,
        "precision": args.precision,
        "epochs": args.epochs,
        "first": {n: first[n] for n in names},
        "against_the_first": rows,
    }
    print(
        f"{args.runs} runs of digits, {args.procs} process(es) over {report['backend']}, {args.precision}, "
        f"{args.epochs} epochs, on {report['device']} (torch {torch.__version__}):"
    )
    print("  first run: " + ", ".join(f"{n} {first[n]:.10g}" for n in names))
    for r in rows:
        diffs = ", ".join(f"{n} {d:+.3g}" for n, d in r["metrics"].items())
        verdict = "bit-exact" if r["bit_exact"] else "differs"
        worst = (
            "not comparable (other tensors)"
            if r["weights_max_abs_diff"] is None
            else f"{r['weights_max_abs_diff']:.3g}"
        )
        print(f"  run {r['run']}: {verdict}; {diffs}; the {len(w0)} weight tensors' max |diff| {worst}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
