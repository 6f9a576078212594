"""Precision plugins: dtypes, autocast, loss scaling and skipped steps."""

from __future__ import annotations

import pytest
import torch

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer import Accelerator
from trainer.callbacks import Callback
from trainer.precision import (
    PRECISION_ALIASES,
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    resolve_precision,
)


@pytest.mark.parametrize(
    ("name", "cls", "mixed"),
    [
        ("32-true", Precision, "no"),
        ("32", Precision, "no"),
        ("no", Precision, "no"),
        (32, Precision, "no"),
        ("64-true", DoublePrecision, "no"),
        ("16-mixed", MixedPrecision, "fp16"),
        ("fp16", MixedPrecision, "fp16"),
        ("bf16-mixed", MixedPrecision, "bf16"),
        ("bf16", MixedPrecision, "bf16"),
        ("16-true", HalfPrecision, "fp16"),
        ("bf16-true", HalfPrecision, "bf16"),
    ],
)
def test_names_and_aliases(name, cls, mixed):
    plugin = resolve_precision(name)
    assert type(plugin) is cls and plugin.mixed_precision == mixed


def test_aliases_map_to_known_names():
    assert set(PRECISION_ALIASES.values()) <= {"32-true", "64-true", "16-mixed", "bf16-mixed"}


class _DtypeProbe(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.param = module.net.weight.dtype
        self.input = batch[0].dtype
        self.loss = outputs["loss"].dtype


@pytest.mark.parametrize(
    ("precision", "param", "inputs", "loss"),
    [
        ("32-true", torch.float32, torch.float32, torch.float32),
        ("64-true", torch.float64, torch.float64, torch.float64),
        ("bf16-true", torch.bfloat16, torch.bfloat16, torch.bfloat16),
        ("16-true", torch.float16, torch.float16, torch.float16),
        ("bf16-mixed", torch.float32, torch.float32, torch.float32),
    ],
)
def test_trainer_dtypes_per_mode(tmp_path, precision, param, inputs, loss):
    probe = _DtypeProbe()
    quiet_trainer(tmp_path, max_steps=2, precision=precision, callbacks=[probe]).fit(
        LinearModule(), make_loader()
    )
    assert (probe.param, probe.input, probe.loss) == (param, inputs, loss)


class _StepDtypes(LinearModule):
    """Records torch's default dtype, and the dtype of a tensor the step creates, in each step."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple[torch.dtype, torch.dtype]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        hidden = self.net(x) + torch.zeros(1)  # the step's own tensor meets the output's dtype
        self.seen["training_step"] = (torch.get_default_dtype(), hidden.dtype)
        return torch.nn.functional.mse_loss(hidden, y)

    def validation_step(self, batch, batch_idx):
        self.seen["validation_step"] = (torch.get_default_dtype(), torch.tensor(0.5).dtype)

    def on_train_epoch_end(self):
        self.seen["on_train_epoch_end"] = (torch.get_default_dtype(), torch.tensor(0.5).dtype)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        ("bf16-true", torch.bfloat16),
        ("16-true", torch.float16),
        ("64-true", torch.float64),
        ("32-true", torch.float32),
        ("bf16-mixed", torch.float32),
    ],
)
def test_tensors_created_in_a_step_take_a_true_precisions_dtype(tmp_path, precision, dtype):
    # Lightning's forward_context: under a true precision torch's default dtype is the mode's
    # inside the steps (a tensor built there meets the parameters' dtype), and only there.
    module = _StepDtypes()
    fit = quiet_trainer(tmp_path, max_epochs=1, precision=precision, limit_val_batches=1)
    fit.fit(module, make_loader(8), make_loader(4))
    assert module.seen["training_step"] == (dtype, dtype)
    assert module.seen["validation_step"] == (dtype, dtype)
    assert module.seen["on_train_epoch_end"] == (torch.float32, torch.float32)
    assert torch.get_default_dtype() is torch.float32


class _LogsHalfValues(LinearModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("ones_bf16", torch.tensor(1.0, dtype=torch.bfloat16), on_epoch=True, batch_size=1)
        self.log("ones_fp16", torch.tensor(1.0, dtype=torch.float16), on_epoch=True, batch_size=1)
        self.log("count", torch.tensor(batch_idx), on_epoch=True, reduce_fx="sum")
        return loss


@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "64-true"])
def test_half_and_integer_values_are_averaged_in_float32_or_wider(tmp_path, precision):
    # A sum kept in bfloat16 stops growing at 256 (the next integer it holds is 258), so a
    # bf16 value averaged over 600 batches read 256 / 600 = 0.43 instead of 1.0 (float16: 2048).
    fit = quiet_trainer(tmp_path, max_epochs=1, precision=precision)
    fit.fit(_LogsHalfValues(), make_loader(600, batch_size=1))
    metrics = fit.callback_metrics
    wide = torch.float64 if precision == "64-true" else torch.float32
    for name in ("ones_bf16_epoch", "ones_fp16_epoch", "count_epoch"):
        assert metrics[name].dtype is wide, (name, metrics[name].dtype)
    assert metrics["ones_bf16_epoch"].item() == 1.0
    assert metrics["ones_fp16_epoch"].item() == 1.0
    assert metrics["count_epoch"].item() == sum(range(600))
    assert metrics["ones_bf16_step"].dtype is wide and metrics["count_step"].item() == 599


def test_bf16_mixed_runs_the_forward_in_bf16(tmp_path):
    seen = {}

    class Probe(LinearModule):
        def training_step(self, batch, batch_idx):
            seen["out"] = self(batch[0]).dtype
            return super().training_step(batch, batch_idx)

    quiet_trainer(tmp_path, max_steps=1, precision="bf16-mixed").fit(Probe(), make_loader())
    assert seen["out"] == torch.bfloat16


def test_bf16_mixed_training_converges(tmp_path):
    module = LinearModule(lr=0.1)
    loader = make_loader(n=64, batch_size=8)
    t = quiet_trainer(tmp_path, max_epochs=6, precision="bf16-mixed")
    t.fit(module, loader, loader)
    assert t.callback_metrics["val/loss"].item() < 0.1


def test_16_mixed_uses_a_cpu_grad_scaler_and_skips_inf_steps():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    plugin = accelerator.precision
    assert isinstance(plugin.scaler, torch.amp.GradScaler) and plugin.scaler.is_enabled()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = accelerator.prepare(
        model, opt, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    )
    before = model.weight.detach().clone()
    scale = plugin.scaler.get_scale()
    accelerator.backward(model(torch.tensor([[float("inf"), 1.0]])).sum())
    optimizer.step()
    scheduler.step()
    assert accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight, before)
    assert plugin.scaler.get_scale() == scale / 2
    assert scheduler.get_last_lr() == [1.0]  # no scheduler step after a skipped optimizer step
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped and not torch.equal(model.weight, before)
    assert scheduler.get_last_lr() == [0.5]
    assert "scaler" in plugin.state_dict()


def test_16_mixed_trainer_does_not_step_the_scheduler_after_a_skipped_step(tmp_path):
    class InfOnce(LinearModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("inf") if batch_idx == 0 else loss

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.01)
            return {
                "optimizer": opt,
                "lr_scheduler": {
                    "scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5),
                    "interval": "step",
                },
            }

    skipped = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            skipped.append(trainer.accelerator.optimizer_step_was_skipped)

    # A small initial scale: the default 65536 overflows fp16 on this loss for several steps.
    plugin = MixedPrecision("16-mixed", scaler=torch.amp.GradScaler("cpu", init_scale=16.0))
    t = quiet_trainer(tmp_path, max_steps=3, precision=plugin, callbacks=[Probe()])
    t.fit(InfOnce(), make_loader())
    assert t.global_step == 3 and skipped == [True, False, False]
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01 * 0.25)  # 2 of 3 stepped


def test_gradients_are_unscaled_before_hooks_see_them(tmp_path):
    norms: dict[str, float] = {}

    class Probe(Callback):
        def __init__(self, key):
            self.key = key

        def on_before_optimizer_step(self, trainer, module, optimizer):
            norms.setdefault(self.key, float(torch.linalg.vector_norm(module.net.weight.grad)))

    plugin = MixedPrecision("16-mixed", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    torch.manual_seed(0)
    quiet_trainer(tmp_path, max_steps=1, precision=plugin, callbacks=[Probe("fp16")]).fit(
        LinearModule(), make_loader()
    )
    torch.manual_seed(0)
    quiet_trainer(tmp_path, max_steps=1, callbacks=[Probe("fp32")]).fit(
        LinearModule(), make_loader()
    )
    # Scaled gradients would be 1024x larger; unscaled ones match fp32 up to fp16 rounding.
    assert norms["fp16"] == pytest.approx(norms["fp32"], rel=1e-2)


def test_fp8_and_bad_plugin_arguments():
    from trainer.precision import FP8Precision

    assert isinstance(resolve_precision("fp8"), FP8Precision)
    with pytest.raises(trainer.ConfigurationError, match="'16-mixed' or 'bf16-mixed'"):
        MixedPrecision("32-true")
    with pytest.raises(trainer.ConfigurationError, match="'16-true' or 'bf16-true'"):
        HalfPrecision("bf16-mixed")


def test_precision_instance_is_used_as_is(tmp_path):
    plugin = MixedPrecision("bf16-mixed")
    t = quiet_trainer(tmp_path, precision=plugin)
    assert t.precision_plugin is plugin and t.precision == "bf16-mixed"


class AdamModule(LinearModule):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, eps=self.eps)


def test_16_true_warns_when_adam_eps_is_zero_in_float16(tmp_path):
    with pytest.warns(UserWarning, match=r"eps=1e-08, which is 0 in torch.float16") as caught:
        quiet_trainer(tmp_path, max_steps=1, precision="16-true").fit(
            AdamModule(eps=1e-8), make_loader()
        )
    assert [w.filename for w in caught if "eps=" in str(w.message)] == [__file__]


@pytest.mark.parametrize(("precision", "eps"), [("16-true", 1e-4), ("bf16-true", 1e-8)])
def test_no_eps_warning_when_eps_is_representable(tmp_path, precision, eps):
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*eps=")
        quiet_trainer(tmp_path, max_steps=1, precision=precision).fit(
            AdamModule(eps=eps), make_loader()
        )
