"""A 2-process DeepSpeed job (torchrun, gloo on CPU) with or without background checkpoint saves.

``python async_checkpoint_deepspeed_worker.py ROOT MODE [OP N]``: deepspeed_worker's ``Net``
(4 -> 8 -> 1, SGD + momentum) on 64 samples, batch 4 per process (8 steps an epoch), 2 epochs,
``ModelCheckpoint(every_n_train_steps=3, save_top_k=2, monitor="step", mode="max",
save_last=True)``; ``plugins=[AsyncCheckpointIO()]`` unless synchronous. In a background run each
write on the writer thread starts SLOW_S late (our writer held back; DeepSpeed and
torch.distributed are the real ones), so training goes on for steps while a save is in flight.
One launch runs several fits, since DeepSpeed's start costs seconds. MODE:

- "main": for ZeRO-2 and ZeRO-3, a synchronous and a background run to the end, into
  ROOT/zero<S>-sync and ROOT/zero<S>-async (each also saves a weights-only checkpoint at step 4
  to ROOT/zero<S>-weights-<sync|async>, `WeightsOnlyAt`); ZeRO-2 in the background stopped after step 7 and
  resumed with ``fit(ckpt_path="last")`` into ROOT/zero2-resume; then the failures: "blocked",
  a save into ROOT/blocker/ck where ROOT/blocker is a file (the folder cannot be created), and
  "disk-full", a save at step 9 into ROOT/zero2-disk/checkpoints/full-disk after which process 0
  may write no file over 200 bytes (RLIMIT_FSIZE, set once the save is staged), so its DeepSpeed
  files cannot be written in the background and process 1's can; last, the Accelerator's
  ``save_state(checkpoint_io=AsyncCheckpointIO())`` (`accelerator_save_state`).
- "kill": ZeRO-2 in the background into ROOT/zero2-kill; from the save at step 9 on, process 0
  SIGKILLs process 1 and then itself at the N-th filesystem operation OP ("fsync", "rename")
  made off the training thread.
- "resume": ``fit(ckpt_path="last")`` into ROOT/zero2-kill, to the end.

Each run writes ROOT/<run>/rank<R>.json: what its ModelCheckpoint tracks, the checkpoint folder's
entries right after ``fit`` returned, the plugin's counters and the steps each background write
spanned; a failed run writes the error instead. Process 0 writes the final full weights to
ROOT/<run>/final.safetensors.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import trainer
import trainer.plugins.async_engine as async_engine
from tests.distributed.async_checkpoint_fsdp_worker import KillBoth
from tests.distributed.ddp_worker import regression
from tests.distributed.deepspeed_worker import Net
from trainer import Accelerator
from trainer.callbacks import Callback, ModelCheckpoint
from trainer.errors import CheckpointError
from trainer.plugins import AsyncCheckpointIO
from trainer.strategies import DeepSpeedStrategy

SLOW_S = 0.1
KILL_STEP = 9
BLOCKED_STEP = 5


class Spans:
    """Holds each background write SLOW_S back; notes the steps it spanned (begun, ended)."""

    def __init__(self) -> None:
        self.run: trainer.Trainer | None = None
        self.spans: list[tuple[int, int]] = []
        write = async_engine.EngineWriter.write

        def late(writer: Any, index: int) -> None:
            begun = self.run.global_step if self.run is not None else -1
            time.sleep(SLOW_S)
            write(writer, index)
            self.spans.append((begun, self.run.global_step if self.run is not None else -1))

        async_engine.EngineWriter.write = late  # type: ignore[method-assign]


class Arm(Callback):
    """Before ModelCheckpoint: at KILL_STEP, completes the earlier saves, then arms (rank 0)."""

    def __init__(self, killer: KillBoth) -> None:
        self.killer = killer

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == KILL_STEP:
            trainer.checkpoint_io.wait()
            self.killer.is_armed = True


class SaveAt(Callback):
    """Before ModelCheckpoint: at ``step``, once earlier saves are complete, saves to ``path``;
    with ``file_limit``, process 0 may then write no file over that many bytes (a full disk on
    its machine) until the background write has ended on this process."""

    def __init__(self, step: int, path: str, file_limit: int | None = None) -> None:
        self.step, self.path, self.file_limit = step, path, file_limit

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        trainer.checkpoint_io.wait()
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        try:
            pending = trainer.save_checkpoint(self.path)
            # Staged: DeepSpeed copied its recovery scripts already, its own files wait for the
            # writer thread (held back SLOW_S), which now meets the limit.
            if self.file_limit is not None and trainer.global_rank == 0:
                resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_limit, hard))
            deadline = time.monotonic() + 60
            while pending is not None and not pending.has_ended and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


class WeightsOnlyAt(Callback):
    """At ``step``: a weights-only checkpoint to ``path`` (ZeRO-3: gathered at the boundary; in
    the background, written by process 0 on the writer thread, and process 0 keeps the weights of
    that step in ``path``.safetensors to compare)."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        pending = trainer.save_checkpoint(self.path, weights_only=True)
        state = trainer.strategy.module_state_dict(module, full=True)  # a collective
        if trainer.global_rank == 0 and pending is not None:
            weights = {k: v.detach().clone().contiguous() for k, v in state.items()}
            save_file(weights, self.path + ".safetensors")


def fit(
    root: str,
    name: str,
    stage: int,
    *,
    is_async: bool = True,
    spans: Spans | None = None,
    callbacks: tuple[Callback, ...] = (),
    max_steps: int = -1,
    ckpt_path: str | None = None,
) -> None:
    """One fit into ROOT/name; its facts (or its error) to ROOT/name/rank<R>.json."""
    run_root = os.path.join(root, name)
    os.makedirs(run_root, exist_ok=True)
    rank = int(os.environ["RANK"])
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(run_root, "checkpoints"), every_n_train_steps=3, save_top_k=2,
        monitor="step", mode="max", save_last=True,
    )  # fmt: skip
    io = AsyncCheckpointIO() if is_async else None
    run = trainer.Trainer(
        max_epochs=2, max_steps=max_steps, seed=0, accelerator="cpu",
        strategy=DeepSpeedStrategy(stage=stage), callbacks=[*callbacks, checkpoint],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=run_root, plugins=[io] if io else None,
    )  # fmt: skip
    if spans is not None:
        spans.run, spans.spans = run, []
    module = Net()
    facts: dict[str, Any] = {}
    try:
        loader = DataLoader(regression(64), batch_size=4, shuffle=True)
        run.fit(module, loader, ckpt_path=ckpt_path)
    except CheckpointError as err:
        facts["error"] = str(err)
    else:
        facts = {
            "entries": sorted(os.listdir(checkpoint.dirpath)),  # the moment fit returned
            "best_model_path": os.path.basename(checkpoint.best_model_path),
            "last_model_path": os.path.basename(checkpoint.last_model_path),
            "global_step": run.global_step,
            "spans": list(spans.spans) if spans is not None else [],
            "save_count": io.save_count if io is not None else 0,
            "total_wait_s": io.total_wait_s if io is not None else 0.0,
        }
        state = run.strategy.module_state_dict(module, full=True)  # ZeRO-3: a collective
        if rank == 0:
            weights = {k: v.detach().float().clone().contiguous() for k, v in state.items()}
            save_file(weights, os.path.join(run_root, "final.safetensors"))
    with open(os.path.join(run_root, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    dist.barrier()


def accelerator_save_state(root: str) -> None:
    """``Accelerator.save_state(checkpoint_io=...)`` at step 3 of 8 (ZeRO-2), training on while
    it is written; then ``load_state`` gives back the weights of step 3. Facts to
    ROOT/accelerator/rank<R>.json."""
    accelerator = Accelerator(cpu=True, strategy=DeepSpeedStrategy(stage=2))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(regression(64), batch_size=4)
    )
    io = AsyncCheckpointIO()
    folder = os.path.join(root, "accelerator", "state")

    def weights() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}

    for step, (x, y) in enumerate(loader):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if step == 3:
            accelerator.save_state(folder, checkpoint_io=io)
            at_save = weights()
            is_in_flight = not os.path.exists(folder)  # written SLOW_S later, training goes on
    io.wait()
    at_end = weights()
    accelerator.load_state(folder)
    loaded = weights()
    facts = {
        "save_count": io.save_count,
        "is_in_flight": is_in_flight,
        "loaded_is_step_3": all(torch.equal(loaded[k], at_save[k]) for k in at_save),
        "trained_on": any(not torch.equal(at_end[k], at_save[k]) for k in at_save),
    }
    rank = int(os.environ["RANK"])
    with open(os.path.join(root, "accelerator", f"rank{rank}.json"), "w") as file:
        json.dump(facts, file)
    io.close()


def main(root: str, mode: str, *rest: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401  (imported before freezing: see deepspeed_worker.py)

    gc.freeze()
    rank = int(os.environ["RANK"])
    with open(os.path.join(root, f"pid-{rank}"), "w") as file:
        file.write(str(os.getpid()))
    spans = Spans()
    if mode == "main":
        for stage in (2, 3):
            for kind, is_async in (("sync", False), ("async", True)):
                weights_only = WeightsOnlyAt(4, os.path.join(root, f"zero{stage}-weights-{kind}"))
                name = f"zero{stage}-{kind}"
                fit(root, name, stage, is_async=is_async, spans=spans, callbacks=(weights_only,))
        fit(root, "zero2-resume", 2, spans=spans, max_steps=7)
        fit(root, "zero2-resume", 2, spans=spans, ckpt_path="last")
        blocked = SaveAt(BLOCKED_STEP, os.path.join(root, "blocker", "ck"))
        fit(root, "zero2-blocked", 2, callbacks=(blocked,))
        full = os.path.join(root, "zero2-disk", "checkpoints", "full-disk")
        disk_full = SaveAt(KILL_STEP, full, file_limit=200)
        fit(root, "zero2-disk", 2, spans=spans, callbacks=(disk_full,))
        accelerator_save_state(root)
    elif mode == "kill":
        killer = KillBoth(root, rest[0], int(rest[1]))
        if rank == 0:
            killer.install()
        fit(root, "zero2-kill", 2, spans=spans, callbacks=(Arm(killer),))
    elif mode == "resume":
        fit(root, "zero2-kill", 2, spans=spans, ckpt_path="last")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
