"""The digits CNN of ``examples/digits.py``, trained by a hand-written loop on ``Accelerator``.

This is the path for people who keep their own loop (as with Hugging Face Accelerate): build
the model, optimizer, dataloaders and scheduler as usual, pass them through
``accelerator.prepare``, replace ``loss.backward()`` with ``accelerator.backward(loss)``, and
gather predictions with ``accelerator.gather_for_metrics`` before computing a metric. Today it
runs in one process on the CPU or one GPU; written this way, the loop needs no change when
multi-process strategies arrive (each process then gets its slice of every loader).

Run it:

    python examples/accelerator_loop.py
    python examples/accelerator_loop.py --mixed-precision bf16 --gradient-accumulation-steps 4
    python examples/accelerator_loop.py --fast     # 2 batches: checks the plumbing only

Metrics go to ``<root-dir>/digits_loop/version_<N>/metrics.csv`` (the "csv" tracker).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from digits import (  # examples/digits.py: the same data, model and accuracy bar
    MIN_TEST_ACCURACY,
    NUM_CLASSES,
    build_model,
    load_digit_splits,
    torch_threads,
)
from torch.utils.data import DataLoader
from torchmetrics.classification import Accuracy

from trainer import Accelerator, seed_everything

__all__ = ["evaluate", "main", "train"]


def evaluate(
    accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader, limit: int | None
) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` over ``loader`` (all processes' samples, once each)."""
    accuracy = Accuracy(task="multiclass", num_classes=NUM_CLASSES).to(accelerator.device)
    total_loss, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch_idx, (images, labels) in enumerate(loader):
            if limit is not None and batch_idx >= limit:
                break
            logits = model(images)
            # Every process holds a slice; gather them, without the padding even_batches added.
            logits, labels = accelerator.gather_for_metrics((logits, labels))
            accuracy.update(logits, labels)
            total_loss += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            count += labels.numel()
    model.train()
    return total_loss / max(count, 1), float(accuracy.compute())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--root-dir", default="runs/digits_loop", help="where the tracker writes")
    parser.add_argument("--mixed-precision", default="no", help="no, bf16 or fp16 (no)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per process, per micro-batch")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=MIN_TEST_ACCURACY)
    parser.add_argument("--num-threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--fast", action="store_true", help="1 epoch of 2 batches, no check")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> tuple[float, str | None]:
    """The loop; returns the test accuracy and, on the main process, where metrics.csv is."""
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with="csv",
        project_dir=args.root_dir,
    )
    seed_everything(args.seed)
    splits = load_digit_splits(args.seed)
    train_loader = DataLoader(splits["train"], batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(splits["val"], batch_size=256)
    test_loader = DataLoader(splits["test"], batch_size=256)
    max_epochs = 1 if args.fast else args.max_epochs
    limit = 2 if args.fast else None

    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)
    # Counted in optimizer steps: the prepared scheduler does not step on accumulating batches.
    steps_per_epoch = -(-len(train_loader) // args.gradient_accumulation_steps)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, max_epochs * steps_per_epoch)
    )
    model, optimizer, train_loader, val_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, test_loader, scheduler
    )
    accelerator.init_trackers("digits_loop", config=vars(args))

    step = 0
    for epoch in range(max_epochs):
        model.train()
        for batch_idx, (images, labels) in enumerate(train_loader):
            if limit is not None and batch_idx >= limit:
                break
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()  # these three act only on the batch that ends an accumulation
                scheduler.step()
                optimizer.zero_grad()
            step += int(accelerator.sync_gradients)
        val_loss, val_acc = evaluate(accelerator, model, val_loader, limit)
        accelerator.log(
            {"train/loss": loss.item(), "val/loss": val_loss, "val/acc": val_acc, "epoch": epoch},
            step=step,
        )
        accelerator.print(
            f"epoch {epoch + 1}/{max_epochs}  val/loss={val_loss:.4f}  val/acc={val_acc:.4f}"
        )

    test_loss, test_acc = evaluate(accelerator, model, test_loader, limit)
    accelerator.log({"test/loss": test_loss, "test/acc": test_acc}, step=step)
    log_dir = accelerator.get_tracker("csv").log_dir if accelerator.is_main_process else None
    accelerator.end_training()  # writes metrics.csv
    return test_acc, None if log_dir is None else os.path.join(log_dir, "metrics.csv")


def main(argv: Sequence[str] | None = None) -> int:
    """Train, evaluate on validation each epoch and on test at the end; 1 if below the bar."""
    args = parse_args(argv)
    with torch_threads(args.num_threads):
        test_acc, metrics_csv = train(args)
    if metrics_csv is None:  # not the main process: it has printed nothing and reports nothing
        return 0
    print(f"test accuracy: {test_acc:.4f}")
    print(f"metrics: {metrics_csv}")
    if args.fast or test_acc >= args.min_accuracy:
        return 0
    print(
        f"FAILED: test accuracy {test_acc:.4f} is below --min-accuracy {args.min_accuracy}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
