"""TrainModule: self.log semantics, torchmetrics values, save_hyperparameters, context properties."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

import trainer
import trainer.callbacks
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.loggers import Logger


class MemoryLogger(Logger):
    """A real Logger subclass that keeps what it receives (for reading back in tests)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.hparams: dict = {}
        self.status = None

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        self.hparams.update(params)

    def finalize(self, status):
        self.status = status


def _data(values: list[float], batch_size: int) -> DataLoader:
    x = torch.tensor(values).unsqueeze(1)
    return DataLoader(TensorDataset(x, x), batch_size=batch_size)


class ValueLogger(LinearModule):
    """Logs the batch's mean input value, so epoch aggregates are known exactly."""

    def __init__(self, **log_kwargs) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
        self.log_kwargs = log_kwargs

    def training_step(self, batch, batch_idx):
        self.log("train/value", batch[0].mean(), **self.log_kwargs)
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/value", batch[0].mean(), **self.log_kwargs)


def test_validation_epoch_value_is_the_batch_size_weighted_mean(tmp_path):
    values = [
        1.0,
        2.0,
        3.0,
        4.0,
        10.0,
    ]  # batches [1,2], [3,4], [10]: unweighted mean of means = 5.0
    t = quiet_trainer(tmp_path)
    result = t.validate(ValueLogger(), _data(values, 2))
    assert result == [{"val/value": pytest.approx(4.0)}]  # the dataset mean


def test_explicit_batch_size_overrides_inference(tmp_path):
    class Weighted(ValueLogger):
        def validation_step(self, batch, batch_idx):
            self.log("val/value", batch[0].mean(), batch_size=1)  # equal weights per batch

    assert quiet_trainer(tmp_path).validate(Weighted(), _data([1.0, 2.0, 3.0, 4.0, 10.0], 2)) == [
        {"val/value": pytest.approx(5.0)}
    ]


@pytest.mark.parametrize(
    ("reduce_fx", "expected"), [("sum", 15.0), ("max", 10.0), ("min", 1.5), (torch.max, 10.0)]
)
def test_reduce_fx(tmp_path, reduce_fx, expected):
    t = quiet_trainer(tmp_path)
    result = t.validate(ValueLogger(reduce_fx=reduce_fx), _data([1.0, 2.0, 3.0, 4.0, 10.0], 2))
    assert result[0]["val/value"] == pytest.approx(expected)


def test_training_defaults_are_on_step_and_both_give_suffixes(tmp_path):
    memory = MemoryLogger()
    t = quiet_trainer(tmp_path, max_epochs=1, logger=memory, log_every_n_steps=1)
    t.fit(ValueLogger(on_step=True, on_epoch=True), _data([1.0, 2.0, 3.0, 4.0], 2))
    step_rows = [metrics for _, metrics in memory.rows if "train/value_step" in metrics]
    epoch_rows = [metrics for _, metrics in memory.rows if "train/value_epoch" in metrics]
    assert [r["train/value_step"] for r in step_rows] == [1.5, 3.5]
    assert [r["train/value_epoch"] for r in epoch_rows] == [2.5]
    metrics = t.callback_metrics
    assert metrics["train/value"].item() == 2.5  # the plain name holds the epoch value at the end
    assert metrics["train/value_step"].item() == 3.5 and metrics["train/value_epoch"].item() == 2.5
    # Lightning's steps: each row at the optimizer steps done before its batch's; the epoch row
    # at the step of the epoch's last batch.
    assert [step for step, _ in memory.rows] == [0, 1, 1] and memory.status == "success"


def test_log_every_n_steps_and_epoch_column(tmp_path):
    memory = MemoryLogger()
    quiet_trainer(tmp_path, max_epochs=2, logger=memory, log_every_n_steps=3).fit(
        ValueLogger(), _data([float(i) for i in range(8)], 2)
    )
    assert [step for step, _ in memory.rows] == [2, 5]  # after optimizer steps 3 and 6
    assert [row["epoch"] for _, row in memory.rows] == [0.0, 1.0]


def test_logging_in_epoch_end_hooks_defaults_to_on_epoch(tmp_path):
    class EpochEnd(ValueLogger):
        def on_train_epoch_end(self):
            self.log("epoch_marker", float(self.current_epoch))

        def on_validation_epoch_end(self):
            self.log("val_marker", 7.0)

    memory = MemoryLogger()
    t = quiet_trainer(tmp_path, max_epochs=2, logger=memory)
    t.fit(EpochEnd(), _data([1.0, 2.0], 1), _data([1.0], 1))
    markers = [row["epoch_marker"] for _, row in memory.rows if "epoch_marker" in row]
    assert markers == [0.0, 1.0]
    assert t.callback_metrics["val_marker"].item() == 7.0


def test_torchmetrics_metric_is_computed_at_epoch_end_and_reset(tmp_path):
    class WithMetric(LinearModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(1, 1)
            self.total = torchmetrics.SumMetric()

        def validation_step(self, batch, batch_idx):
            self.total.update(batch[0].sum())
            self.log("val/total", self.total)

    module = WithMetric()
    t = quiet_trainer(tmp_path)
    assert t.validate(module, _data([1.0, 2.0, 3.0], 2)) == [{"val/total": 6.0}]
    assert t.validate(module, _data([1.0, 2.0, 3.0], 2)) == [{"val/total": 6.0}]  # reset in between


def test_torchmetrics_accuracy_logged_on_step_uses_the_forward_value(tmp_path):
    class Acc(LinearModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(1, 1)
            self.acc = torchmetrics.Accuracy(task="binary")

        def training_step(self, batch, batch_idx):
            x = batch[0]
            self.acc(torch.ones(len(x)), torch.tensor([1, 0][: len(x)]))
            self.log("train/acc", self.acc, on_step=True, on_epoch=True)
            return self.net(x).pow(2).mean()

    t = quiet_trainer(tmp_path, max_epochs=1)
    t.fit(Acc(), _data([1.0, 2.0, 3.0, 4.0], 2))
    assert t.callback_metrics["train/acc_step"].item() == 0.5
    assert t.callback_metrics["train/acc_epoch"].item() == 0.5


def test_logging_does_not_read_tensors_between_logger_writes(tmp_path, monkeypatch):
    """self.log every step, logger every 50 steps: no .item()/float() per step (DESIGN §2)."""
    reads = []
    counting = {"on": False}
    original_item = torch.Tensor.item
    original_float = torch.Tensor.__float__

    def _is_ours() -> bool:  # the DataLoader draws its own seed with .item() once per epoch
        caller = sys._getframe(2).f_code.co_filename
        return (
            counting["on"]
            and f"{os.sep}trainer{os.sep}" in caller
            and f"{os.sep}tests{os.sep}" not in caller
        )

    def counting_item(self):
        if _is_ours():
            reads.append("item")
        return original_item(self)

    def counting_float(self):
        if _is_ours():
            reads.append("float")
        return original_float(self)

    class Window(trainer.callbacks.Callback):  # count inside the training loop only
        def on_train_start(self, trainer, module):
            counting["on"] = True

        def on_train_end(self, trainer, module):
            counting["on"] = False

    memory = MemoryLogger()
    t = quiet_trainer(
        tmp_path, max_epochs=1, logger=memory, log_every_n_steps=50, callbacks=[Window()]
    )
    module = ValueLogger(prog_bar=True)
    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    monkeypatch.setattr(torch.Tensor, "__float__", counting_float)
    t.fit(module, _data([float(i) for i in range(200)], 2))  # 100 steps
    monkeypatch.undo()
    assert len([step for step, _ in memory.rows]) == 2
    assert len(reads) == 2  # one read per logger write of train/value, none per step


def test_log_dict_and_logger_false_and_prog_bar(tmp_path):
    class Dict(LinearModule):
        def validation_step(self, batch, batch_idx):
            self.log_dict({"a": 1.0, "b": 2.0}, prog_bar=True)
            self.log("hidden", 3.0, logger=False)

    memory = MemoryLogger()
    t = quiet_trainer(tmp_path, max_epochs=1, logger=memory)
    t.fit(Dict(), make_loader(n=8), make_loader(n=8))
    val_rows = [row for _, row in memory.rows if "a" in row]
    assert val_rows and "hidden" not in val_rows[0]
    assert t.callback_metrics["hidden"].item() == 3.0
    assert {"a", "b"} <= set(t.progress_bar_metrics)


def test_same_key_twice_in_one_hook_with_the_same_options_accumulates(tmp_path):
    class Twice(ValueLogger):
        def validation_step(self, batch, batch_idx):
            self.log("val/value", batch[0].mean())
            self.log("val/value", batch[0].mean() + 1.0, on_epoch=True)  # same options resolved

    result = quiet_trainer(tmp_path).validate(Twice(), _data([1.0, 2.0, 3.0, 4.0, 10.0], 2))
    assert result == [{"val/value": pytest.approx(4.5)}]  # both values in the weighted mean


def test_same_key_twice_in_one_hook_with_another_prog_bar_names_the_fix(tmp_path):
    class Twice(ValueLogger):
        def validation_step(self, batch, batch_idx):
            self.log("val/value", batch[0].mean(), prog_bar=True)
            self.log("val/value", batch[0].mean(), reduce_fx=torch.mean)  # same reduce_fx

    with pytest.raises(trainer.ConfigurationError) as caught:
        quiet_trainer(tmp_path).validate(Twice(), _data([1.0, 2.0], 2))
    message = str(caught.value)
    assert "self.log('val/value', ...)" in message and "validation_step" in message, message
    assert "prog_bar=True then prog_bar=False" in message and "reduce_fx" not in message, message
    assert "pass the same options" in message and "under another name" in message, message


@pytest.mark.parametrize("hook", ["on_train_epoch_end", "on_validation_epoch_end"])
def test_a_conflict_in_an_epoch_end_hook_names_that_hook(tmp_path, hook):
    def log_twice(self):
        self.log("marker", 1.0)
        self.log("marker", 2.0, prog_bar=True)

    module_class = type("Twice", (ValueLogger,), {hook: log_twice})
    with pytest.raises(trainer.ConfigurationError) as caught:
        quiet_trainer(tmp_path, max_epochs=1).fit(
            module_class(), _data([1.0, 2.0], 1), _data([1.0], 1)
        )
    message = str(caught.value)
    assert f"twice in {hook} with different options" in message, message
    assert "training_step" not in message and "validation_step" not in message, message


def test_save_hyperparameters_all_named_and_ignored():
    class Net(trainer.TrainModule):
        def __init__(self, lr: float = 0.1, hidden: int = 32, encoder=None, **extra):
            super().__init__()
            self.save_hyperparameters(ignore="encoder")

    hp = Net(lr=0.01, depth=3).hparams
    assert dict(hp) == {"lr": 0.01, "hidden": 32, "depth": 3} and hp.lr == 0.01

    class Some(trainer.TrainModule):
        def __init__(self, lr: float = 0.1, hidden: int = 32):
            super().__init__()
            self.save_hyperparameters("lr")

    assert dict(Some().hparams) == {"lr": 0.1}

    class Wrong(trainer.TrainModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters("lrr")

    with pytest.raises(
        trainer.ConfigurationError, match=r"\['lrr'\] are not arguments of Wrong.__init__"
    ):
        Wrong()
    with pytest.raises(AttributeError, match="no hyperparameter 'nope'"):
        _ = hp.nope


def test_save_hyperparameters_refuses_a_value_that_is_not_a_mapping():
    class Scalar(trainer.TrainModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters(0.5)

    with pytest.raises(trainer.ConfigurationError, match=r"Scalar.save_hyperparameters\(.*float"):
        Scalar()


def test_save_hyperparameters_chain_config_and_merges():
    class Base(trainer.TrainModule):
        def __init__(self, lr: float = 0.1, *layers: int):
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, width: int = 3, lr: float = 0.2):
            super().__init__(lr * 2, 8, 4)  # the subclass's own lr wins, *args are not recorded

    child = Child()
    assert dict(child.hparams) == {"lr": 0.2, "width": 3} and child._hparams_name == "kwargs"

    class Configured(trainer.TrainModule):
        def __init__(self, config: dict, empty: tuple = ()):
            super().__init__()
            self.save_hyperparameters(empty)  # an empty container records nothing
            assert "_hparams_name" not in self.__dict__
            self.save_hyperparameters(config)
            self.save_hyperparameters(logger=False, ignore="empty")  # merges, drops "empty"

    config = {"lr": 0.5}
    module = Configured(config)
    assert dict(module.hparams) == {"lr": 0.5, "config": {"lr": 0.5}}
    assert module._log_hyperparams is False
    assert module.hparams_initial == module.hparams and module.hparams_initial is not module.hparams

    class Holder(trainer.TrainModule):
        def __init__(self, encoder: torch.nn.Module):
            super().__init__()
            self.save_hyperparameters()

    with pytest.warns(UserWarning, match=r"'encoder' is a torch.nn.Module.*ignore=\['encoder'\]"):
        Holder(torch.nn.Linear(1, 1))


def test_context_properties(tmp_path):
    seen = {}

    class Probe(LinearModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.update(
                step=self.global_step,
                epoch=self.current_epoch,
                rank=(self.global_rank, self.local_rank, self.world_size),
                device=self.device,
                trainer=self.trainer,
            )

    module = Probe()
    assert module.global_step == 0 and module.device == torch.device("cpu")
    with pytest.raises(trainer.ConfigurationError, match="not attached to a Trainer"):
        _ = module.trainer
    t = quiet_trainer(tmp_path, max_steps=2)
    t.fit(module, make_loader())
    assert seen == {
        "step": 2,
        "epoch": 0,
        "rank": (0, 0, 1),
        "device": torch.device("cpu"),
        "trainer": t,
    }


def test_module_print_only_prints_on_rank_zero(capsys):
    LinearModule().print("hi")
    assert capsys.readouterr().out == "hi\n"


def test_clip_gradients_under_16_mixed_clips_the_true_gradients(tmp_path):
    # Manual optimization: the loss is scaled (x65536) for backward; clip_gradients undoes the
    # scaling before clipping, so one SGD step (lr 1) moves the weights by the clip value.
    # Clipped while still scaled, the step would move them 65536 times less.
    class Manual(trainer.TrainModule):
        automatic_optimization = False

        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            before = torch.cat([p.detach().flatten() for p in self.parameters()])
            loss = self.net(batch[0]).float().pow(2).mean() * 100.0  # gradient norm >> 0.5
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.5)
            opt.step()
            after = torch.cat([p.detach().flatten() for p in self.parameters()])
            self.moved = float((after - before).norm())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1.0)

    module = Manual()
    quiet_trainer(tmp_path, max_steps=1, precision="16-mixed").fit(module, make_loader(8))
    assert module.moved == pytest.approx(0.5, rel=1e-3)


def test_datamodule_from_datasets_wraps_each_dataset_as_lightning_does():
    from torch.utils.data import RandomSampler, SequentialSampler, TensorDataset

    class Sized(trainer.DataModule):
        def __init__(self, batch_size: int = 1, tag: str = ""):
            super().__init__()
            self.batch_size, self.tag = batch_size, tag

    data = TensorDataset(torch.arange(12.0))
    module = Sized.from_datasets(
        data, {"a": data, "b": data}, test_dataset=[data], batch_size=4, tag="t"
    )
    assert (module.batch_size, module.tag) == (4, "t")  # given to __init__, which takes them
    train = module.train_dataloader()
    assert isinstance(train.sampler, RandomSampler) and train.batch_size == 4
    val = module.val_dataloader()
    assert sorted(val) == ["a", "b"] and isinstance(val["a"].sampler, SequentialSampler)
    assert isinstance(module.test_dataloader(), list) and not hasattr(module, "predict_dataloader")
    fit = trainer.Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    plain = trainer.DataModule.from_datasets(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))
    fit.fit(LinearModule(), datamodule=plain)
    assert fit.global_step == 8  # batch_size 1 by default


def test_log_refuses_lightning_keywords_it_cannot_honour(tmp_path):
    seen: dict[str, str] = {}

    class Grouped(LinearModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            for keyword in ({"sync_dist_group": object()}, {"enable_graph": True}):
                try:
                    self.log("x", loss, **keyword)
                except trainer.ConfigurationError as err:
                    seen[next(iter(keyword))] = str(err)
            return loss

    quiet_trainer(tmp_path, max_steps=1).fit(Grouped(), make_loader())
    assert set(seen) == {"sync_dist_group", "enable_graph"}
    assert all("reduced over every process" in message for message in seen.values())


def test_fit_with_lightnings_model_keyword_and_two_modules_refused(tmp_path):
    module = LinearModule()
    run = quiet_trainer(tmp_path, max_steps=2)
    run.fit(model=module, train_dataloaders=make_loader())
    assert run.global_step == 2 and run.module is module
    with pytest.raises(trainer.ConfigurationError, match=r"two modules.*pass one"):
        run.validate(LinearModule(), make_loader(), model=module)


def test_all_gather_on_one_process_makes_numbers_tensors_as_lightning():
    """On one process ``self.all_gather(3.5)`` returned 3.5; Lightning converts Python numbers
    and NumPy arrays first (bool uint8, int int32, float float32), on every process count."""
    import numpy as np

    gathered = LinearModule().all_gather({"n": 3.5, "k": [3, True], "a": np.ones(2), "s": "x"})
    assert (gathered["n"].item(), gathered["n"].dtype) == (3.5, torch.float32)
    assert [(t.item(), t.dtype) for t in gathered["k"]] == [(3, torch.int32), (1, torch.uint8)]
    assert gathered["a"].tolist() == [1.0, 1.0] and gathered["a"].dtype == torch.float64
    assert gathered["s"] == "x"  # not a number: as it is
