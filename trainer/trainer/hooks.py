"""The hook names and their order, published as data: Lightning 2.6's order.

The Trainer's dispatcher checks every name it calls against `CALLBACK_HOOKS`; the hook-order
test and the documentation page are both generated from `FIT_ORDER` and `fit_sequence`
so the three can never disagree. This module owns names and order only; the calls live in
`trainer/trainer/trainer.py`.

Who runs first, as in Lightning 2.6 (checked against it by ``tests/parity/``): for each hook the
callbacks run in list order, then the module (`CALLBACKS_FIRST`); `on_load_checkpoint` runs on
the module first; in `on_train_epoch_end` the monitoring callbacks (``ModelCheckpoint``,
``EarlyStopping``) run after the module, so what it logs there is visible to them. The module
does not receive the hooks in `CALLBACK_ONLY_HOOKS`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CALLBACK_HOOKS",
    "CALLBACK_ONLY_HOOKS",
    "EVAL_STAGES",
    "FIT_ORDER",
    "LOGGING_REFUSED_HOOKS",
    "LOG_KEYS",
    "MONITORING_CALLBACKS",
    "OPTIMIZER_HOOKS",
    "STEP_HOOKS",
    "ZERO_GRAD_HOOKS",
    "Block",
    "eval_sequence",
    "fit_sequence",
]

EVAL_STAGES = ("validation", "test", "predict")


def _eval_hooks(stage: str) -> tuple[str, ...]:
    return (
        f"on_{stage}_start",
        f"on_{stage}_end",
        f"on_{stage}_epoch_start",
        f"on_{stage}_epoch_end",
        f"on_{stage}_batch_start",
        f"on_{stage}_batch_end",
    )


# Every hook a Callback receives (the TrainModule too, except CALLBACK_ONLY_HOOKS).
CALLBACK_HOOKS: tuple[str, ...] = (
    "setup",
    "teardown",
    "on_fit_start",
    "on_fit_end",
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_train_start",
    "on_train_end",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    *(hook for stage in EVAL_STAGES for hook in _eval_hooks(stage)),
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_exception",
)

# Hooks Lightning's LightningModule does not have: only callbacks receive them.
CALLBACK_ONLY_HOOKS: tuple[str, ...] = (
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_exception",
)

# Hooks in which self.log raises, as Lightning's: no epoch or step of the logged metrics is
# open there (a value logged in on_validation_end was dropped without a word). The module-only
# ones (batch transfer, lr_scheduler_step, the model mode hooks, configure_*) are refused where
# they are called (`trainer.trainer.log_refusal.refusing_logs`).
LOGGING_REFUSED_HOOKS = frozenset(
    {
        "setup",
        "teardown",
        "on_fit_start",
        "on_fit_end",
        "on_sanity_check_start",
        "on_sanity_check_end",
        "on_train_end",
        "on_validation_end",
        "on_test_end",
        "on_predict_start",
        "on_predict_end",
        "on_predict_epoch_start",
        "on_predict_epoch_end",
        "on_predict_batch_start",
        "on_predict_batch_end",
        "on_save_checkpoint",
        "on_load_checkpoint",
        "on_exception",
    }
)


def _log_keys(names: tuple[str, ...], on_step: bool, on_epoch: bool, per_step: bool) -> dict:
    return {name: (name, on_step, on_epoch, per_step) for name in names}


# What self.log does in each hook that allows it, as Lightning 2.6: (hook, default on_step,
# default on_epoch, whether a value per step is allowed). Where it is not, the hook logs once per
# epoch: on_step=True or on_epoch=False is refused. Each hook keeps its own values of a name
# (logged in training_step and again in on_train_epoch_end, a name is two metrics).
LOG_KEYS: dict[str, tuple[str, bool, bool, bool]] = {
    **_log_keys(
        (
            "training_step",
            "on_train_batch_start",
            "on_train_batch_end",
            "on_before_backward",
            "on_after_backward",
            "on_before_zero_grad",
            "on_before_optimizer_step",
        ),
        on_step=True,
        on_epoch=False,
        per_step=True,
    ),
    **_log_keys(
        tuple(
            name
            for stage in ("validation", "test")
            for name in (f"{stage}_step", f"on_{stage}_batch_start", f"on_{stage}_batch_end")
        ),
        on_step=False,
        on_epoch=True,
        per_step=True,
    ),
    **_log_keys(
        tuple(
            name
            for stage in ("train", "validation", "test")
            for name in (f"on_{stage}_start", f"on_{stage}_epoch_start", f"on_{stage}_epoch_end")
        ),
        on_step=False,
        on_epoch=True,
        per_step=False,
    ),
}


# Callback classes that run after the module in on_train_epoch_end (they read its metrics).
MONITORING_CALLBACKS: tuple[str, ...] = ("ModelCheckpoint", "EarlyStopping")

# Runs after training_step on the first batch of each accumulation window, then zero_grad.
ZERO_GRAD_HOOKS: tuple[str, ...] = ("on_before_zero_grad",)
# Runs after backward on the batch that steps the optimizer (the window's last), then the step.
STEP_HOOKS: tuple[str, ...] = ("on_before_optimizer_step",)
# With gradient accumulation these run once per window, not on every batch.
OPTIMIZER_HOOKS: tuple[str, ...] = (*ZERO_GRAD_HOOKS, *STEP_HOOKS)


@dataclass(frozen=True)
class Block:
    """A repeated part of the order: ``hooks`` run once per ``repeat`` (epoch, batch, ...)."""

    repeat: str
    hooks: tuple[str | Block, ...]


def _eval_epoch(stage: str) -> Block:
    step = f"{stage}_step"
    return Block(
        f"{stage} epoch",
        (
            f"on_{stage}_start",
            f"on_{stage}_epoch_start",
            Block("batch", (f"on_{stage}_batch_start", step, f"on_{stage}_batch_end")),
            f"on_{stage}_epoch_end",
            f"on_{stage}_end",
        ),
    )


TRAIN_BATCH = Block(
    "batch",
    (
        "on_train_batch_start",
        "training_step",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    ),
)

FIT_ORDER: tuple[str | Block, ...] = (
    "setup",
    "configure_model",
    "configure_optimizers",
    "on_fit_start",
    "on_sanity_check_start",
    _eval_epoch("validation"),
    "on_sanity_check_end",
    "on_train_start",
    Block(
        "epoch",
        ("on_train_epoch_start", TRAIN_BATCH, _eval_epoch("validation"), "on_train_epoch_end"),
    ),
    "on_train_end",
    "on_fit_end",
    "teardown",
)

EVAL_ORDER: dict[str, tuple[str | Block, ...]] = {
    stage: ("setup", "configure_model", _eval_epoch(stage), "teardown") for stage in EVAL_STAGES
}


def eval_sequence(stage: str, num_batches: int) -> list[str]:
    """The flat hook sequence of one ``stage`` epoch ("validation", "test" or "predict")."""
    step = f"{stage}_step"
    batch = [f"on_{stage}_batch_start", step, f"on_{stage}_batch_end"]
    return [
        f"on_{stage}_start",
        f"on_{stage}_epoch_start",
        *(batch * num_batches),
        f"on_{stage}_epoch_end",
        f"on_{stage}_end",
    ]


def fit_sequence(
    *,
    epochs: int,
    train_batches: int,
    val_batches: int,
    sanity_batches: int = 0,
    accumulate_grad_batches: int = 1,
) -> list[str]:
    """The flat hook sequence of ``fit`` with validation at every epoch end.

    Example: ``fit_sequence(epochs=1, train_batches=2, val_batches=1, accumulate_grad_batches=2)``
    lists ``on_before_zero_grad`` on the first batch and ``on_before_optimizer_step`` on the
    second. Each name is one hook; who receives it (callbacks, then the module) is not listed.
    """
    seq = ["setup", "configure_model", "configure_optimizers", "on_fit_start"]
    if sanity_batches:
        seq += ["on_sanity_check_start", *eval_sequence("validation", sanity_batches)]
        seq += ["on_sanity_check_end"]
    seq.append("on_train_start")
    for _ in range(epochs):
        seq.append("on_train_epoch_start")
        for batch_idx in range(train_batches):
            is_window_start = batch_idx % accumulate_grad_batches == 0
            is_stepping = (batch_idx + 1) % accumulate_grad_batches == 0 or (
                batch_idx + 1 == train_batches
            )
            for hook in TRAIN_BATCH.hooks:
                if (hook in ZERO_GRAD_HOOKS and not is_window_start) or (
                    hook in STEP_HOOKS and not is_stepping
                ):
                    continue
                seq.append(hook)  # type: ignore[arg-type]  # TRAIN_BATCH holds names only
        if val_batches:
            seq += eval_sequence("validation", val_batches)
        seq.append("on_train_epoch_end")
    seq += ["on_train_end", "on_fit_end", "teardown"]
    return seq
