"""Tests of trainer/trainer/module_export.py: to_onnx and to_torchscript, read back for real
(torch.jit.load; onnx.load, its checker and its reference evaluator)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

import trainer
from tests.conftest import make_loader, quiet_trainer
from trainer.errors import CheckpointError, ConfigurationError, MissingDependencyError
from trainer.trainer.module_export import save_files_atomically

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


class Net(trainer.TrainModule):
    """BatchNorm and dropout: an export in train mode would not compute what eval does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.BatchNorm1d(8),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(8, 1),
        )
        self.automatic_optimization = True  # an instance attribute TorchScript must type
        self.save_hyperparameters()
        with torch.no_grad():
            self.net[1].running_mean.fill_(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _eval_output(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    was_training = module.training
    module.eval()
    with torch.no_grad():
        out = module(x)
    module.train(was_training)
    return out


def _no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_saves_what_eval_computes_and_keeps_the_mode(tmp_path, method):
    module = Net()
    module.example_input_array = torch.randn(3, 4)
    path = tmp_path / "net.pt"
    compiled = module.to_torchscript(path, method=method)
    assert module.training  # put back
    x = torch.randn(5, 4)
    expected = _eval_output(module, x)
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(torch.jit.load(str(path))(x), expected)
    assert _no_temporaries(tmp_path)
    buffer = io.BytesIO()
    module.to_torchscript(buffer, method=method)
    torch.testing.assert_close(torch.jit.load(io.BytesIO(buffer.getvalue()))(x), expected)


def test_to_torchscript_after_fit_and_its_refusals(tmp_path):
    module = Net()
    quiet_trainer(tmp_path, max_epochs=1).fit(module, make_loader())
    x = torch.randn(2, 4)
    with pytest.warns(DeprecationWarning, match="TorchScript is deprecated"):
        compiled = module.to_torchscript()  # attached to its Trainer: not compiled
    torch.testing.assert_close(compiled(x), _eval_output(module, x))
    with pytest.raises(ConfigurationError, match=r"method='onnx'.*\['script', 'trace'\]"):
        module.to_torchscript(method="onnx")
    with pytest.raises(ConfigurationError, match="example_inputs=.*example_input_array"):
        Net().to_torchscript(method="trace")


def test_to_onnx_writes_a_model_that_computes_what_eval_computes(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from onnx.reference import ReferenceEvaluator

    module = Net()
    module.example_input_array = torch.randn(3, 4)
    path = tmp_path / "net.onnx"
    program = module.to_onnx(path)
    assert program is not None and module.training
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    x = torch.randn(3, 4)
    (out,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), _eval_output(module, x))
    assert _no_temporaries(tmp_path)

    legacy = io.BytesIO()  # the TorchScript-based exporter, into a file object
    assert module.to_onnx(legacy, input_sample=torch.randn(3, 4), dynamo=False) is None
    model = onnx.load_model_from_string(legacy.getvalue())
    (out,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), _eval_output(module, x))


def test_to_onnx_refusals(monkeypatch):
    with pytest.raises(ConfigurationError, match=r"Net.to_onnx\(\) needs an input"):
        Net().to_onnx(io.BytesIO(), dynamo=False)
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed: import fails
    with pytest.raises(MissingDependencyError, match=r"Net.to_onnx\(\).*trainer\[onnx\]"):
        Net().to_onnx(io.BytesIO(), input_sample=torch.randn(3, 4))


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"previous")

    def half_written(target: Path) -> None:
        target.write_bytes(b"half")
        (target.parent / "model.onnx.data").write_bytes(b"data")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match="writing .*model.onnx failed"):
        save_files_atomically(path, half_written)
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
