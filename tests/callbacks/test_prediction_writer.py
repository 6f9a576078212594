"""Tests of trainer/callbacks/prediction_writer.py: real subclasses write predict outputs to
files per batch, per epoch, or both; batch indices; argument checks."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import BasePredictionWriter
from trainer.callbacks.prediction_writer import _batch_size
from trainer.errors import ConfigurationError


class FileWriter(BasePredictionWriter):
    """Writes each batch to batch-<idx>.pt and the epoch to epoch.pt under ``output_dir``."""

    def __init__(self, output_dir, write_interval):
        super().__init__(write_interval)
        self.output_dir = output_dir

    def write_on_batch_end(
        self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        torch.save(
            {"prediction": prediction, "indices": batch_indices, "loader": dataloader_idx},
            self.output_dir / f"batch-{batch_idx}.pt",
        )

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        torch.save(
            {"predictions": torch.cat(predictions), "indices": batch_indices},
            self.output_dir / f"epoch-rank{trainer.global_rank}.pt",
        )


def predict(tmp_path, writer):
    module = LinearModule()
    run = quiet_trainer(tmp_path, callbacks=[writer])
    returned = run.predict(module, make_loader(10, 4))  # batches of 4, 4, 2
    return torch.cat(returned)


def test_batch_interval_writes_a_file_per_batch(tmp_path):
    expected = predict(tmp_path, FileWriter(tmp_path, "batch"))
    files = [torch.load(tmp_path / f"batch-{i}.pt") for i in range(3)]
    assert [f["indices"] for f in files] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [f["loader"] for f in files] == [0, 0, 0]
    torch.testing.assert_close(torch.cat([f["prediction"] for f in files]), expected)
    assert not (tmp_path / "epoch-rank0.pt").exists()


def test_epoch_interval_writes_once_with_every_prediction(tmp_path):
    expected = predict(tmp_path, FileWriter(tmp_path, "epoch"))
    written = torch.load(tmp_path / "epoch-rank0.pt")
    torch.testing.assert_close(written["predictions"], expected)
    assert written["indices"] == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]
    assert not (tmp_path / "batch-0.pt").exists()


def test_batch_and_epoch_interval_writes_both_and_repeats_cleanly(tmp_path):
    writer = FileWriter(tmp_path, "batch_and_epoch")
    predict(tmp_path, writer)
    expected = predict(tmp_path, writer)  # a second predict starts from index 0 again
    assert torch.load(tmp_path / "batch-2.pt")["indices"] == [8, 9]
    written = torch.load(tmp_path / "epoch-rank0.pt")
    assert written["predictions"].shape == expected.shape == (10, 1)


def test_missing_write_method_is_refused_at_construction():
    class OnlyBatches(BasePredictionWriter):
        def write_on_batch_end(self, *args):
            pass

    OnlyBatches("batch")
    with pytest.raises(
        ConfigurationError, match=r"OnlyBatches\(write_interval='epoch'\).*write_on_epoch_end"
    ):
        OnlyBatches("epoch")


def test_bad_write_interval():
    with pytest.raises(ConfigurationError, match=r"write_interval='step'.*'batch', 'epoch'"):
        FileWriter(None, "step")


def test_batch_size_of_common_batches():
    assert _batch_size(torch.zeros(5, 3)) == 5
    assert _batch_size((torch.zeros(6, 2), torch.zeros(6))) == 6
    assert _batch_size({"input_ids": torch.zeros(3, 7), "mask": torch.zeros(3, 7)}) == 3
    assert _batch_size(["a", "b"]) == 2


def test_batch_indices_are_the_dataset_indices_of_a_shuffled_loader(tmp_path):
    """Lightning's batch_indices are what the sampler drew; ours were positions (0, 1, ...),
    so a shuffled loader's predictions could not be put back in the dataset's order."""
    from torch.utils.data import DataLoader

    class Echo(LinearModule):
        def predict_step(self, batch, batch_idx):
            return batch.flatten().long()

    class Recording(BasePredictionWriter):
        def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
            self.written = (predictions, batch_indices)

    writer = Recording("epoch")
    data = torch.arange(10.0).unsqueeze(1)
    run = quiet_trainer(tmp_path, callbacks=[writer])
    run.predict(Echo(), DataLoader(data, batch_size=4, shuffle=True))
    predictions, (indices,) = writer.written
    assert [p.tolist() for p in predictions] == indices  # each sample's own index
    assert sorted(i for batch in indices for i in batch) == list(range(10))
    assert indices != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # shuffled
    assert run.predict_batch_indices == indices[-1]


def test_an_index_sampler_without_a_length_still_predicts_with_its_indices(tmp_path):
    """A batch sampler with no __len__ (a stream of index batches): the recording of each
    batch's indices must not ask for its length (it did, and predict raised TypeError)."""
    from torch.utils.data import DataLoader

    class Batches:
        def __iter__(self):
            return iter([[0, 1], [4], [2, 3]])

    class Echo(LinearModule):
        def predict_step(self, batch, batch_idx):
            return batch.flatten().long()

    class Recording(BasePredictionWriter):
        def write_on_batch_end(self, trainer, module, prediction, batch_indices, *args):
            self.seen.append((prediction.tolist(), list(batch_indices)))

    writer = Recording("batch")
    writer.seen = []
    data = torch.arange(5.0).unsqueeze(1)
    run = quiet_trainer(tmp_path, callbacks=[writer])
    run.predict(Echo(), DataLoader(data, batch_sampler=Batches()), return_predictions=False)
    assert writer.seen == [([0, 1], [0, 1]), ([4], [4]), ([2, 3], [2, 3])]
