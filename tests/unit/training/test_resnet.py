"""The ResNet the resnet_classifier recipe trains: torchvision's architecture and parameter names (so its
checkpoints load), initial weights, and the image batches it reads."""

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from trainyard.data.records import RecordBatch
from trainyard.training.resnet import ResNet, decode, image_batch, load_initial_weights


@pytest.mark.parametrize(
    ("depth", "parameters"),
    [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)],  # torchvision's resnet18/34/50, 1000 classes
)
def test_the_architecture_is_the_papers(depth, parameters):
    model = ResNet(1000, depth=depth, width=64)
    assert sum(p.numel() for p in model.parameters()) == parameters
    keys = set(model.state_dict())
    assert {
        "conv1.weight",
        "bn1.running_mean",
        "layer2.0.downsample.0.weight",
        "layer4.1.bn2.bias",
        "fc.weight",
    } <= keys
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 1000)


def _save(obj, path):
    torch.save(obj, path)
    return path


def test_initial_weights_load_the_body_and_reinitialise_a_classifier_of_another_size(tmp_path):
    torch.manual_seed(0)
    source = ResNet(1000, depth=18, width=64)
    path = _save({f"module.{k}": v for k, v in source.state_dict().items()}, tmp_path / "resnet18.pth")
    target = ResNet(4, depth=18, width=64)
    fc_before = target.fc.weight.clone()
    message = load_initial_weights(target, path)
    assert "classifier re-initialised for 4 classes" in message
    assert torch.equal(target.layer3[1].conv2.weight, source.layer3[1].conv2.weight)
    assert torch.equal(target.bn1.running_var, source.bn1.running_var)
    assert torch.equal(target.fc.weight, fc_before)

    same = ResNet(1000, depth=18, width=64)
    assert "classifier too" in load_initial_weights(same, _save({"state_dict": source.state_dict()}, tmp_path / "w.pt"))
    assert torch.equal(same.fc.weight, source.fc.weight)


def test_initial_weights_of_another_depth_or_kind_are_refused(tmp_path):
    path = _save(ResNet(10, depth=18, width=64).state_dict(), tmp_path / "r18.pth")
    with pytest.raises(ValueError, match=r"r18\.pth does not fit a ResNet-34 of width 64: \d+ tensors differ"):
        load_initial_weights(ResNet(10, depth=34, width=64), path)
    with pytest.raises(ValueError, match="not a state dict"):
        load_initial_weights(ResNet(10, depth=10, width=8), _save([1, 2], tmp_path / "list.pt"))


class _Exploit:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_checkpoint_cannot_run_code(tmp_path):
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"conv1.weight": _Exploit()}))
    with pytest.raises(pickle.UnpicklingError):
        load_initial_weights(ResNet(10, depth=10, width=8), path)


def _encoded(mode: str, size=(40, 30), fmt="PNG") -> np.ndarray:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    rgb.convert(mode).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


@pytest.mark.parametrize(
    ("mode", "fmt"), [("RGB", "JPEG"), ("L", "PNG"), ("P", "PNG"), ("RGBA", "PNG"), ("RGB", "BMP")]
)
def test_any_image_decodes_to_rgb_of_the_size(mode, fmt):
    data = _encoded(mode, fmt=fmt)
    assert decode(data, 32, train=False).shape == (32, 32, 3)
    assert decode(data, 32, train=True, generator=torch.Generator().manual_seed(1)).shape == (32, 32, 3)


def test_evaluation_crops_are_fixed_training_crops_follow_the_seed():
    data = _encoded("RGB", size=(90, 50))
    assert np.array_equal(decode(data, 24, train=False), decode(data, 24, train=False))
    a = decode(data, 24, train=True, generator=torch.Generator().manual_seed(3))
    b = decode(data, 24, train=True, generator=torch.Generator().manual_seed(3))
    c = decode(data, 24, train=True, generator=torch.Generator().manual_seed(4))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_image_batch_normalises_and_keeps_labels():
    files = [_encoded("RGB"), _encoded("L", size=(64, 64))]
    batch = RecordBatch(keys=["a", "b"], labels=np.array([3, 1]), arrays=files, targets=[None, None])
    x, y = image_batch(batch, size=16, train=False)
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32 and y.tolist() == [3, 1]
    assert -3 < float(x.min()) < 0 < float(x.max()) < 3  # ImageNet mean/std, not [0, 255]


def test_torchvision_files_without_batchnorm_counters_load(tmp_path):
    source = ResNet(10, depth=18, width=64)
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert "initial weights" in load_initial_weights(ResNet(10, depth=18, width=64), _save(state, tmp_path / "old.pth"))


def test_top5_counts_a_label_among_the_five_highest_scores():
    from trainyard.evaluation.classification import classification_metrics

    logits = np.tile(np.arange(8, dtype=np.float32), (3, 1))  # class 7 highest, then 6, 5, 4, 3
    labels = np.array([7, 3, 2])  # top-1 hit, top-5 hit, top-5 miss
    m = classification_metrics(logits, labels, top5=True)
    assert m["val_accuracy"] == pytest.approx(1 / 3) and m["val_top5_accuracy"] == pytest.approx(2 / 3)


def test_init_weights_is_a_name_checked_by_validate_spec_not_by_every_parse(tmp_path, monkeypatch):
    from trainyard import recipes
    from trainyard.spec import SpecError, parse_spec

    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    recipe = recipes.get("resnet_classifier")
    assert "not a path" in recipe.option_problems({"init_weights": "../keys/signing_key.pem"})[0]
    missing = recipe.option_problems({"init_weights": "resnet18.pth"})
    assert missing and "no file 'resnet18.pth' in" in missing[0]
    spec = parse_spec(
        {
            "recipe": "resnet_classifier",
            "dataset": {"source": "synthetic_photos"},
            "recipe_options": {"init_weights": "r.pth"},
        }
    )
    assert recipe.opts(spec).init_weights == "r.pth"  # later steps parse; the file may be gone by then
    with pytest.raises(SpecError, match="not a path"):
        recipe.opts(parse_spec({"recipe": "resnet_classifier", "recipe_options": {"init_weights": "a/b.pth"}}))
