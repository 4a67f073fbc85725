"""How stable and how sharp the ONNX export gate is, per built-in recipe.

For each recipe, trains the recipe's real model (its default options but for OPTIONS below, through the
Recipe interface: ``load``, ``build_model``, ``loss``, ``model_blob``, ``export``) ``--runs`` times with
different seeds, and exports each model twice through ``recipe.export`` under the default ExportSpec:

- faithfully: the gate must pass every time (the export's max |diff| and max |diff| / scale are printed);
- with ONE weight perturbed (``one_weight_perturbed``: of the 16 largest weights of the middle hidden
  layer, the one whose change moves the outputs most, moved by ``--fraction`` of that layer's RMS weight):
  the gate must reject every time.

The summary gives, per recipe, the worst faithful scaled error, the smallest perturbed one, the gate's
rtol between them, and the margins on both sides. Run from the repository root:

    .venv/bin/python bench/export_parity.py --runs 20 --out var/bench/export_parity.json

Short trainings (``--steps``) are enough: the gate compares a model with its own export, so what matters
is that the weights are trained-like (not the initial ones), not that the model is good.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainyard import recipes
from trainyard.data import classification, photos, shapes, synthetic_text
from trainyard.data.prepare import PreparedData, prepare_records
from trainyard.export import onnx_export
from trainyard.export.onnx_export import ExportFailed, one_weight_perturbed
from trainyard.spec import ExportSpec, JobSpec
from trainyard.training.data import already_batched
from trainyard.training.run_config import RunConfig

# The built-in datasets at sizes that keep one run (train + two exports) to seconds on a CPU.
DATASETS = {
    "digits_cnn": classification.digits_files,
    "centernet_detector": lambda: shapes.generate(96, seed=0),
    "transformer_translator": lambda: synthetic_text.generate(400, seed=0),
    "resnet_classifier": lambda: photos.photo_files(per_class=24, seed=0),
}
# Recipe options other than the defaults: ResNet-18 at 64 px takes minutes per run on 2 cores; a ResNet-10
# at 32 px has the same blocks (convolution, batch norm, residual sum, pooling) at a tenth of the cost.
OPTIONS = {"resnet_classifier": {"depth": 10, "width": 16, "image_size": 32}}


def prepared(name: str, root: Path) -> tuple[object, JobSpec, PreparedData]:
    recipe = recipes.get(name)
    spec = JobSpec(recipe=name, recipe_options=OPTIONS.get(name, {}), gates=())
    options = recipe.opts(spec)
    for rel, blob in DATASETS[name]().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(blob)
    data = prepare_records(
        lambda: recipe.samples(root, options), "b" * 64, root / "prepared", 0.2, 0, variant=recipe.variant(options)
    )
    return recipe, spec, data


def train(recipe, spec: JobSpec, data: PreparedData, seed: int, steps: int, out: Path) -> Path:
    torch.manual_seed(seed)
    cfg = RunConfig(spec=spec, data=data, out_dir=str(out))
    dataset, _, meta = recipe.load(cfg)
    model = recipe.build_model(meta, recipe.opts(spec))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(seed), collate_fn=already_batched
    )
    done = 0
    while done < steps:
        for batch in loader:
            opt.zero_grad()
            recipe.loss(model, list(batch)).backward()
            opt.step()
            done += 1
            if done == steps:
                break
    path = out / f"model-{seed}.pt"
    torch.save(recipe.model_blob(model.eval(), meta), path)
    return path


def verdict(recipe, spec: JobSpec, model_path: Path, data: PreparedData, out: Path, fraction: float | None) -> dict:
    """recipe.export's record and whether the gate passed; with ``fraction``, through an exporter that
    writes the model with one weight perturbed."""
    real = onnx_export.export
    if fraction is not None:

        def perturbed(model, example, path, **kwargs):
            return real(one_weight_perturbed(model, fraction, example)[0], example, path, **kwargs)

        onnx_export.export = perturbed
    out.mkdir(parents=True, exist_ok=True)
    try:
        record, passed, message = recipe.export(str(model_path), data, out, spec.export, recipe.opts(spec)), True, ""
    except ExportFailed as e:
        record, passed, message = e.record or {}, False, str(e)
    finally:
        onnx_export.export = real
    parity = record.get("parity", {})
    return {
        "passed": passed,
        "parity_passed": parity.get("passed"),
        "max_abs_diff": parity.get("max_abs_diff"),
        "max_scaled_diff": parity.get("max_scaled_diff"),
        "failed_outputs": parity.get("failed"),
        "message": message,
    }


def summarise(runs: list[dict], rtol: float, fraction: float) -> dict:
    worst_good = max(r["faithful"]["max_scaled_diff"] for r in runs)
    least_bad = min(r["perturbed"]["max_scaled_diff"] for r in runs)
    return {
        "runs": len(runs),
        "faithful_passed": sum(r["faithful"]["passed"] for r in runs),
        "perturbed_rejected": sum(not r["perturbed"]["passed"] for r in runs),
        "perturbed_rejected_by_parity": sum(r["perturbed"]["parity_passed"] is False for r in runs),
        "worst_faithful_max_abs_diff": max(r["faithful"]["max_abs_diff"] for r in runs),
        "worst_faithful_scaled": worst_good,
        "least_perturbed_scaled": least_bad,
        "rtol": rtol,
        "headroom_rtol_over_worst_faithful": rtol / worst_good if worst_good else float("inf"),
        "sharpness_least_perturbed_over_rtol": least_bad / rtol,
        "margin_least_perturbed_over_worst_faithful": least_bad / worst_good if worst_good else float("inf"),
        # an output moves linearly with a small change of one weight (checked: 0.3%..10% scale alike), so
        # this is the smallest change the gate rejects on every run so far
        "rejected_from_fraction_est": fraction * rtol / least_bad,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=60, help="training steps per run (batch 32)")
    ap.add_argument(
        "--fraction",
        type=float,
        default=0.03,
        help="the perturbed weight moves by this fraction of its layer's RMS weight",
    )
    ap.add_argument("--recipes", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    ap.add_argument("--out", type=Path, help="also write every run's figures as JSON here")
    args = ap.parse_args(argv)
    gate = ExportSpec()
    print(
        f"gate: |onnx - torch| <= atol={gate.atol} + rtol (each recipe's export_rtol) x each output's max |value|; "
        f"{args.runs} runs x {args.steps} steps; perturbation {args.fraction} x layer RMS"
    )
    results: dict[str, list] = {name: [] for name in args.recipes}
    summary: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setups = {name: prepared(name, root / name / "data") for name in args.recipes}
        # seeds outside, recipes inside: a long run that is stopped early has figures for every recipe
        for seed in range(args.runs):
            for name, (recipe, spec, data) in setups.items():
                t0 = time.perf_counter()
                run_dir = root / name / str(seed)
                run_dir.mkdir(parents=True)
                model_path = train(recipe, spec, data, seed, args.steps, run_dir)
                good = verdict(recipe, spec, model_path, data, run_dir / "faithful", None)
                bad = verdict(recipe, spec, model_path, data, run_dir / "perturbed", args.fraction)
                results[name].append({"seed": seed, "faithful": good, "perturbed": bad})
                print(
                    f"{name:24s} seed {seed:2d}  faithful: max|diff| {good['max_abs_diff']:.3g} scaled "
                    f"{good['max_scaled_diff']:.3g} {'PASS' if good['passed'] else 'FAIL ' + good['message']}  "
                    f"| perturbed: scaled {bad['max_scaled_diff']:.3g} "
                    f"{'REJECTED ' + str(bad['failed_outputs']) if not bad['passed'] else 'PASSED (gate not sharp)'}"
                    f"  ({time.perf_counter() - t0:.1f}s)",
                    flush=True,
                )
                summary[name] = summarise(results[name], recipes.get(name).export_rtol, args.fraction)
            if args.out:  # after each seed, so a long run that is stopped still leaves its figures
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(
                    json.dumps(
                        {
                            "gate": gate.model_dump(),
                            "args": {k: str(v) for k, v in vars(args).items()},
                            "summary": summary,
                            "runs": results,
                        },
                        indent=1,
                    )
                )
    print("\nsummary (scaled = max |onnx - torch| / the output's max |value|; the gate's bound is rtol)")
    for name, s in summary.items():
        print(
            f"{name:24s} faithful pass {s['faithful_passed']}/{s['runs']}, perturbed rejected "
            f"{s['perturbed_rejected']}/{s['runs']} (by parity {s['perturbed_rejected_by_parity']}); worst faithful "
            f"{s['worst_faithful_scaled']:.3g} (abs {s['worst_faithful_max_abs_diff']:.3g}) < rtol {s['rtol']:g} "
            f"(x{s['headroom_rtol_over_worst_faithful']:.0f}) < least perturbed {s['least_perturbed_scaled']:.3g} "
            f"(x{s['sharpness_least_perturbed_over_rtol']:.1f}); "
            f"margin x{s['margin_least_perturbed_over_worst_faithful']:.0f}; "
            f"rejects one weight moved by >= {s['rejected_from_fraction_est']:.2%} of its layer's RMS"
        )
    ok = all(s["faithful_passed"] == s["runs"] == s["perturbed_rejected"] for s in summary.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
