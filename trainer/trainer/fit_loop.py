"""The training loop of one ``fit``: epochs, batches, optimizer steps, scheduled validation, stops.

Reads top to bottom: `FitLoop.run` -> ``_train_epoch`` -> ``_train_batch`` -> ``_optimizer_step``,
with validation where ``val_check_interval`` / ``check_val_every_n_epoch`` put it. Every
device, precision and process question goes to ``trainer.accelerator``; hooks go through the
run's `HookTable` in DESIGN §3's order. The Trainer sets the run up and tears it down.

Where Lightning 2.6 does something particular, so does this loop:

- ``should_stop`` ends training only once ``min_epochs`` / ``min_steps`` are met;
- schedulers are stepped through the module's ``lr_scheduler_step`` hook: "step" ones after each
  optimizer step (``frequency`` counts the epoch's batches), "epoch" ones after the epoch's last
  optimizer step, ``ReduceLROnPlateau`` after the validation (step) or ``on_train_epoch_end``
  (epoch) whose metric it reads;
- ``on_train_batch_start`` returning -1 ends the epoch without its validation;
- validation follows the ``val_check_interval``'s batches and a batch that stops the fit, and
  no other (none at an epoch's end the interval does not reach);
- a module that overrides ``optimizer_step`` / ``optimizer_zero_grad`` gets them called where
  Lightning calls them (`trainer.trainer.step_hooks`); one that does not keeps the plain path;
- a checkpoint taken once the epoch's batches (and its validation) were done resumes at the next
  epoch, without that epoch's ``on_train_epoch_end`` again. (A resume inside an epoch runs
  ``on_train_epoch_start`` for it, which Lightning does not: callbacks set up per-epoch state
  there, e.g. StochasticWeightAveraging's scheduler.)
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from trainer.runtime.seed import set_rng_states
from trainer.trainer import profiling
from trainer.trainer.closure import check_closure_precision, needs_closure, stepping_with
from trainer.trainer.evaluation_loop import run_eval_epoch
from trainer.trainer.hook_table import is_overridden
from trainer.trainer.loaders import is_reload_due, reload_stage
from trainer.trainer.logger_rows import send_to_loggers
from trainer.trainer.loss import anomaly_backward, check_finite, loss_of
from trainer.trainer.manual_step import bind_manual_steps
from trainer.trainer.module import TrainModule
from trainer.trainer.optimizer_config import step_schedulers
from trainer.trainer.options import warn_on_empty_epoch
from trainer.trainer.preemption import PreemptionSignal, is_preempted, save_and_exit
from trainer.trainer.step_hooks import HookedStep
from trainer.trainer.validation_schedule import (
    is_val_check_batch,
    run_sanity_check,
    should_validate_epoch,
    val_check_batches,
)

if TYPE_CHECKING:
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["FitLoop", "run_sanity_check"]

_SKIP_EPOCH = object()  # on_train_batch_start returned -1: the rest of the epoch is skipped


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
        self.is_stepping = False  # whether the last batch stepped the optimizer
        self._is_exhausted = False  # the train loader yielded nothing: no epoch ever would
        self._set_up_schedulers_and_closure()
        self._reloaded_at: dict[str, float] = {}  # set when the run starts

    def _set_up_schedulers_and_closure(self) -> None:
        """Whether the fit steps "step" ReduceLROnPlateau schedulers, LBFGS' closure, and the
        module's optimizer_step / optimizer_zero_grad hooks (only when it overrides them)."""
        trainer = self.trainer
        module = trainer.module
        is_automatic = module.automatic_optimization
        self._has_step_plateau = False  # read again each epoch: callbacks may add schedulers
        optimizer = trainer.optimizers[0] if is_automatic and trainer.optimizers else None
        self._needs_closure = optimizer is not None and needs_closure(optimizer)
        if self._needs_closure:
            check_closure_precision(optimizer, trainer.precision_plugin)
        self._has_zero_grad_hook = is_automatic and is_overridden(
            module, "optimizer_zero_grad", TrainModule
        )
        self._hooked_step = (
            HookedStep(
                module,
                optimizer,
                run_batch=self._run_batch,
                before_step=self._before_step,
                normalize=trainer.accumulate_grad_batches,
            )
            if optimizer is not None and is_overridden(module, "optimizer_step", TrainModule)
            else None
        )
        self._closure_batch: tuple[Any, int] | None = None
        self._closure_loss: torch.Tensor | None = None

    def run(self) -> None:
        """``on_train_start``, then epochs until done (the Trainer calls ``on_train_end``)."""
        self._take_resumed_position()
        epoch = self.trainer.progress.epoch
        # Lightning's bookkeeping for reload_dataloaders_every_n_epochs: the epoch each stage's
        # loaders were last requested (validation: only if this epoch validates).
        self._reloaded_at = {
            "train": float(epoch),
            "validation": float(epoch) if self._should_validate_epoch() else -math.inf,
        }
        trainer = self.trainer
        is_manual = not trainer.module.automatic_optimization
        # Manual optimization: optimizer.step() runs the hook and takes a closure (Lightning's).
        unbind = (
            bind_manual_steps(trainer.optimizers, self._run.hooks, trainer.progress)
            if is_manual
            else None
        )
        try:
            self._run.hooks.call("on_train_start")
            while not self._is_done():
                self._train_epoch()
        finally:
            if unbind is not None:
                unbind()

    def _take_resumed_position(self) -> None:
        """Resumed once an epoch's batches and its validation were done: that epoch is complete,
        go on with the next (Lightning); otherwise continue where the checkpoint stopped."""
        trainer = self.trainer
        progress = trainer.progress
        is_validated = progress.last_val_step == progress.global_step
        if (
            progress.batch_idx > 0
            and progress.batch_idx >= trainer.num_training_batches
            and (is_validated or not self._should_validate_epoch())
        ):
            progress.epoch += 1
            progress.batch_idx = 0

    # ---- when to stop ---------------------------------------------------------------------
    def _is_done(self) -> bool:
        trainer = self.trainer
        if trainer.num_training_batches == 0 or self._is_exhausted:
            return True  # Lightning: "No training batches"
        if trainer.should_stop and self._can_stop_early():
            return True
        if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
            return True
        if trainer.max_epochs not in (None, -1) and trainer.progress.epoch >= trainer.max_epochs:
            return True
        return self._time_is_up()

    def _can_stop_early(self) -> bool:
        """Whether ``min_epochs`` and ``min_steps`` are met, so ``should_stop`` may end training."""
        trainer = self.trainer
        return trainer.progress.epoch >= trainer.min_epochs and (
            trainer.min_steps is None or trainer.global_step >= trainer.min_steps
        )

    def _is_max_steps_reached(self) -> bool:
        max_steps = self.trainer.max_steps
        return max_steps != -1 and self.trainer.global_step >= max_steps

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
        every = trainer.reload_dataloaders_every_n_epochs
        if every and is_reload_due(every, progress.epoch, self._reloaded_at["train"]):
            reload_stage(trainer, "train")
            self._reloaded_at["train"] = progress.epoch
        loader = run.loaders["train"]
        run.stores["train"].start_epoch()
        loader.set_epoch(progress.epoch)
        loader.skip_batches = progress.batch_idx  # > 0 only when resuming mid-epoch
        if self.pending_rng_state is not None:  # resuming: continue the saved random streams
            set_rng_states(self.pending_rng_state)
            self.pending_rng_state = None
        run.model.train()
        run.hooks.call("on_train_epoch_start")
        self._has_step_plateau = self._has_schedulers("step", is_plateau=True)
        val_every = val_check_batches(trainer, run)  # 0: after the epoch's last batch only
        is_counted_over_fit = trainer.check_val_every_n_epoch is None
        is_multi_process = trainer.world_size > 1
        is_epoch_complete = True
        is_skipped = False
        first_batch_idx = progress.batch_idx
        batches = (
            profiling.profiled_batches(trainer.profiler, loader, loader=loader)
            if profiling.is_profiling(trainer.profiler)
            else loader
        )
        for batch_idx, batch in enumerate(batches, start=first_batch_idx):
            progress.batch_idx = batch_idx + 1
            progress.total_batches += 1
            if self._train_batch(batch, batch_idx) is _SKIP_EPOCH:
                is_skipped = True  # Lightning: no validation, the epoch counts as complete
                break
            if (self.received_signal.signum is not None or is_multi_process) and is_preempted(
                trainer, self.received_signal
            ):
                save_and_exit(trainer, self.received_signal)
            is_last = loader.end_of_dataloader
            # Lightning's rule: after the interval's batches (not again at the epoch's end when
            # the interval does not divide it), and after a batch that stops the fit: by
            # should_stop, or by max_time (Lightning's Timer sets should_stop then), checked once.
            is_time_up = trainer.max_time is not None and self._time_is_up()
            is_stopping = (trainer.should_stop and self._can_stop_early()) or is_time_up
            if val_every:  # `is_val_check_batch`, inlined: this runs every batch
                count = progress.total_batches if is_counted_over_fit else batch_idx + 1
                is_due = count % val_every == 0
            else:
                is_due = is_last
            if (is_stopping or is_due) and self._should_validate_epoch():
                self._run_validation()
            if self._has_step_plateau:  # after the validation it may read
                self._step_plateau_after_batch()
            if is_stopping or self._is_max_steps_reached():
                is_epoch_complete = is_last
                break
        if first_batch_idx == 0 and progress.batch_idx == 0:  # nothing came: never would
            warn_on_empty_epoch(progress.epoch)
            trainer.should_stop = self._is_exhausted = True
        elif progress.batch_idx == first_batch_idx and not is_skipped:
            self._validate_resumed_epoch_end(val_every)
        self._end_train_epoch(is_epoch_complete)

    def _validate_resumed_epoch_end(self, val_every: int) -> None:
        """Resumed after the epoch's last batch but before the validation that follows it."""
        progress = self.trainer.progress
        is_validated = progress.last_val_step == progress.global_step
        is_due = is_val_check_batch(self.trainer, val_every, progress.batch_idx - 1, is_last=True)
        if is_due and not is_validated and self._should_validate_epoch():
            self._run_validation()

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
        if is_complete and self._has_schedulers("epoch", is_plateau=True):
            self._step_schedulers("epoch", is_plateau=True)  # reads on_train_epoch_end's metrics
        # Lightning writes them at the step of the epoch's last row (optimizer steps - 1).
        send_to_loggers(trainer, store.epoch_items(for_logger=True) if epoch_metrics else {})
        if is_complete:
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
            # Lightning counts the skipped batch as the epoch's last: the interval schedulers
            # step as after its last batch (no optimizer step, no validation).
            if trainer.lr_scheduler_configs and trainer.module.automatic_optimization:
                self._step_schedulers("step", is_plateau=False)
                self._step_schedulers("epoch", is_plateau=False)
            return _SKIP_EPOCH
        is_stepping = False
        if not trainer.module.automatic_optimization:
            with accelerator.autocast():  # each optimizer.step() counts a global step
                output = run.training_step(batch, batch_idx)
            progress = trainer.progress
            # Lightning counts every batch as stepped here (whatever the optimizers did): the
            # loggers' step, and the row due every log_every_n_steps of them.
            progress.batches_stepped += 1
            is_stepping = True
            if progress.batches_stepped % trainer.log_every_n_steps == 0:
                self.is_step_row_due = True
        else:
            with accelerator.accumulate(run.model):
                # The Accelerator decides whether this batch ends an accumulation window.
                is_stepping = accelerator.sync_gradients
                if is_stepping and self._hooked_step is not None:  # the module's optimizer_step
                    output = self._hooked_step.run(trainer.current_epoch, batch, batch_idx)
                    self._count_step()
                else:
                    output, loss = self._run_batch(batch, batch_idx)
                    if is_stepping:
                        if self._needs_closure:  # LBFGS: the closure's first call: this loss
                            self._closure_batch = (batch, batch_idx)
                            self._closure_loss = None if loss is None else loss.detach()
                        self._optimizer_step(is_skipped=loss is None)
            self.is_stepping = is_stepping
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

    def _run_batch(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """``training_step``, then (Lightning's order) ``zero_grad`` on the first batch of a
        window, so hooks and callbacks still see the last step's gradients, then backward."""
        trainer = self.trainer
        with trainer.accelerator.autocast():
            output = self._run.training_step(batch, batch_idx)
        loss = loss_of(trainer, output, batch_idx)
        if batch_idx % trainer.accumulate_grad_batches == 0:
            self._zero_grad(batch_idx)
        if loss is not None:
            self.backward(loss)
        return output, loss

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
            anomaly_backward(self.trainer, loss, **kwargs)
        else:
            self.trainer.accelerator.backward(loss, **kwargs)
        if hooks["on_after_backward"]:
            hooks.call("on_after_backward")

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``TrainModule.manual_backward``: the same hooks and path as automatic backward."""
        if self.trainer.detect_anomaly:
            check_finite(loss, "training_step (manual_backward)")
        self.backward(loss, **kwargs)

    def _zero_grad(self, batch_idx: int) -> None:
        """``on_before_zero_grad``, then clear the gradients (first batch of each window)."""
        trainer = self.trainer
        optimizer = trainer.optimizers[0]
        hooks = self._run.hooks
        if hooks["on_before_zero_grad"]:
            hooks.call("on_before_zero_grad", optimizer)
        # The wrapped optimizer's own zero_grad: the prepared one's is a no-op inside a window
        # (Lightning, too, hands the module's optimizer_zero_grad the torch optimizer).
        if self._has_zero_grad_hook:
            trainer.module.optimizer_zero_grad(
                trainer.current_epoch, batch_idx, optimizer.optimizer
            )
        else:
            optimizer.optimizer.zero_grad()

    def _optimizer_step(self, *, is_skipped: bool = False) -> None:
        """Unscale, hook, clip, step; count the step and step the interval schedulers.

        ``is_skipped`` (training_step returned None): as in Lightning, the hook runs and the
        step is counted, but the optimizer does not step.
        """
        optimizer = self.trainer.optimizers[0]
        self._before_step(is_skipped)
        if not is_skipped:
            if self._needs_closure:
                with stepping_with(optimizer, self._closure):
                    optimizer.step()
            else:
                optimizer.step()
        self._count_step()

    def _count_step(self) -> None:
        """Count the optimizer step; step the interval schedulers; mark the logger row due."""
        trainer = self.trainer
        accelerator = trainer.accelerator
        progress = trainer.progress
        progress.global_step += 1
        progress.batches_stepped += 1  # = global_step under automatic optimization
        if trainer.lr_scheduler_configs and trainer.module.automatic_optimization:
            if not accelerator.optimizer_step_was_skipped:
                self._step_schedulers("step", is_plateau=False)
            if self._run.loaders["train"].end_of_dataloader:
                self._step_schedulers("epoch", is_plateau=False)  # Lightning: before validation
        if progress.batches_stepped % trainer.log_every_n_steps == 0:
            self.is_step_row_due = True  # written after on_train_batch_end (`_train_batch`)

    def _before_step(self, is_skipped: bool) -> None:
        """``on_before_optimizer_step`` (on unscaled gradients), then clipping."""
        trainer = self.trainer
        accelerator = trainer.accelerator
        hooks = self._run.hooks
        if hooks["on_before_optimizer_step"]:
            if not is_skipped:
                accelerator.unscale_gradients()  # hooks see true gradients
            hooks.call("on_before_optimizer_step", trainer.optimizers[0])
        if not is_skipped and trainer.gradient_clip_val is not None:
            parameters = trainer.module.parameters()
            if trainer.gradient_clip_algorithm == "norm":
                accelerator.clip_grad_norm_(parameters, trainer.gradient_clip_val)
            else:
                accelerator.clip_grad_value_(parameters, trainer.gradient_clip_val)

    def _closure(self) -> torch.Tensor | None:
        """LBFGS' closure. The first call returns the batch's loss, computed already; each later
        call evaluates the batch again as Lightning's closure does: ``training_step``,
        ``zero_grad`` (first batch of a window), backward, ``on_before_optimizer_step``, clip."""
        if self._closure_loss is not None:
            loss, self._closure_loss = self._closure_loss, None
            return loss
        _, loss = self._run_batch(*self._closure_batch)
        self._before_step(is_skipped=loss is None)
        return None if loss is None else loss.detach()

    def _step_schedulers(self, interval: str, *, is_plateau: bool) -> None:
        """Step ``interval``'s schedulers through the module's ``lr_scheduler_step`` hook; as in
        Lightning, ``frequency`` counts the epoch's batches ("step") or the epochs ("epoch")."""
        trainer = self.trainer
        progress = trainer.progress
        count = progress.batch_idx if interval == "step" else progress.epoch + 1
        step_schedulers(
            trainer.lr_scheduler_configs,
            interval,
            count,
            lambda: trainer.callback_metrics,
            is_plateau=is_plateau,
            step=trainer.module.lr_scheduler_step,
        )

    def _has_schedulers(self, interval: str, *, is_plateau: bool) -> bool:
        """Whether the Trainer steps schedulers of this kind (automatic optimization only)."""
        trainer = self.trainer
        return trainer.module.automatic_optimization and any(
            c.interval == interval and c.is_plateau == is_plateau
            for c in trainer.lr_scheduler_configs
        )

    def _step_plateau_after_batch(self) -> None:
        """ "step" ReduceLROnPlateau schedulers, after the validation a stepping batch ran."""
        if self.is_stepping and not self.trainer.accelerator.optimizer_step_was_skipped:
            self._step_schedulers("step", is_plateau=True)

    # ---- validation inside fit ------------------------------------------------------------
    def _should_validate_epoch(self) -> bool:
        return should_validate_epoch(self.trainer, self._run)

    def _run_validation(self) -> None:
        trainer = self.trainer
        every = trainer.reload_dataloaders_every_n_epochs
        epoch = trainer.progress.epoch
        if every and is_reload_due(every, epoch, self._reloaded_at["validation"]):
            reload_stage(trainer, "validation")
            self._reloaded_at["validation"] = epoch
            self._run.stores["validation"].batch_counts.clear()  # Lightning counts rows anew
        model = self._run.model
        was_training = model.training
        trainer.progress.last_val_step = trainer.global_step
        run_eval_epoch(trainer, self._run, "validation")
        model.train(was_training)
