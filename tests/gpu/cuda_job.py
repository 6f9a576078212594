"""Multi-process CUDA checks for the GPU machine (tests/gpu/test_cuda_distributed.py runs them).

``python -m torch.distributed.run --standalone --nproc_per_node N cuda_job.py MODE OUT``:

- ``syncbn`` / ``plain-bn`` (2 processes sharing one GPU over gloo, which runs CUDA tensors and
  which torch's SyncBatchNorm supports): a BatchNorm network, batch 4 per process, unshuffled, 2
  epochs, ``sync_batchnorm=True`` (``syncbn``) or False (``plain-bn``). Process 0 writes the final
  state dict (parameters and running statistics) to OUT/MODE.safetensors.
- ``fsdp`` (1 process, NCCL): FSDP2 in bf16-mixed with background sharded checkpoints
  (``AsyncCheckpointIO``) every 3 steps; the run to step 10, then a run stopped at step 6 and
  resumed from its last checkpoint. Writes OUT/fsdp.json: whether the resumed weights equal the
  uninterrupted ones, the parameter dtype/device seen in the step, and the checkpoints kept.
- ``deepspeed`` (1 process, NCCL): the same scenario for DeepSpeed ZeRO-2 and ZeRO-3 in bf16 and
  ZeRO-2 in fp16 (DeepSpeed's own loss scaling) with background saves (the engine's state copied
  off the GPU at the step boundary), plus a synchronous run to step 10 for each. Writes
  OUT/deepspeed.json: per run kind, whether the background run ends equal to the synchronous one
  and the resumed run to the uninterrupted one.
- ``megatron`` (1 process, NCCL, tensor-parallel size 1): the same scenario for MegatronStrategy
  (ColumnParallelLinear / RowParallelLinear, the CUDA RNG tracker) in bf16. Writes
  OUT/megatron.json.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.callbacks import ModelCheckpoint
from trainer.plugins import AsyncCheckpointIO
from trainer.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy


def regression(n: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, (x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])).tanh())


class BatchNormNet(trainer.TrainModule):
    """Linear -> BatchNorm1d -> ReLU -> Linear, SGD with momentum."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16),
            torch.nn.BatchNorm1d(16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 1),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class ShardedNet(trainer.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 64)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.out = torch.nn.Linear(64, 1)
        self.seen: dict[str, str] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        hidden = self.blocks(self.inp(x))
        self.seen = {"activation_dtype": str(hidden.dtype), "input_device": x.device.type}
        # DeepSpeed in bf16 hands the step a bf16 batch (targets too), as Lightning's does.
        return torch.nn.functional.mse_loss(self.out(hidden).float(), y.float())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def quiet(**options) -> trainer.Trainer:
    defaults = dict(
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, num_sanity_val_steps=0, seed=0,
    )  # fmt: skip
    defaults.update(options)
    return trainer.Trainer(**defaults)


def batchnorm_run(out: Path, sync: bool) -> None:
    torch.manual_seed(0)
    module = BatchNormNet()
    strategy = DDPStrategy("cuda", process_group_backend="gloo")
    fit = quiet(strategy=strategy, sync_batchnorm=sync, max_epochs=2)
    fit.fit(module, DataLoader(regression(64), batch_size=4))
    norms = (torch.nn.BatchNorm1d, torch.nn.SyncBatchNorm)
    kinds = sorted({type(m).__name__ for m in module.modules() if isinstance(m, norms)})
    if fit.global_rank == 0:
        state = {
            k.removeprefix("module."): v.detach().cpu().contiguous()
            for k, v in module.state_dict().items()
        }
        save_file(state, str(out / f"{'syncbn' if sync else 'plain-bn'}.safetensors"))
        (out / f"{'syncbn' if sync else 'plain-bn'}.json").write_text(json.dumps({"kinds": kinds}))


def fsdp_run(out: Path) -> None:
    def fit_to(max_steps: int, root: Path, ckpt_path: str | None = None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        module = ShardedNet()
        strategy = FSDPStrategy("cuda", auto_wrap_policy={"Block"})
        checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1)
        fit = quiet(
            strategy=strategy, precision="bf16-mixed", max_steps=max_steps, max_epochs=10,
            enable_checkpointing=True, callbacks=[checkpoints], plugins=[AsyncCheckpointIO()],
            default_root_dir=str(root),
        )  # fmt: skip
        fit.fit(module, DataLoader(regression(64), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        facts.update(module.seen)
        facts["param_dtype"] = str(next(module.parameters()).dtype)
        facts["param_device"] = next(module.parameters()).device.type
        return {
            k: v.detach().float().cpu() for k, v in fit.accelerator.get_state_dict(module).items()
        }

    facts: dict[str, object] = {}
    full = fit_to(10, out / "full")
    fit_to(6, out / "part")
    facts["kept"] = sorted(p.name for p in (out / "part").iterdir())
    resumed = fit_to(10, out / "resumed", ckpt_path=str(out / "part" / "epoch=0-step=6"))
    facts["max_diff"] = max(float((full[k] - resumed[k]).abs().max()) for k in full)
    facts["resume_equal"] = all(torch.equal(full[k], resumed[k]) for k in full)
    (out / "fsdp.json").write_text(json.dumps(facts))


def deepspeed_run(out: Path) -> None:
    def fit_to(
        stage: int,
        precision: str,
        max_steps: int,
        root: Path,
        is_async: bool = True,
        ckpt_path: str | None = None,
    ) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        module = ShardedNet()
        checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1)
        fit = quiet(
            strategy=DeepSpeedStrategy(stage=stage, accelerator="cuda"), precision=precision,
            max_steps=max_steps, max_epochs=10, enable_checkpointing=True, callbacks=[checkpoints],
            plugins=[AsyncCheckpointIO()] if is_async else None, default_root_dir=str(root),
        )  # fmt: skip
        fit.fit(module, DataLoader(regression(64), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        run_facts.update(module.seen)
        state = fit.strategy.module_state_dict(module, full=True)  # ZeRO-3: a collective
        return {k: v.detach().float().cpu().clone() for k, v in state.items()}

    facts: dict[str, object] = {}
    for stage, precision in ((2, "bf16-mixed"), (3, "bf16-mixed"), (2, "16-mixed")):
        run_facts: dict[str, object] = {}
        name = f"zero{stage}" + ("-fp16" if precision == "16-mixed" else "")
        facts[name] = run_facts
        compare_runs(functools.partial(fit_to, stage, precision), out / name, run_facts)
    (out / "deepspeed.json").write_text(json.dumps(facts))


def compare_runs(fit_to: Callable[..., dict[str, torch.Tensor]], base: Path, facts: dict) -> None:
    """Synchronous and background runs to step 10; one stopped at 6 and resumed from its save."""
    sync = fit_to(10, base / "sync", is_async=False)
    full = fit_to(10, base / "full")
    fit_to(6, base / "part")
    facts["kept"] = sorted(p.name for p in (base / "part").iterdir())
    resumed = fit_to(10, base / "resumed", ckpt_path=str(base / "part" / "epoch=0-step=6"))
    facts["finite"] = all(bool(torch.isfinite(v).all()) for v in full.values())
    facts["async_equals_sync"] = all(torch.equal(sync[k], full[k]) for k in sync)
    facts["resume_equal"] = all(torch.equal(full[k], resumed[k]) for k in full)
    facts["max_diff"] = max(float((full[k] - resumed[k]).abs().max()) for k in full)


def megatron_run(out: Path) -> None:
    from tests.distributed.megatron_worker import MegatronNet
    from trainer.strategies import MegatronStrategy

    def fit_to(
        max_steps: int, root: Path, is_async: bool = True, ckpt_path: str | None = None
    ) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        module = MegatronNet()
        checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1)
        fit = quiet(
            strategy=MegatronStrategy("cuda", tensor_model_parallel_size=1),
            precision="bf16-mixed", max_steps=max_steps, max_epochs=10,
            enable_checkpointing=True, callbacks=[checkpoints],
            plugins=[AsyncCheckpointIO()] if is_async else None, default_root_dir=str(root),
        )  # fmt: skip
        fit.fit(module, DataLoader(regression(64), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        facts["param_device"] = next(module.parameters()).device.type
        state = fit.strategy.module_state_dict(module, full=True)
        return {k: v.detach().float().cpu().clone() for k, v in state.items()}

    facts: dict[str, object] = {}
    compare_runs(fit_to, out / "megatron", facts)
    (out / "megatron.json").write_text(json.dumps(facts))


def main(mode: str, out: str) -> None:
    folder = Path(out)
    if mode in ("syncbn", "plain-bn"):
        batchnorm_run(folder, sync=mode == "syncbn")
    elif mode == "fsdp":
        fsdp_run(folder)
    elif mode == "deepspeed":
        deepspeed_run(folder)
    elif mode == "megatron":
        megatron_run(folder)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
