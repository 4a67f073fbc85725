"""The export gate of every built-in recipe is stable and sharp: a faithful export of a (briefly) trained
model passes under the default ExportSpec, and the same export with ONE weight of a hidden layer moved by
a few percent of that layer's weight scale (one whose change reaches the outputs) is rejected, with the
differing outputs named.

bench/export_parity.py measures the same on 20 trainings per recipe (at the recipes' default sizes but
resnet_classifier's, a ResNet-10 of width 16 at 32 px)."""

import pytest
import torch

from datafiles import write_files
from trainyard import recipes
from trainyard.data import classification, photos, shapes, synthetic_text
from trainyard.data.prepare import prepare_records
from trainyard.export import onnx_export
from trainyard.export.onnx_export import ExportFailed, one_weight_perturbed
from trainyard.spec import ExportSpec, JobSpec
from trainyard.training.data import already_batched
from trainyard.training.run_config import RunConfig

FRACTION = 0.03  # of the layer's RMS weight: a realistic small corruption of one number
STEPS = 20
CASES = {
    "digits_cnn": (classification.digits_files, {}, ["logits"]),
    "centernet_detector": (lambda: shapes.generate(24, seed=2), {"width": 8}, ["heatmap", "size", "offset"]),
    "transformer_translator": (
        lambda: synthetic_text.generate(80, seed=2),
        {"d_model": 16, "nhead": 2, "layers": 1, "ff": 32},
        ["logits"],
    ),
    "resnet_classifier": (
        lambda: photos.photo_files(per_class=8, seed=2),
        {"depth": 10, "width": 8, "image_size": 32},
        ["logits"],
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def trained(request, tmp_path_factory):
    """(recipe, spec, prepared data, model.pt) after STEPS optimiser steps through the recipe's own loss."""
    name = request.param
    make, options, _ = CASES[name]
    recipe = recipes.get(name)
    spec = JobSpec(recipe=name, recipe_options=options, gates=(), export=ExportSpec(torchscript=True))
    root = write_files(tmp_path_factory.mktemp(name), make())
    opts = recipe.opts(spec)
    data = prepare_records(
        lambda: recipe.samples(root, opts), "e" * 64, root / "prepared", 0.3, 0, variant=recipe.variant(opts)
    )
    torch.manual_seed(0)
    train, _, meta = recipe.load(RunConfig(spec=spec, data=data, out_dir=str(root)))
    model = recipe.build_model(meta, opts).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(
        train, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0), collate_fn=already_batched
    )
    # 20 steps: an untrained CenterNet's heatmap is its constant prior bias, which no hidden weight moves
    # the batch stream is longer than STEPS on purpose: zip stops after STEPS steps
    for _, batch in zip(range(STEPS), (b for _ in range(STEPS) for b in loader), strict=False):
        optimiser.zero_grad()
        recipe.loss(model, list(batch)).backward()
        optimiser.step()
    path = root / "model.pt"
    torch.save(recipe.model_blob(model.eval(), meta), path)
    return recipe, spec, data, path


def test_faithful_export_passes_the_default_gate(trained, tmp_path):
    recipe, spec, data, model_path = trained
    out = recipe.export(str(model_path), data, tmp_path, spec.export, recipe.opts(spec))
    parity = out["parity"]
    assert parity["passed"] and parity["failed"] == [] and parity["rtol"] == recipe.export_rtol
    assert list(parity["outputs"]) == CASES[recipe.name][2]  # one figure per named graph output
    assert all(o["scale"] > 0 and o["scaled_diff"] <= recipe.export_rtol for o in parity["outputs"].values())
    assert out["torchscript_parity"]["passed"]


def test_one_perturbed_weight_is_rejected_naming_the_outputs(trained, tmp_path, monkeypatch):
    recipe, spec, data, model_path = trained
    real = onnx_export.export
    changed = []

    def corrupting(model, example, path, **kwargs):
        bad, name, index = one_weight_perturbed(model, FRACTION, example)
        changed.append((model, bad, name, index))
        return real(bad, example, path, **kwargs)

    monkeypatch.setattr(onnx_export, "export", corrupting)
    with pytest.raises(ExportFailed) as caught:
        recipe.export(str(model_path), data, tmp_path, spec.export, recipe.opts(spec))
    assert changed, "the exporter under test was not the one the recipe called"
    parity = caught.value.record["parity"]
    assert not parity["passed"] and parity["failed"]
    assert set(parity["failed"]) <= set(CASES[recipe.name][2])
    message = str(caught.value)
    assert "ONNX outputs differ beyond rtol=" in message
    for name in parity["failed"]:
        assert f"{name} (" in message
    # the TorchScript file is traced from the true model: it passes, and says so in the same record
    assert caught.value.record["torchscript_parity"]["passed"]

    # what was exported differs from the true model in exactly one weight of a hidden layer, by FRACTION
    # of that layer's RMS weight
    [(model, bad, name, index)] = changed
    before, after = dict(model.named_parameters()), dict(bad.named_parameters())
    differ = {n: int((before[n] != after[n]).sum()) for n in before if not torch.equal(before[n], after[n])}
    assert differ == {name: 1}
    weights = [n for n, p in model.named_parameters() if p.ndim >= 2]
    assert name not in (weights[0], weights[-1])
    w = before[name].detach().reshape(-1)
    step = float((after[name].detach().reshape(-1) - w)[index])
    assert step == pytest.approx(FRACTION * float(w.pow(2).mean().sqrt()), rel=1e-3)


def test_a_perturbation_the_outputs_cannot_show_is_refused_not_made():
    # the middle layer sees only zeros: no change of its weights reaches the outputs, and no gate could
    # catch it; a test or benchmark built on it would claim a sharpness it never measured
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4, bias=False), torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)
    )
    with pytest.raises(ValueError, match="changes Sequential's outputs on this example"):
        one_weight_perturbed(model, FRACTION, torch.zeros(2, 3))
    bad, name, _ = one_weight_perturbed(model, FRACTION, torch.ones(2, 3))
    assert name == "1.weight" and not torch.equal(bad(torch.ones(2, 3)), model(torch.ones(2, 3)))
    with pytest.raises(ValueError, match="candidates must be 1 or more"):
        one_weight_perturbed(model, FRACTION, torch.ones(2, 3), candidates=0)
