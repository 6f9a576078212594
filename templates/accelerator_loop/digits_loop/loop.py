"""The training loop: plain PyTorch, with the four changes that make it run anywhere.

As in Accelerate's quick tour:

1. build an ``Accelerator`` first;
2. pass the model, optimizer, dataloaders and scheduler through ``accelerator.prepare`` (no
   ``.to(device)`` anywhere: prepared objects are placed for you);
3. replace ``loss.backward()`` with ``accelerator.backward(loss)``;
4. gather predictions with ``accelerator.gather_for_metrics`` before computing a metric, so it
   covers the whole dataset exactly once, however many processes share it.

``with accelerator.accumulate(model)`` adds gradient accumulation; ``accelerator.print``,
``accelerator.log`` and ``accelerator.save_model`` act on the main process only. The same loop
runs on a CPU, one GPU, or N processes started by ``trainer launch``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from trainer import Accelerator, seed_everything

from digits_loop.config import RunConfig
from digits_loop.data import make_loaders
from digits_loop.model import NUM_CLASSES, build_model

__all__ = ["evaluate", "train"]


def evaluate(
    accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader, limit: int | None
) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` over ``loader`` (every process's samples, once each)."""
    from torchmetrics.classification import Accuracy

    accuracy = Accuracy(task="multiclass", num_classes=NUM_CLASSES).to(accelerator.device)
    total_loss, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch_idx, (images, labels) in enumerate(loader):
            if limit is not None and batch_idx >= limit:
                break
            logits = model(images)
            # Each process holds a slice: gather them, without the samples that even_batches
            # repeated to give every process the same number of batches.
            logits, labels = accelerator.gather_for_metrics((logits, labels))
            accuracy.update(logits, labels)
            total_loss += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            count += labels.numel()
    model.train()
    return {"loss": total_loss / max(count, 1), "acc": float(accuracy.compute())}


def train(config: RunConfig) -> dict[str, Any]:
    """Train, evaluate on validation after every epoch and on test at the end; save the model.

    Returns:
        ``{"test/acc", "test/loss", "val/acc", "steps", "model_dir", "state_dir", "metrics_csv",
        "is_main_process"}`` (paths are None on processes other than the main one).
    """
    run = config.training
    accelerator = Accelerator(log_with="csv", project_dir=run.output_dir, **config.accelerator)
    seed_everything(run.seed)  # before the model exists: the initial weights are seeded too

    train_loader, val_loader, test_loader = make_loaders(
        config.data.batch_size, config.data.eval_batch_size, config.data.split_seed
    )
    model = build_model(config.model.dropout, config.model.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    # In optimizer steps, from the loader before prepare: the prepared scheduler skips the
    # accumulating batches and counts every process's share of the data.
    accumulation = accelerator.gradient_accumulation_steps
    steps_per_epoch = -(-len(train_loader) // accumulation)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, run.max_epochs * steps_per_epoch)
    )
    model, optimizer, train_loader, val_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, test_loader, scheduler
    )
    accelerator.init_trackers("digits_loop", config=_flat(config))

    step, val = 0, {"loss": float("nan"), "acc": float("nan")}
    for epoch in range(run.max_epochs):
        model.train()
        for batch_idx, (images, labels) in enumerate(train_loader):
            if run.limit_batches is not None and batch_idx >= run.limit_batches:
                break
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                if accelerator.sync_gradients and run.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), run.max_grad_norm)
                optimizer.step()  # these three act only on the batch that ends an accumulation
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
        val = evaluate(accelerator, model, val_loader, run.limit_batches)
        accelerator.log(
            {"train/loss": loss.item(), "val/loss": val["loss"], "val/acc": val["acc"]}, step=step
        )
        accelerator.print(
            f"epoch {epoch + 1}/{run.max_epochs}  "
            f"val/loss={val['loss']:.4f}  val/acc={val['acc']:.4f}"
        )

    test = evaluate(accelerator, model, test_loader, run.limit_batches)
    accelerator.log({"test/loss": test["loss"], "test/acc": test["acc"]}, step=step)
    accelerator.wait_for_everyone()
    model_dir = os.path.join(run.output_dir, "model")
    accelerator.save_model(model, model_dir)  # unwrapped weights, written by the main process
    state_dir = accelerator.save_state(os.path.join(run.output_dir, "state"))  # to resume
    is_main = accelerator.is_main_process
    metrics_csv = (
        os.path.join(accelerator.get_tracker("csv").log_dir, "metrics.csv") if is_main else None
    )
    accelerator.end_training()  # flushes the trackers: metrics.csv is complete after this
    return {
        "test/acc": test["acc"],
        "test/loss": test["loss"],
        "val/acc": val["acc"],
        "steps": step,
        "model_dir": model_dir if is_main else None,
        "state_dir": state_dir if is_main else None,
        "metrics_csv": metrics_csv,
        "is_main_process": is_main,
    }


def _flat(config: RunConfig) -> dict[str, Any]:
    """``{"training.lr": 0.003, ...}``: hyperparameters as a tracker records them."""
    flat: dict[str, Any] = {}
    for section, values in dataclasses.asdict(config).items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = value
    return flat
