import numpy as np
import pytest
import torch

from trainyard.export.onnx_export import DEFAULT_RTOL, ParityError, check_parity, export, onnx_predict
from trainyard.training.model import SmallCNN


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = SmallCNN(10, 8, 8).eval()
    path = export(model, torch.rand(2, 1, 8, 8), tmp_path_factory.mktemp("onnx") / "m.onnx")
    return model, path


def test_export_matches_and_has_dynamic_batch(exported):
    model, path = exported
    x = torch.rand(37, 1, 8, 8)
    parity = check_parity(model(x).detach().numpy(), onnx_predict(path, x.numpy()))
    assert parity.passed and parity.mismatched == 0 and parity.total == 370


def test_parity_catches_a_broken_export(exported, tmp_path):
    import onnx
    from onnx import numpy_helper

    model, path = exported
    broken = onnx.load(str(path))
    # Perturb the last layer's bias by 1e-2: small, but far beyond rtol=1e-3/atol=1e-5.
    init = max(broken.graph.initializer, key=lambda t: len(t.dims) == 1 and t.dims[0] == 10)
    arr = numpy_helper.to_array(init).copy()
    arr[3] += 1e-2
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    bad_path = tmp_path / "bad.onnx"
    onnx.save(broken, str(bad_path))
    x = torch.rand(16, 1, 8, 8)
    parity = check_parity(model(x).detach().numpy(), onnx_predict(bad_path, x.numpy()))
    assert not parity.passed
    assert parity.mismatched == 16  # class 3's logit, for every sample
    assert parity.max_abs_diff == pytest.approx(1e-2, rel=1e-3)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ParityError, match="shape"):
        check_parity(np.zeros((2, 3)), np.zeros((2, 4)))


def _logits(scale=20.0, shape=(32, 8), seed=0):
    rng = np.random.default_rng(seed)
    out = rng.normal(size=shape)
    return (out / np.abs(out).max() * scale).astype(np.float32)


def test_fp32_noise_near_zero_in_a_large_output_passes():
    """The AVX-512 case: one logit near 0 in a tensor whose values reach ~20 off by 2.96e-05 (1.5e-6 of
    the scale). numpy.isclose(rtol=1e-3, atol=1e-5) rejected it; the scaled gate does not."""
    expected = _logits()
    expected[3, 4] = 1e-3
    actual = expected.copy()
    actual[3, 4] += 2.96e-05
    assert not np.isclose(actual, expected, rtol=1e-3, atol=1e-5).all()
    parity = check_parity(expected, actual)
    assert parity.passed and parity.max_scaled_diff == pytest.approx(2.96e-05 / 20.0, rel=1e-3)


def test_the_same_error_fails_on_an_output_of_small_scale_and_is_named():
    """The bound follows each output's own scale: 2.96e-05 is noise for logits of 20, an error for
    offsets of 0.5. Only the differing output is named."""
    logits, offset = _logits(20.0), _logits(0.5, (32, 2), seed=1)
    off = offset.copy()
    off[0, 1] += 2.96e-05
    parity = check_parity([logits, offset], [logits + 2.96e-05, off], names=["logits", "offset"])
    assert not parity.passed and parity.failed == ["offset"]
    assert parity.outputs["logits"].passed and parity.outputs["offset"].mismatched == 1
    line = parity.problem("ONNX")
    assert "offset (1/64 values" in line and "logits" not in line
    assert parity.to_dict()["outputs"]["offset"]["passed"] is False


def test_defaults_are_the_export_specs():
    from trainyard.spec import ExportSpec

    parity = check_parity(np.ones(3), np.ones(3))
    assert (parity.rtol, parity.atol) == (DEFAULT_RTOL, ExportSpec().atol)


@pytest.mark.parametrize(
    "name, expected, actual, passed",
    [
        ("nan output", np.ones(4), np.array([1.0, np.nan, 1.0, 1.0]), False),
        ("nan reference", np.array([1.0, np.nan]), np.array([1.0, 1.0]), False),
        ("inf output", np.ones(4), np.array([1.0, np.inf, 1.0, 1.0]), False),
        ("all-zero output, exact", np.zeros(4), np.zeros(4), True),
        ("all-zero output, within atol", np.zeros(4), np.full(4, 5e-8), True),
        ("all-zero output, beyond atol", np.zeros(4), np.full(4, 1e-6), False),
    ],
)
def test_edge_cases(name, expected, actual, passed):
    assert check_parity(expected, actual, names=["out"]).passed is passed, name


def test_output_count_mismatch_is_an_error():
    with pytest.raises(ParityError, match="2 outputs to compare with 1"):
        check_parity([np.zeros(2)], [np.zeros(2), np.zeros(2)])
