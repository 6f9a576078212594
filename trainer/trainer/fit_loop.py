"""The training loop of one ``fit``: epochs, batches, optimizer steps, scheduled validation, stops.

Reads top to bottom: `FitLoop.run` -> ``_train_epoch`` -> ``_train_batch`` -> ``_optimizer_step``,
with validation where ``val_check_interval`` / ``check_val_every_n_epoch`` put it. Every
device, precision and process question goes to ``trainer.accelerator``; hooks go through the
run's `HookTable` in DESIGN §3's order. The Trainer sets the run up and tears it down.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import AnomalyError, ConfigurationError, HookResultError
from trainer.runtime.seed import set_rng_states
from trainer.trainer import profiling
from trainer.trainer.evaluation_loop import run_eval_epoch
from trainer.trainer.logger_rows import send_to_loggers
from trainer.trainer.optimizer_config import step_schedulers
from trainer.trainer.options import overrides, safe_len, warn_on_empty_epoch
from trainer.trainer.preemption import PreemptionSignal, is_preempted, save_and_exit

if TYPE_CHECKING:
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["FitLoop", "run_sanity_check"]

_SKIP_EPOCH = object()  # on_train_batch_start returned -1: the rest of the epoch is skipped


def run_sanity_check(trainer: Trainer, run: Run) -> None:
    """A few validation batches before training (``num_sanity_val_steps``); nothing is logged."""
    loader = run.loaders.get("validation")
    if trainer.num_sanity_val_steps == 0 or not _has_validation(trainer, run):
        return
    full_limit = loader.limit
    steps = trainer.num_sanity_val_steps
    loader.limit = (
        None if steps < 0 else min(steps, full_limit if full_limit is not None else steps)
    )
    trainer.sanity_checking = True
    full_count, trainer.num_val_batches = trainer.num_val_batches, safe_len(loader)
    try:
        run.hooks.call("on_sanity_check_start")
        run_eval_epoch(trainer, run, "validation")
        run.hooks.call("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        loader.limit = full_limit
        trainer.num_val_batches = full_count
        run.stores["validation"].reset()  # sanity values are not real metrics


class FitLoop:
    """Epochs until a limit, ``should_stop`` or a preemption signal; one per ``fit`` call.

    ``pending_rng_state`` (from a resumed checkpoint) is applied when the first epoch starts, so
    the random streams continue where the interrupted run left them.
    """

    def __init__(
        self,
        trainer: Trainer,
        run: Run,
        received_signal: PreemptionSignal,
        pending_rng_state: dict[str, Any] | None = None,
    ) -> None:
        self.trainer = trainer
        self._run = run
        self.received_signal = received_signal
        self.pending_rng_state = pending_rng_state
        self.is_step_row_due = False  # a training step row waits for on_train_batch_end

    def run(self) -> None:
        """``on_train_start``, then epochs until done (the Trainer calls ``on_train_end``)."""
        self._run.hooks.call("on_train_start")
        while not self._is_done():
            self._train_epoch()

    # ---- when to stop ---------------------------------------------------------------------
    def _is_done(self) -> bool:
        trainer = self.trainer
        if (
            trainer.should_stop or trainer.num_training_batches == 0
        ):  # Lightning: "No training batches"
            return True
        if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
            return True
        if trainer.max_epochs not in (None, -1) and trainer.progress.epoch >= trainer.max_epochs:
            return True
        return self._time_is_up()

    def _is_step_limit_reached(self) -> bool:
        """The per-batch part of ``_is_done`` (epochs cannot end mid-epoch): steps and time."""
        max_steps = self.trainer.max_steps
        if max_steps != -1 and self.trainer.global_step >= max_steps:
            return True
        return self.trainer.max_time is not None and self._time_is_up()

    def _time_is_up(self) -> bool:
        max_time = self.trainer.max_time
        return (
            max_time is not None
            and time.monotonic() - self._run.start_time >= max_time.total_seconds()
        )

    # ---- one epoch ------------------------------------------------------------------------
    def _train_epoch(self) -> None:
        """One epoch of training, with validation where scheduled, then the epoch-end hooks."""
        trainer, run = self.trainer, self._run
        progress = trainer.progress
        loader = run.loaders["train"]
        run.stores["train"].start_epoch()
        loader.set_epoch(progress.epoch)
        loader.skip_batches = progress.batch_idx  # > 0 only when resuming mid-epoch
        if self.pending_rng_state is not None:  # resuming: continue the saved random streams
            set_rng_states(self.pending_rng_state)
            self.pending_rng_state = None
        run.model.train()
        run.hooks.call("on_train_epoch_start")
        val_every = self._val_check_batches()
        is_multi_process = trainer.world_size > 1
        is_epoch_complete = True
        first_batch_idx = progress.batch_idx
        batches = (
            profiling.profiled_batches(trainer.profiler, loader, loader=loader)
            if profiling.is_profiling(trainer.profiler)
            else loader
        )
        for batch_idx, batch in enumerate(batches, start=first_batch_idx):
            progress.batch_idx = batch_idx + 1
            if self._train_batch(batch, batch_idx) is _SKIP_EPOCH:
                break
            if (self.received_signal.signum is not None or is_multi_process) and is_preempted(
                trainer, self.received_signal
            ):
                save_and_exit(trainer, self.received_signal)
            is_last = loader.end_of_dataloader
            if (
                val_every
                and (batch_idx + 1) % val_every == 0
                and not is_last
                and self._should_validate_epoch()
            ):
                self._run_validation()
            if trainer.should_stop or self._is_step_limit_reached():
                is_epoch_complete = is_last
                break
        if first_batch_idx == 0 and progress.batch_idx == 0:  # nothing came: never would
            warn_on_empty_epoch(progress.epoch)
            trainer.should_stop = True
        is_validated = progress.last_val_step == progress.global_step  # e.g. on resume
        if (
            self._should_validate_epoch()
            and (is_epoch_complete or trainer.should_stop)
            and not is_validated
        ):
            self._run_validation()
        self._end_train_epoch(is_epoch_complete)

    def _end_train_epoch(self, is_complete: bool) -> None:
        """Epoch-end hooks and metrics; a stopped epoch keeps its position for resuming."""
        trainer, run = self.trainer, self._run
        store = run.stores["train"]
        store.finalize_epoch()
        previous_hook = store.hook  # errors of self.log name the hook; its defaults are epoch's
        store.hook = ("on_train_epoch_end", False, True)
        try:
            run.hooks.call("on_train_epoch_end")
        finally:
            store.hook = previous_hook
        epoch_metrics = store.finalize_epoch()
        for monitor in run.hooks.epoch_end_monitors:  # ModelCheckpoint, EarlyStopping: see above
            monitor()
        # Lightning writes them at the step of the epoch's last row (optimizer steps - 1).
        send_to_loggers(trainer, store.epoch_items(for_logger=True) if epoch_metrics else {})
        if is_complete:
            if trainer.module.automatic_optimization:  # manual optimization steps its own
                self._step_schedulers("epoch")
            trainer.progress.epoch += 1
            trainer.progress.batch_idx = 0

    # ---- one batch ------------------------------------------------------------------------
    def _train_batch(self, batch: Any, batch_idx: int) -> Any:
        """One batch: step, backward, and on stepping batches the optimizer step."""
        trainer, run = self.trainer, self._run
        accelerator = trainer.accelerator
        store = run.stores["train"]
        store.current_batch = batch
        hooks = run.hooks
        if (
            hooks["on_train_batch_start"]
            and hooks.call("on_train_batch_start", batch, batch_idx) == -1
        ):
            return _SKIP_EPOCH
        is_stepping = False
        if not trainer.module.automatic_optimization:
            optimizers = trainer.optimizers
            steps_before = sum(opt.step_count for opt in optimizers)
            with accelerator.autocast():
                output = run.training_step(batch, batch_idx)
            stepped = sum(opt.step_count for opt in optimizers) - steps_before
            trainer.progress.global_step += stepped
            if stepped and trainer.global_step % trainer.log_every_n_steps < stepped:
                send_to_loggers(trainer, store.step_items(for_logger=True))
        else:
            with accelerator.accumulate(run.model):
                with accelerator.autocast():
                    output = run.training_step(batch, batch_idx)
                loss = self._loss_of(output, batch_idx)
                # Lightning's order: gradients are cleared after the step of the window's first
                # batch, not after the optimizer step, so hooks and callbacks still see them.
                if batch_idx % trainer.accumulate_grad_batches == 0:
                    self._zero_grad()
                if loss is not None:
                    self.backward(loss)
                # The Accelerator decides whether this batch ends an accumulation window.
                is_stepping = accelerator.sync_gradients
                if is_stepping:
                    self._optimizer_step(is_skipped=loss is None)
        if trainer.checkpoint_io is not None:  # a background save that ended: finish it or raise
            trainer.checkpoint_io.poll()
        if hooks["on_train_batch_end"]:  # hot path: build nothing nobody reads
            output = {"loss": output.detach()} if isinstance(output, torch.Tensor) else output
            hooks.call("on_train_batch_end", output, batch, batch_idx)
        # Lightning writes the step row after on_train_batch_end (what it logs joins the row),
        # and also for the batch that stops the fit.
        if self.is_step_row_due or (is_stepping and trainer.should_stop):
            self.send_step_row()
        return output

    def send_step_row(self) -> None:
        """Write the training step row (after ``on_train_batch_end``, or before a checkpoint)."""
        self.is_step_row_due = False
        send_to_loggers(self.trainer, self._run.stores["train"].step_items(for_logger=True))

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The hooks around ``accelerator.backward`` (also ``TrainModule.manual_backward``'s path)."""
        hooks = (
            self._run.hooks
        )  # empty hook lists are skipped without a call: this runs every batch
        if hooks["on_before_backward"]:
            hooks.call("on_before_backward", loss)
        if self.trainer.detect_anomaly:
            self._anomaly_backward(loss, **kwargs)
        else:
            self.trainer.accelerator.backward(loss, **kwargs)
        if hooks["on_after_backward"]:
            hooks.call("on_after_backward")

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``TrainModule.manual_backward``: the same hooks and path as automatic backward."""
        if self.trainer.detect_anomaly:
            self._check_finite(loss, "training_step (manual_backward)")
        self.backward(loss, **kwargs)

    def _zero_grad(self) -> None:
        """``on_before_zero_grad``, then clear the gradients (first batch of each window)."""
        optimizer = self.trainer.optimizers[0]
        hooks = self._run.hooks
        if hooks["on_before_zero_grad"]:
            hooks.call("on_before_zero_grad", optimizer)
        # The wrapped optimizer's own zero_grad: the prepared one's is a no-op inside a window.
        optimizer.optimizer.zero_grad()

    def _optimizer_step(self, *, is_skipped: bool = False) -> None:
        """Unscale, hook, clip, step; count the step and step 'step' schedulers.

        ``is_skipped`` (training_step returned None): as in Lightning, the hook runs and the
        step is counted, but the optimizer does not step.
        """
        trainer = self.trainer
        accelerator = trainer.accelerator
        optimizer = trainer.optimizers[0]
        hooks = self._run.hooks
        if hooks["on_before_optimizer_step"]:
            if not is_skipped:
                accelerator.unscale_gradients()  # hooks see true gradients
            hooks.call("on_before_optimizer_step", optimizer)
        if not is_skipped:
            if trainer.gradient_clip_val is not None:
                parameters = trainer.module.parameters()
                if trainer.gradient_clip_algorithm == "norm":
                    accelerator.clip_grad_norm_(parameters, trainer.gradient_clip_val)
                else:
                    accelerator.clip_grad_value_(parameters, trainer.gradient_clip_val)
            optimizer.step()
        trainer.progress.global_step += 1
        if trainer.lr_scheduler_configs and not accelerator.optimizer_step_was_skipped:
            self._step_schedulers("step")
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self.is_step_row_due = True  # written after on_train_batch_end (`_train_batch`)

    def _step_schedulers(self, interval: str) -> None:
        trainer = self.trainer
        count = trainer.global_step if interval == "step" else trainer.progress.epoch + 1
        step_schedulers(
            trainer.lr_scheduler_configs, interval, count, lambda: trainer.callback_metrics
        )

    # ---- the loss and anomalies -----------------------------------------------------------
    def _loss_of(self, output: Any, batch_idx: int) -> torch.Tensor | None:
        """Check ``training_step``'s result and return the loss (None skips the batch)."""
        if isinstance(output, torch.Tensor):
            loss = output
        elif output is None:
            return None
        elif isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
            loss = output["loss"]
        else:
            detail = " without a 'loss' Tensor" if isinstance(output, dict) else ""
            raise HookResultError(
                f"training_step returned {type(output).__name__}{detail}; expected a Tensor, a "
                f'dict with "loss", or None ({self._where("training_step", batch_idx)}). Return '
                "the loss tensor."
            )
        if loss.numel() != 1 or not loss.requires_grad:
            problem = (
                f"of shape {tuple(loss.shape)}"
                if loss.numel() != 1
                else "that does not require grad"
            )
            raise HookResultError(
                f"training_step returned a loss {problem} ({self._where('training_step', batch_idx)}). "
                "Return one scalar computed from the model's outputs, outside torch.no_grad() "
                "and without .detach()."
            )
        if self.trainer.detect_anomaly:
            self._check_finite(loss, self._where("training_step", batch_idx))
        return loss

    def _check_finite(self, loss: torch.Tensor, where: str) -> None:
        if not torch.isfinite(loss).all():
            kind = "nan" if torch.isnan(loss).any() else "inf"
            raise AnomalyError(
                f"detect_anomaly: the loss is {kind} ({where}). Check the inputs, lower the "
                "learning rate, or clip gradients (gradient_clip_val)."
            )

    def _anomaly_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        trainer = self.trainer
        where = self._where("training_step", trainer.progress.batch_idx - 1)
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                trainer.accelerator.backward(loss, **kwargs)
        except RuntimeError as err:
            if "nan" not in str(err).lower():
                raise
            raise AnomalyError(
                f"detect_anomaly: backward produced nan gradients (after training_step, "
                f"{where}): {err}"
            ) from err
        bad = [
            name
            for name, p in trainer.module.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        if bad:
            raise AnomalyError(
                f"detect_anomaly: nan/inf gradients in {bad[:5]} after backward of training_step "
                f"({where})."
            )

    def _where(self, hook: str, batch_idx: int) -> str:
        trainer = self.trainer
        return f"{type(trainer.module).__name__}.{hook}, epoch {trainer.progress.epoch}, batch {batch_idx}"

    # ---- validation inside fit ------------------------------------------------------------
    def _val_check_batches(self) -> int:
        """Run validation every this many train batches inside the epoch (0: only at the end)."""
        trainer = self.trainer
        if not _has_validation(trainer, self._run):
            return 0
        interval = trainer.val_check_interval
        if isinstance(interval, int):
            if interval > trainer.num_training_batches:
                raise ConfigurationError(
                    f"Trainer(val_check_interval={interval}) is more than the "
                    f"{trainer.num_training_batches} training batches per epoch. Use a smaller "
                    "int, or a float fraction of the epoch."
                )
            return interval
        if interval >= 1.0 or math.isinf(trainer.num_training_batches):
            return 0
        return max(1, int(trainer.num_training_batches * interval))

    def _should_validate_epoch(self) -> bool:
        trainer = self.trainer
        if not _has_validation(trainer, self._run) or trainer.num_val_batches == 0:
            return False
        every = trainer.check_val_every_n_epoch
        return every is None or (trainer.progress.epoch + 1) % every == 0

    def _run_validation(self) -> None:
        model = self._run.model
        was_training = model.training
        self.trainer.progress.last_val_step = self.trainer.global_step
        run_eval_epoch(self.trainer, self._run, "validation")
        model.train(was_training)


def _has_validation(trainer: Trainer, run: Run) -> bool:
    return run.loaders.get("validation") is not None and overrides(
        trainer.module, "validation_step"
    )
