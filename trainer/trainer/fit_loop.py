"""The training loop of one ``fit``: epochs, batches, optimizer steps, scheduled validation, stops.

Reads top to bottom: `FitLoop.run` -> ``_train_epoch`` -> ``_train_batch``, with validation where
``val_check_interval`` / ``check_val_every_n_epoch`` put it. The batch itself (``training_step``,
backward, the optimizer step and the hooks around them) is `trainer.trainer.batch_step.BatchStep`,
which the finders' trial steps run too; this loop counts its steps. Every device, precision and
process question goes to ``trainer.accelerator``; hooks go through the run's `HookTable` in
DESIGN §3's order. The Trainer sets the run up and tears it down.

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
  Lightning calls them (`trainer.trainer.step_hooks`, through the batch step); one that does not
  keeps the plain path;
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
from trainer.strategies.ddp_reducer import unused_parameters_error
from trainer.trainer import profiling
from trainer.trainer.batch_step import BatchStep, batch_end_outputs
from trainer.trainer.durations import val_check_seconds
from trainer.trainer.evaluation_loop import run_eval_epoch
from trainer.trainer.hooks import LOG_KEYS
from trainer.trainer.loaders import is_reload_due, reload_stage
from trainer.trainer.log_refusal import refusing_logs
from trainer.trainer.logger_rows import send_to_loggers
from trainer.trainer.manual_step import bind_manual_steps
from trainer.trainer.mode_hooks import warn_on_eval_modules
from trainer.trainer.optimizer_config import step_schedulers
from trainer.trainer.options import warn_on_empty_epoch
from trainer.trainer.preemption import PreemptionSignal, is_preempted, save_and_exit
from trainer.trainer.validation_schedule import (
    is_val_check_batch,
    run_sanity_check,
    should_validate_epoch,
    val_check_batches,
)

if TYPE_CHECKING:
    from trainer.trainer.run import Run
    from trainer.trainer.trainer import Trainer

__all__ = ["FitLimits", "FitLoop", "run_sanity_check"]

_BATCH_END_LOGGING = LOG_KEYS["on_train_batch_end"]
_SKIP_EPOCH = object()  # on_train_batch_start returned -1: the rest of the epoch is skipped


def _through(name: str) -> property:
    """A property reading and writing ``self.trainer.<name>``."""
    return property(
        lambda self: getattr(self.trainer, name),
        lambda self, value: setattr(self.trainer, name, value),
        doc=f"``trainer.{name}`` (Lightning's ``trainer.fit_loop.{name}``).",
    )


class FitLimits:
    """``trainer.fit_loop``'s limits as Lightning names them, read and written through to the
    Trainer: ``trainer.fit_loop.max_epochs = 20`` (between calls, or from a callback during
    ``fit``) trains on to epoch 20, as in Lightning. What ``trainer.fit_loop`` is outside fit."""

    max_epochs = _through("max_epochs")
    min_epochs = _through("min_epochs")
    max_steps = _through("max_steps")
    min_steps = _through("min_steps")

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer


class FitLoop(BatchStep, FitLimits):
    """Epochs until a limit, ``should_stop`` or a preemption signal; one per ``fit`` call.

    Each batch is a `BatchStep` over the run's hooks and prepared model, whose optimizer steps
    this loop counts (a subclass, not a member: a profiler times ``backward``,
    ``_optimizer_step`` and ``_zero_grad`` on the loop object, `profiling.STAGE_ACTIONS`, and
    the step calls them through ``self``; a profiled fit never takes the inline plain step).
    ``pending_rng_state`` (from a resumed checkpoint) is applied when the first epoch starts,
    so the random streams continue where the interrupted run left them.
    """

    def __init__(
        self,
        trainer: Trainer,
        run: Run,
        received_signal: PreemptionSignal,
        pending_rng_state: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            trainer,
            run.hooks,
            model=run.model,
            training_step=run.training_step,
        )
        self._run = run
        self.received_signal = received_signal
        self.pending_rng_state = pending_rng_state
        self.is_step_row_due = False  # a training step row waits for on_train_batch_end
        self.is_stepping = False  # whether the last batch stepped the optimizer
        self._is_exhausted = False  # the train loader yielded nothing: no epoch ever would
        self._has_step_plateau = False  # read again each epoch: callbacks may add schedulers
        self._reloaded_at: dict[str, float] = {}  # set when the run starts
        self._last_val_time = 0.0  # time-based validation counts from here: set at train start
        self._train_store = run.stores["train"]  # self.log's, read every batch

    def run(self) -> bool:
        """``on_train_start``, then epochs until done (the Trainer calls ``on_train_end``).

        Returns whether training ran: as in Lightning, a fit with nothing to train (no training
        batches, ``max_epochs`` / ``max_steps`` already reached, ``should_stop`` set before it
        started) calls neither ``on_train_start`` nor ``on_train_end``."""
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
        warn_on_eval_modules(trainer.module)
        val_check_batches(trainer, self._run)  # refuses an interval it cannot count, up front
        self._last_val_time = time.monotonic()  # after the sanity check, as in Lightning
        try:
            if self._is_done():
                return False
            self._run.hooks.call("on_train_start")
            while not self._is_done():
                self._train_epoch()
            if is_preempted(trainer, self.received_signal, is_end=True):
                save_and_exit(trainer, self.received_signal)  # the signal came after the last check
            return True
        finally:
            if unbind is not None:
                unbind()

    def _take_resumed_position(self) -> None:
        """Resumed after an epoch's batches: from a checkpoint taken during its end (in
        ``on_train_epoch_end``: ModelCheckpoint's usual place), finish it as the interrupted
        run did next — its ReduceLROnPlateau step on the restored metrics — and go on with the
        next epoch; from one taken before (after its last validation, or before a validation
        that was due), `_train_epoch` runs what is left: the validation, on_train_epoch_end."""
        trainer = self.trainer
        progress = trainer.progress
        if progress.batch_idx == 0 or progress.batch_idx < trainer.num_training_batches:
            return  # at an epoch's start or inside it: continue there
        is_ending = progress.is_epoch_ending
        if is_ending is None:  # an older checkpoint, without the field: its epoch was complete
            is_validated = progress.last_val_step == progress.global_step
            is_ending = is_validated or not self._should_validate_epoch()
        if is_ending:
            if self._has_schedulers("epoch", is_plateau=True):
                self._step_schedulers("epoch", is_plateau=True)
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
        return trainer.max_epochs not in (None, -1) and trainer.progress.epoch >= trainer.max_epochs

    def _can_stop_early(self) -> bool:
        """Whether ``min_epochs`` and ``min_steps`` are met, so ``should_stop`` may end training."""
        trainer = self.trainer
        return trainer.progress.epoch >= trainer.min_epochs and (
            trainer.min_steps is None or trainer.global_step >= trainer.min_steps
        )

    # ---- one epoch ------------------------------------------------------------------------
    def _train_epoch(self) -> None:
        """One epoch of training, with validation where scheduled, then the epoch-end hooks."""
        trainer, run = self.trainer, self._run
        progress = trainer.progress
        every = trainer.reload_dataloaders_every_n_epochs
        if every and is_reload_due(every, progress.epoch, self._reloaded_at["train"]):
            reload_stage(trainer, "train", self._run)
            self._reloaded_at["train"] = progress.epoch
        loader = run.loaders["train"]
        progress.is_epoch_ending = False
        self._train_store.start_epoch()
        loader.set_epoch(progress.epoch)
        loader.skip_batches = progress.batch_idx  # > 0 only when resuming mid-epoch
        # The windows count this epoch's batches, as zero_grad's do (`BatchStep`), even after
        # an epoch left inside one (on_train_batch_start returned -1).
        self._gradient_state.start_window(progress.batch_idx)
        if self.pending_rng_state is not None:  # resuming: continue the saved random streams
            set_rng_states(self.pending_rng_state)
            self.pending_rng_state = None
        run.hooks.call("on_train_epoch_start")
        if trainer.should_stop and self._can_stop_early():  # Lightning checks before each batch
            self._end_train_epoch(is_complete=False)  # no batch: a resume starts it afresh
            return
        self._has_step_plateau = self._has_schedulers("step", is_plateau=True)
        val_every = val_check_batches(trainer, run)  # 0: after the epoch's last batch only
        val_seconds = val_check_seconds(trainer)  # or, with a duration, once it has passed
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
            steps_before = progress.global_step
            try:
                outcome = self._train_batch(batch, batch_idx)
            except BaseException as err:
                if progress.global_step == steps_before:  # it never stepped: a checkpoint
                    progress.batch_idx -= 1  # saved now (OnExceptionCheckpoint) retries it
                    progress.total_batches -= 1
                if (unused := unused_parameters_error(err)) is not None:
                    raise unused from err
                raise
            if outcome is _SKIP_EPOCH:
                is_skipped = True  # Lightning: no validation, the epoch counts as complete
                break
            if (self.received_signal.signum is not None or is_multi_process) and is_preempted(
                trainer, self.received_signal
            ):
                save_and_exit(trainer, self.received_signal)
            is_last = loader.end_of_dataloader
            # Lightning's rule: after the interval's batches (not again at the epoch's end when
            # the interval does not divide it), and after a batch that stops the fit (by
            # should_stop, which max_time's Timer sets too, in on_train_batch_end).
            is_stopping = trainer.should_stop and self._can_stop_early()
            if val_every:  # `is_val_check_batch`, inlined: this runs every batch
                count = progress.total_batches if is_counted_over_fit else batch_idx + 1
                is_due = count % val_every == 0
            elif val_seconds is not None:
                is_due = time.monotonic() - self._last_val_time >= val_seconds
            else:
                is_due = is_last
            if (is_stopping or is_due) and self._should_validate_epoch():
                self._run_validation()
                # A validation that set should_stop (EarlyStopping) ends the epoch here, as
                # Lightning's check before the next batch does: no batch and no validation more.
                is_stopping = is_stopping or (trainer.should_stop and self._can_stop_early())
            if self._has_step_plateau:  # after the validation it may read
                self._step_plateau_after_batch()
            max_steps = trainer.max_steps  # read each batch: a callback may change it
            if is_stopping or (max_steps != -1 and progress.global_step >= max_steps):
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
        is_due = val_check_seconds(self.trainer) is None and is_val_check_batch(
            self.trainer, val_every, progress.batch_idx - 1, is_last=True
        )
        if is_due and not is_validated and self._should_validate_epoch():
            self._run_validation()

    def _end_train_epoch(self, is_complete: bool) -> None:
        """Epoch-end hooks and metrics; a stopped epoch keeps its position for resuming."""
        trainer, run = self.trainer, self._run
        trainer.progress.is_epoch_ending = True
        store = run.stores["train"]
        store.finalize_epoch()
        store.touch_epochs()  # read from now on, a name validation also logs is training's
        run.hooks.call("on_train_epoch_end")
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
        """One batch: its step (`BatchStep`), counted, between the batch hooks."""
        trainer = self.trainer
        store = self._train_store
        store.current_batch = batch
        store.step_time = next(store.clock)  # `MetricStore.touch_steps`, inlined: every batch
        if self._on_batch_start and self.start_batch(batch, batch_idx):  # it returned -1
            # Lightning counts the skipped batch as the epoch's last: the interval schedulers
            # step as after its last batch (no optimizer step, no validation).
            if trainer.lr_scheduler_configs and trainer.module.automatic_optimization:
                self._step_schedulers("step", is_plateau=False)
                self._step_schedulers("epoch", is_plateau=False)
            return _SKIP_EPOCH
        output, _, is_stepping = self.step_batch(batch, batch_idx)
        progress = trainer.progress
        if self._is_automatic:
            self.is_stepping = is_stepping
            if is_stepping:  # count the optimizer step (also one skipped for a None loss)
                progress.global_step += 1
                progress.batches_stepped += 1  # = global_step under automatic optimization
                if trainer.lr_scheduler_configs:
                    self._step_interval_schedulers()
        else:  # each optimizer.step() counted itself
            # Lightning counts every batch as stepped here (whatever the optimizers did): the
            # loggers' step, and the row due every log_every_n_steps of them.
            progress.batches_stepped += 1
        # The row due every log_every_n_steps counted batches (logger_rows.is_log_due, inlined:
        # this runs every batch), written after on_train_batch_end (below).
        every = trainer.log_every_n_steps
        is_counted = is_stepping or not self._is_automatic
        if is_counted and every and progress.batches_stepped % every == 0:
            self.is_step_row_due = True
        if trainer.checkpoint_io is not None:  # a background save that ended: finish it or raise
            trainer.checkpoint_io.poll()
        on_batch_end = self._on_batch_end
        if on_batch_end:  # `end_batch`, inlined: this runs every batch
            if type(output) is torch.Tensor and self._loss_divisor == 1:
                outputs = {"loss": output.detach()}
            else:
                outputs = batch_end_outputs(output, self._loss_divisor, self._is_automatic)
            step_hook, store.hook = store.hook, _BATCH_END_LOGGING  # self.log's rules there
            for hook in on_batch_end:
                hook(outputs, batch, batch_idx)
            store.hook = step_hook
        # Lightning writes the step row after on_train_batch_end (what it logs joins the row),
        # and also for the batch that stops the fit.
        stops = is_stepping and trainer.should_stop and trainer.log_every_n_steps > 0
        if self.is_step_row_due or stops:
            self.send_step_row()
        return output

    def send_step_row(self) -> None:
        """Write the training step row (after ``on_train_batch_end``, or before a checkpoint)."""
        self.is_step_row_due = False
        send_to_loggers(self.trainer, self._run.stores["train"].step_items(for_logger=True))

    def _step_interval_schedulers(self) -> None:
        """After a counted optimizer step: the "step" schedulers (unless the step was skipped),
        and on the epoch's last batch the "epoch" ones (Lightning: before validation)."""
        if not self.trainer.accelerator.optimizer_step_was_skipped:
            self._step_schedulers("step", is_plateau=False)
        if self._run.loaders["train"].end_of_dataloader:
            self._step_schedulers("epoch", is_plateau=False)

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
            step=refusing_logs(
                trainer.module.lr_scheduler_step, trainer.module, "lr_scheduler_step"
            ),
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
            reload_stage(trainer, "validation", self._run)
            self._reloaded_at["validation"] = epoch
            self._run.stores["validation"].batch_counts.clear()  # Lightning counts rows anew
        if not (self._is_automatic and not self.is_stepping):  # not inside a window
            module = trainer.module
            hook = "on_validation_model_zero_grad"
            refusing_logs(module.on_validation_model_zero_grad, module, hook)()
        trainer.progress.last_val_step = trainer.global_step
        run_eval_epoch(trainer, self._run, "validation")  # modes restored there
        self._last_val_time = time.monotonic()
