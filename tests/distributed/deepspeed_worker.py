"""DeepSpeed checks inside one real 2-process job (torchrun, gloo on CPU); facts to OUT/rank<r>.json.

Usage: ``torchrun --standalone --nproc_per_node 2 deepspeed_worker.py OUT_DIR``. One launch runs
every scenario, because a start costs seconds and DeepSpeed's first comm-op build a minute:
ZeRO 0-3 against DDP (plain, and with accumulation + clipping), bf16, save -> resume, the weights
the pytest side compares with the consolidated file, evaluation from a checkpoint with no engine,
a weights-only ZeRO-3 checkpoint, and the Accelerator path. Rank 0 also writes reference weights.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
import traceback
from typing import Any

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import trainer
from tests.distributed.ddp_worker import regression
from tests.distributed.launch import flip_byte
from trainer import Accelerator
from trainer.callbacks import Callback
from trainer.strategies import DeepSpeedStrategy
from trainer.strategies.deepspeed import DeepSpeedModel

ACCUMULATE_AND_CLIP = {"accumulate_grad_batches": 2, "gradient_clip_val": 0.5}


class Net(trainer.TrainModule):
    """4 -> 8 -> 1 MLP with SGD + momentum, built in configure_model from seed 0 on every rank."""

    def __init__(self) -> None:
        super().__init__()
        self.net: torch.nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is None:
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
            )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Recorder(Callback):
    """What the loop sees while training: the prepared model's type and each step's loss."""

    def __init__(self) -> None:
        self.model_type = ""
        self.losses: list[float] = []

    def on_train_start(self, trainer, module) -> None:
        self.model_type = type(trainer.model).__name__

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def fit(strategy: Any, ckpt_path: str | None = None, **kwargs: Any) -> tuple[Any, Net, Recorder]:
    recorder = Recorder()
    options: dict[str, Any] = dict(
        accelerator="cpu", max_epochs=2, seed=0, enable_progress_bar=False, callbacks=[recorder],
        enable_model_summary=False, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    options.update(kwargs)
    run = trainer.Trainer(strategy=strategy, **options)
    module = Net()
    run.fit(module, DataLoader(regression(), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    return run, module, recorder


def full_weights(run: trainer.Trainer, module: Net) -> dict[str, torch.Tensor]:
    """Full (ZeRO-3: gathered) weights as float32; a collective, so every rank calls it."""
    state = run.strategy.module_state_dict(module, full=True)
    return {k: v.detach().float().clone().contiguous() for k, v in state.items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise AssertionError(f"different keys: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def val_loss(weights: dict[str, torch.Tensor]) -> float:
    """The validation loss of ``weights`` on regression(32), computed in this process."""
    module = Net()
    module.configure_model()
    module.load_state_dict(weights)
    x, y = regression(32).tensors
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(module.net(x), y))


def parity(facts: dict[str, Any], kept: dict[str, Any]) -> None:
    """ZeRO 1-3 (+ CPU offload) against DDP, plain; ZeRO 0-3 with accumulation + clipping."""
    plain = {f"zero{stage}": {"stage": stage} for stage in (1, 2, 3)}
    plain["zero2offload"] = {"stage": 2, "offload_optimizer": True}
    plain["zero3offload"] = {"stage": 3, "offload_optimizer": True, "offload_parameters": True}
    clipped = {f"zero{stage}": {"stage": stage} for stage in (0, 1, 2, 3)}
    for label, options, variants in (("plain", {}, plain), ("accum_clip", ACCUMULATE_AND_CLIP, clipped)):  # fmt: skip
        reference_run, reference, _ = fit("ddp", **options)
        expected = full_weights(reference_run, reference)
        kept[f"ddp_{label}"] = expected
        facts[f"ddp_{label}_steps"] = reference_run.global_step
        for name, arguments in variants.items():
            start = time.perf_counter()
            run, module, recorder = fit(DeepSpeedStrategy(**arguments), **options)
            weights = full_weights(run, module)
            kept[f"{name}_{label}"] = weights
            facts[f"{name}_{label}_diff"] = max_diff(weights, expected)
            facts[f"{name}_{label}_steps"] = [run.global_step, run.strategy.engine.global_steps]
            facts[f"{name}_{label}_seconds"] = time.perf_counter() - start
            facts[f"{name}_{label}_model_type"] = recorder.model_type
    facts["distributed_type"] = str(run.accelerator.distributed_type)


def bf16(facts: dict[str, Any], kept: dict[str, Any]) -> None:
    """bf16-mixed on ZeRO-3 trains with no cast in the step; weights stay near fp32 DDP's."""
    run, module, recorder = fit(
        DeepSpeedStrategy(stage=3), precision="bf16-mixed"
    )  # no cast in Net
    weights = full_weights(run, module)
    kept["zero3_bf16"] = weights
    facts["bf16_param_dtype"] = str(next(iter(run.strategy.engine.module.parameters())).dtype)
    initial = Net()
    initial.configure_model()
    facts["bf16_val_loss"] = {
        "initial": val_loss(initial.state_dict()),
        "bf16": val_loss(weights),
        "fp32_ddp": val_loss(kept["ddp_plain"]),
    }
    facts["bf16_diff_vs_fp32_ddp"] = max_diff(weights, kept["ddp_plain"])
    facts["bf16_model_type"] = recorder.model_type


def resume(facts: dict[str, Any], kept: dict[str, Any], rank: int, out: str) -> None:
    """Save at step 5, resume in a new Trainer: equal to the uninterrupted run of the same setup."""
    for stage, precision, whole in ((2, "32-true", "zero2_plain"), (3, "bf16-mixed", "zero3_bf16")):
        name = f"zero{stage}"
        part_run, part, _ = fit(DeepSpeedStrategy(stage=stage), precision=precision, max_steps=5)
        at_save = full_weights(part_run, part)
        directory = os.path.join(out, f"ck_{name}")
        part_run.save_checkpoint(directory)
        if rank == 0:
            save_file(at_save, os.path.join(out, f"{name}_at_save.safetensors"))
        if stage == 2:  # a folder that cannot be created: refused on both ranks, none left waiting
            try:
                part_run.save_checkpoint(os.path.join(out, "a_file", "ck"))
                facts["uncreatable_refusal"] = None
            except trainer.CheckpointError as err:
                facts["uncreatable_refusal"] = str(err)
            tampered(facts, part_run.strategy, rank, out)
        resumed_run, resumed, _ = fit(
            DeepSpeedStrategy(stage=stage), directory, precision=precision
        )
        facts[f"{name}_resume_diff"] = max_diff(full_weights(resumed_run, resumed), kept[whole])
        facts[f"{name}_resume_steps"] = [
            resumed_run.global_step,
            resumed_run.strategy.engine.global_steps,
        ]
        # validate() after fit on the same Trainer runs through the fitted engine.
        after_fit = resumed_run.validate(resumed, DataLoader(regression(32), batch_size=4))
        facts[f"{name}_validate_after_fit"] = [
            after_fit[0]["val/loss"],
            val_loss(full_weights(resumed_run, resumed)),
        ]
        # validate(ckpt_path=...) on a fresh Trainer has no optimizer, so no engine: the weights
        # are consolidated from the shards (fp32 masters) and the module runs as it is.
        evaluator = trainer.Trainer(
            strategy=DeepSpeedStrategy(stage=stage), accelerator="cpu", logger=False,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        )  # fmt: skip
        result = evaluator.validate(
            Net(), DataLoader(regression(32), batch_size=4), ckpt_path=directory
        )
        facts[f"{name}_validate_from_ckpt"] = [result[0]["val/loss"], val_loss(at_save)]
    if rank == 0:  # `trainer checkpoint consolidate` in this process (DeepSpeed is imported)
        from trainer.cli.main import main as trainer_cli

        facts["consolidate_zero2_status"] = trainer_cli(
            ["checkpoint", "consolidate", os.path.join(out, "ck_zero2"), os.path.join(out, "zero2.safetensors")]
        )  # fmt: skip
    # A weights-only checkpoint of ZeRO-3 is one gathered model.safetensors.
    weights_run, module, _ = fit(DeepSpeedStrategy(stage=3), max_steps=2)
    weights_run.save_checkpoint(os.path.join(out, "weights_only"), weights_only=True)
    gathered = full_weights(weights_run, module)
    if rank == 0:
        save_file(gathered, os.path.join(out, "weights_only_expected.safetensors"))


def accelerator_path(facts: dict[str, Any]) -> None:
    """Accelerator(strategy=DeepSpeedStrategy(stage=2)): prepare, accumulate, backward, step."""
    results = {}
    for name, strategy in (("ddp", "ddp"), ("deepspeed", DeepSpeedStrategy(stage=2))):
        accelerator = Accelerator(cpu=True, strategy=strategy, gradient_accumulation_steps=2)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer, loader = accelerator.prepare(
            model, optimizer, DataLoader(regression(), batch_size=4)
        )
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        results[name] = {
            k: v.detach().float().clone() for k, v in accelerator.get_state_dict(model).items()
        }
    facts["accelerator_model_type"] = type(model).__name__
    facts["accelerator_engine_type"] = type(model.engine).__name__
    facts["accelerator_engine_steps"] = model.engine.global_steps
    facts["accelerator_optimizer_type"] = type(optimizer.optimizer).__name__
    facts["accelerator_diff"] = max_diff(results["deepspeed"], results["ddp"])
    facts["accelerator_is_wrapper"] = isinstance(model, DeepSpeedModel)


def tampered(facts: dict[str, Any], strategy: DeepSpeedStrategy, rank: int, out: str) -> None:
    """A flipped byte in either rank's ZeRO shard is refused on both ranks before DeepSpeed
    reads it, though each rank hashes only its share (trainer.checkpoint.rank_hashing).
    ``strategy``: a fitted run's, its process group still up (no fit is made to fail here)."""
    from trainer.checkpoint.manifest import read_manifest
    from trainer.checkpoint.rank_hashing import verified_share

    source = os.path.join(out, "ck_zero2")
    files = read_manifest(source)["files"]
    shards = sorted(n for n in files if n.startswith("deepspeed/"))
    facts["ds_shards"] = shards
    facts["ds_my_share"] = sorted(set(shards) - verified_share(strategy, files, "deepspeed"))
    flipped = [sorted(n for n in shards if f"zero_pp_rank_{r}_" in n)[0] for r in range(2)]
    if rank == 0:
        for index, name in enumerate(flipped):
            copy = os.path.join(out, f"tampered_{index}")
            shutil.copytree(source, copy)
            flip_byte(os.path.join(copy, name), -10)
    strategy.barrier()
    facts["ds_refusals"] = {}
    for index, name in enumerate(flipped):
        try:
            strategy.load_checkpoint(os.path.join(out, f"tampered_{index}"))
            facts["ds_refusals"][name] = None
        except trainer.CheckpointError as err:
            facts["ds_refusals"][name] = str(err)


def main(out: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401  (imported first so that freezing covers its objects)

    gc.freeze()  # otherwise each gc.collect() (DDP's teardown) walks DeepSpeed's objects: ~1 s
    rank = int(os.environ["RANK"])
    if rank == 0:  # a file where a checkpoint folder's parent would go (used after the first fits)
        open(os.path.join(out, "a_file"), "w").close()
    facts: dict[str, Any] = {"world_size": int(os.environ["WORLD_SIZE"])}
    kept: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name, scenario in (
        ("parity", lambda: parity(facts, kept)),
        ("bf16", lambda: bf16(facts, kept)),
        ("resume", lambda: resume(facts, kept, rank, out)),
        ("accelerator", lambda: accelerator_path(facts)),
    ):
        start = time.perf_counter()
        scenario()
        timings[name] = time.perf_counter() - start
    facts["timings"] = timings
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception:
        traceback.print_exc()
        raise
