"""Each recipe's ONNX export: parity and metric re-check pass for a faithful export and catch a broken one."""

import copy

import numpy as np
import pytest
import torch

from datafiles import write_files
from trainyard import recipes
from trainyard.data import photos, shapes, synthetic_text
from trainyard.data.prepare import prepare_records
from trainyard.export import onnx_export
from trainyard.export.onnx_export import ExportFailed
from trainyard.spec import ExportSpec, parse_spec
from trainyard.training.run_config import RunConfig

EXPORT = ExportSpec(rtol=1e-3, atol=1e-5, metric_tolerance=0.0, torchscript=True)
CASES = {
    "centernet_detector": (lambda: shapes.generate(24, seed=2), {"width": 8}),
    "transformer_translator": (
        lambda: synthetic_text.generate(60, seed=2),
        {"d_model": 16, "nhead": 2, "layers": 1, "ff": 32},
    ),
    # in TFRecord: its records are encoded image files (image/encoded), the other recipes' are arrays
    "resnet_classifier": (
        lambda: photos.photo_files(per_class=6, seed=2),
        {"depth": 10, "width": 8, "image_size": 32},
        "tfrecord",
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(recipe, options, prepared data, model.pt of an untrained model) for each recipe."""
    name = request.param
    make, given, *fmt = CASES[name]
    recipe = recipes.get(name)
    spec = parse_spec({"recipe": name, "recipe_options": given})
    options = recipe.opts(spec)
    root = write_files(tmp_path_factory.mktemp(name), make())
    data = prepare_records(
        lambda: recipe.samples(root, options),
        "c" * 64,
        root / "prepared",
        0.3,
        0,
        fmt=fmt[0] if fmt else "lmdb",
        variant=recipe.variant(options),
    )
    torch.manual_seed(0)
    _, _, meta = recipe.load(RunConfig(spec=spec, data=data, out_dir=str(root)))  # what a worker gets
    model = recipe.build_model(meta, options)
    path = root / "model.pt"
    torch.save(recipe.model_blob(model, meta), path)
    return recipe, options, data, path


def test_faithful_export_passes_with_torchscript(case, tmp_path):
    recipe, options, data, model_path = case
    out = recipe.export(str(model_path), data, tmp_path, EXPORT, options)
    assert out["parity"]["passed"] and out["parity"]["mismatched"] == 0
    metric = out["metric"]
    assert out[f"{metric}_torch"] == out[f"{metric}_onnx"]
    assert out["torchscript_parity"]["passed"] and (tmp_path / "model.torchscript.pt").is_file()
    example = np.load(out["input_example"])
    assert all(example[k].shape[0] == 1 for k in example.files)
    # the ONNX model's metrics, as champion/challenger computes them from a registered version's files
    # (model.onnx + pytorch/model.pt), equal the export check's
    (tmp_path / "pytorch").mkdir()
    (tmp_path / "pytorch" / "model.pt").write_bytes(model_path.read_bytes())
    assert recipe.onnx_metrics(out["onnx_path"], data, options)[metric] == out[f"{metric}_onnx"]
    # as export_onnx hands it on: the record, its metric under fixed names, a recipe's own figures beside it
    from trainyard.pipeline.publish import exported_model

    record = exported_model(out)
    assert (record.metric, record.metric_torch, record.metric_onnx) == (
        metric,
        out[f"{metric}_torch"],
        out[f"{metric}_onnx"],
    )
    assert (record.onnx_path, record.torchscript_path, record.parity) == (
        out["onnx_path"],
        out["torchscript_path"],
        out["parity"],
    )
    assert record.artifacts == out.get("artifacts", {}) and set(record.artifacts) == (
        {"tokenizer"} if "artifacts" in out else set()
    )
    assert record.details == {k: out[k] for k in ("decode_mismatches", "decoded_sentences") if k in out}


def test_broken_export_is_rejected(case, tmp_path, monkeypatch):
    """An exporter that writes slightly different weights (a stand-in for a mis-converted op)."""
    recipe, options, data, model_path = case
    real = onnx_export.export

    def broken(model, example, path, **kwargs):
        bad = copy.deepcopy(model)
        with torch.no_grad():
            for p in bad.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return real(bad, example, path, **kwargs)

    monkeypatch.setattr(onnx_export, "export", broken)
    with pytest.raises(ExportFailed, match="ONNX outputs differ beyond rtol=0.001"):
        recipe.export(str(model_path), data, tmp_path, EXPORT, options)


def test_a_model_file_that_names_no_recipe_is_refused_not_guessed(tmp_path):
    """Weights without their recipe are not read as digits_cnn's: the error names the file and the format."""
    from trainyard.errors import PermanentError

    path = tmp_path / "model.pt"
    torch.save({"config": {}, "state_dict": torch.nn.Linear(2, 2).state_dict()}, path)
    with pytest.raises(PermanentError, match="names no 'recipe'"):
        recipes.load_model(path)
