import numpy as np
import pytest
import torch

from trainyard.export.onnx_export import ParityError, check_parity, export, onnx_predict
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
    init = max(broken.graph.initializer, key=lambda t: (len(t.dims) == 1 and t.dims[0] == 10))
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
