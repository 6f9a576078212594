"""Training on one CUDA device: each precision, exact resume, checkpoints, the Accelerator.

Skipped without CUDA (CI has none); `scripts/gpu_checks.sh` runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from tests.conftest import quiet_trainer
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.checkpoint import read_checkpoint
from trainer.plugins import AsyncCheckpointIO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def classification(n: int = 256, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=generator)
    labels = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4:8].sum(dim=1) > 0).long()
    return TensorDataset(x, labels)


class Classifier(trainer.TrainModule):
    """An MLP with dropout (so the CUDA generator matters); records what the step saw."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 3)
        )
        self.losses: list[float] = []
        self.seen: dict[str, object] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.seen = {
            "batch_device": x.device.type,
            "param_device": self.net[0].weight.device.type,
            "param_dtype": self.net[0].weight.dtype,
            "logits_dtype": logits.dtype,
        }
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader(shuffle: bool = True) -> DataLoader:
    return DataLoader(classification(), batch_size=32, shuffle=shuffle, pin_memory=True)


EXPECTED = {  # precision -> (parameter dtype, logits dtype) inside training_step
    "32-true": (torch.float32, torch.float32),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-true": (torch.bfloat16, torch.bfloat16),
}


@pytest.mark.parametrize("precision", list(EXPECTED))
def test_fit_on_cuda_trains_in_each_precision(tmp_path, precision):
    torch.manual_seed(0)
    module = Classifier()
    fit = quiet_trainer(tmp_path, accelerator="cuda", devices=1, precision=precision, max_epochs=10)
    fit.fit(module, loader())
    param_dtype, logits_dtype = EXPECTED[precision]
    assert module.seen["batch_device"] == "cuda" and module.seen["param_device"] == "cuda"
    assert module.seen["param_dtype"] == param_dtype
    assert module.seen["logits_dtype"] == logits_dtype
    first, last = sum(module.losses[:8]) / 8, sum(module.losses[-8:]) / 8
    assert last < 0.6 * first, (precision, first, last)


class RecordWeights(Callback):
    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.at[trainer.global_step] = {
            k: v.detach().cpu().clone() for k, v in module.state_dict().items()
        }


def test_resume_on_cuda_is_exact_with_dropout_and_the_cuda_generator(tmp_path):
    torch.manual_seed(0)
    whole = Classifier()
    quiet_trainer(tmp_path / "a", accelerator="cuda", max_epochs=4, seed=7).fit(whole, loader())

    torch.manual_seed(0)
    first = Classifier()
    saver = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=12, save_top_k=-1)
    part = quiet_trainer(
        tmp_path / "b", accelerator="cuda", max_steps=12, seed=7, callbacks=[saver],
        enable_checkpointing=True,
    )  # fmt: skip
    part.fit(first, loader())
    torch.manual_seed(123)  # other weights and another CUDA stream before resuming
    torch.cuda.manual_seed(123)
    resumed = Classifier()
    again = quiet_trainer(tmp_path / "c", accelerator="cuda", max_epochs=4, seed=7)
    again.fit(resumed, loader(), ckpt_path=str(tmp_path / "ck" / "epoch=1-step=12"))
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert whole.losses[12:] == resumed.losses


def test_a_checkpoint_written_on_cuda_reads_on_the_cpu(tmp_path):
    torch.manual_seed(0)
    module = Classifier()
    fit = quiet_trainer(tmp_path, accelerator="cuda", max_steps=5)
    fit.fit(module, loader())
    fit.save_checkpoint(tmp_path / "ck")
    saved = read_checkpoint(tmp_path / "ck")["state_dict"]
    for key, value in module.state_dict().items():
        assert saved[key].device.type == "cpu"
        assert torch.equal(saved[key], value.cpu()), key
    cpu_module = Classifier()
    quiet_trainer(tmp_path / "cpu", accelerator="cpu", max_steps=6).fit(
        cpu_module, loader(), ckpt_path=str(tmp_path / "ck")
    )
    assert next(cpu_module.parameters()).device.type == "cpu"


def test_background_checkpoints_hold_the_weights_of_their_own_step_from_pinned_copies(tmp_path):
    record = RecordWeights()
    saver = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=2, save_top_k=-1)
    io = AsyncCheckpointIO()
    fit = quiet_trainer(
        tmp_path, accelerator="cuda", max_steps=10, callbacks=[record, saver],
        enable_checkpointing=True, plugins=[io],
    )  # fmt: skip
    torch.manual_seed(0)
    fit.fit(Classifier(), loader())
    paths = {int(path.name.rsplit("=", 1)[1]): path for path in (tmp_path / "ck").iterdir()}
    assert sorted(paths) == [2, 4, 6, 8, 10]
    for step, path in paths.items():
        saved = read_checkpoint(path)["state_dict"]
        for key, tensor in record.at[step].items():
            assert torch.equal(saved[key], tensor), (path.name, key)


def test_snapshot_of_cuda_tensors_is_pinned_and_independent_of_later_steps():
    from trainer.plugins.async_snapshot import snapshot_checkpoint

    weight = torch.randn(1024, 1024, device="cuda")
    before = weight.cpu()
    snapshot = snapshot_checkpoint({"state_dict": {"w": weight}})
    copy = snapshot.checkpoint["state_dict"]["w"]
    weight.add_(1.0)  # training goes on after the copy was started
    for event in snapshot.events:
        event.synchronize()
    assert copy.device.type == "cpu" and copy.is_pinned()
    assert torch.equal(copy, before)


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
def test_accelerator_prepares_for_cuda_and_save_state_resumes_exactly(tmp_path, mixed_precision):
    torch.manual_seed(0)
    accelerator = trainer.Accelerator(mixed_precision=mixed_precision)
    net = Classifier().net
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, optimizer, data = accelerator.prepare(net, optimizer, loader())
    expected = torch.bfloat16 if mixed_precision == "bf16" else torch.float16

    def epoch() -> list[float]:
        losses = []
        for x, y in data:
            assert x.is_cuda and y.is_cuda
            logits = net(x)
            assert logits.dtype == expected
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    epoch()
    accelerator.save_state(str(tmp_path / "state"))
    after = epoch()
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    accelerator.load_state(str(tmp_path / "state"))
    assert epoch() == after
    for key, value in net.state_dict().items():
        assert torch.equal(value, weights[key]), key
    gathered = accelerator.gather_for_metrics(torch.arange(4, device="cuda"))
    assert gathered.is_cuda and gathered.tolist() == [0, 1, 2, 3]


def test_find_executable_batch_size_recovers_from_a_real_cuda_out_of_memory():
    from trainer.accelerator.memory import find_executable_batch_size

    free, _ = torch.cuda.mem_get_info()
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def allocate(batch_size: int) -> int:
        tried.append(batch_size)
        block = torch.empty(batch_size * (free // 6), dtype=torch.uint8, device="cuda")
        del block
        return batch_size

    assert allocate() == 4  # 64, 32, 16 and 8 times free/6 bytes do not fit; 4 does
    assert tried == [64, 32, 16, 8, 4]


def test_compile_on_cuda_trains_like_eager(tmp_path):
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        module = Classifier()
        module.net[2].p = 0.0  # no dropout: the two runs see the same numbers
        fit = quiet_trainer(
            tmp_path / str(compiled), accelerator="cuda", max_steps=16, compile=compiled
        )
        fit.fit(module, loader(shuffle=False))
        runs[compiled] = module.losses
    assert len(runs[True]) == len(runs[False]) == 16
    for eager, compiled in zip(runs[False], runs[True], strict=True):
        assert abs(eager - compiled) < 1e-3 * max(1.0, abs(eager))


def test_prepare_moves_optimizer_state_loaded_before_prepare_to_the_device():
    """An optimizer stepped (or loaded) on CPU before prepare: its state follows the parameters
    to CUDA, so the first step does not fail on a device mismatch (as in Accelerate)."""
    net = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    accelerator = trainer.Accelerator()
    net, optimizer = accelerator.prepare(net, optimizer)
    assert optimizer.optimizer.state[net.weight]["exp_avg"].is_cuda
    accelerator.backward(net(torch.ones(3, 4, device="cuda")).sum())
    optimizer.step()
