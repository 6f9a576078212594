"""MegatronStrategy checks inside one real 2-process job (torchrun, gloo on CPU, TP=2, DP=1).

Writes each rank's facts to OUT/rank<r>.json, and on rank 0 the gathered initial and final
weights (OUT/initial.safetensors, OUT/final.safetensors) for the dense reference that
tests/distributed/test_megatron.py trains in one process. OUT/sharded is a mid-run checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")

LR = 0.01
CLIP = 0.5


def regression(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, torch.tanh(x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])))


def loader(batch_size: int = 4) -> DataLoader:
    return DataLoader(regression(), batch_size=batch_size, shuffle=False)


class DenseNet(trainer.TrainModule):
    """The dense model the tensor-parallel pair computes: Linear(4, 8) -> tanh -> Linear(8, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.col = torch.nn.Linear(4, 8)
        self.row = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.row(torch.tanh(self.col(x))), y)
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR)


class MegatronNet(trainer.TrainModule):
    """ColumnParallelLinear(4, 8, gather_output=False) -> tanh -> RowParallelLinear(8, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sums: list[float] = []
        self.initial: dict[str, torch.Tensor] = {}
        self.wrapper = ""

    def build(self, config: Any) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        init = torch.nn.init.xavier_normal_
        self.col = ColumnParallelLinear(
            4, 8, config=config, init_method=init, bias=True, gather_output=False
        )
        self.row = RowParallelLinear(
            8, 1, config=config, init_method=init, bias=True, input_is_parallel=True,
            skip_bias_add=False,
        )  # fmt: skip

    def configure_model(self) -> None:
        if not hasattr(self, "col"):
            self.build(self.trainer.strategy.model_parallel_config())

    def on_fit_start(self) -> None:
        self.initial = gathered(self.trainer, self)
        self.wrapper = type(self.trainer._wrapped_model).__name__  # DDP when DP > 1

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batch_sums.append(float(x.sum()))
        hidden, _ = self.col(x)
        out, _ = self.row(torch.tanh(hidden))
        loss = torch.nn.functional.mse_loss(out, y)
        self.log("train/loss", loss, sync_dist=True)
        # Summed over the data-parallel group: 64 per epoch, not 64 x tensor_parallel_size.
        self.log(
            "samples_seen",
            float(len(x)),
            on_step=False,
            on_epoch=True,
            reduce_fx="sum",
            sync_dist=True,
        )
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR)


def gathered(fit: trainer.Trainer, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full weights (tensor-parallel shards concatenated), on every rank."""
    state = fit.strategy.module_state_dict(module, full=True)
    return {k: v.detach().clone() for k, v in state.items()}


def megatron(tensor_model_parallel_size: int = 2) -> Any:
    from trainer.strategies import MegatronStrategy

    return MegatronStrategy("cpu", tensor_model_parallel_size=tensor_model_parallel_size)


def quiet(**kwargs: Any) -> trainer.Trainer:
    options: dict[str, Any] = dict(
        strategy=megatron(2), accelerator="cpu",
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, num_sanity_val_steps=0, gradient_clip_val=CLIP, seed=0,
    )  # fmt: skip
    options.update(kwargs)
    return trainer.Trainer(**options)


def save_rank0(out: str, name: str, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    if int(os.environ["RANK"]) == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, name))


def main(out: str) -> None:
    """The CPU checks (TP=2, DP=1)."""
    rank = int(os.environ["RANK"])
    facts: dict[str, Any] = {}

    # 1. Parity run: the Trainer's loop over the Column -> Row pair, clipped, 2 epochs.
    torch.manual_seed(0)
    module = MegatronNet()
    fit = quiet(max_epochs=2)
    strategy = fit.strategy
    facts["sampler_kwargs"] = strategy.distributed_sampler_kwargs
    facts["tp_rank"] = strategy.tensor_model_parallel_rank
    facts["data_parallel_size"] = strategy.data_parallel_size
    facts["distributed_type"] = str(fit.accelerator.distributed_type)
    fit.fit(module, loader())
    facts["num_training_batches"] = fit.num_training_batches
    facts["global_step"] = fit.global_step
    facts["col_weight_local_shape"] = list(module.col.weight.shape)
    facts["train_loss"] = float(fit.callback_metrics["train/loss"])
    facts["samples_seen"] = float(fit.callback_metrics["samples_seen"])
    facts["batch_sums_agree"] = (
        len({json.dumps(s) for s in strategy.all_gather_object(module.batch_sums)}) == 1
    )
    final = gathered(fit, module)
    save_rank0(out, "initial.safetensors", module.initial)
    save_rank0(out, "final.safetensors", final)

    # 2. Collectives: data reductions over the data-parallel group (size 1), flags over all.
    facts["sum_of_ones"] = float(strategy.all_reduce(torch.tensor(1.0), "sum"))
    facts["max_of_ranks"] = float(strategy.all_reduce(torch.tensor(float(rank)), "max"))
    facts["all_gather_rows"] = int(strategy.all_gather(torch.tensor([1.0])).shape[0])

    # 3. A sharded checkpoint mid-epoch, resumed from other initial weights: exact.
    torch.manual_seed(0)
    first = MegatronNet()
    part = quiet(max_epochs=2, max_steps=5)
    part.fit(first, loader())
    step5 = gathered(part, first)
    save_rank0(out, "step5.safetensors", step5)
    part.save_checkpoint(os.path.join(out, "sharded"))
    torch.manual_seed(3)
    resumed = MegatronNet()
    again = quiet(max_epochs=2)
    again.fit(resumed, loader(), ckpt_path=os.path.join(out, "sharded"))
    resumed_final = gathered(again, resumed)
    facts["resume_equal"] = all(torch.equal(resumed_final[k], final[k]) for k in final)
    facts["resume_global_step"] = again.global_step

    # 4. Full (dense) weights load into a tensor-parallel module: each rank takes its slice.
    fresh = MegatronNet()
    fresh.build(again.strategy.model_parallel_config())
    again.strategy.load_module_state_dict(fresh, final)
    facts["full_load_local_equal"] = all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), resumed.parameters(), strict=True)
    )

    # 5. Clipping counts each shard once and each replicated parameter once: with every
    # gradient 2.0 over the 8*4 + 8 + 1*8 + 1 = 49 full elements, the 2-norm is 2 * 7 = 14.
    for param in resumed.parameters():
        param.grad = torch.full_like(param, 2.0)
    facts["clip_norm_2"] = float(again.strategy.clip_grad_norm_(None, resumed.parameters(), 7.0))
    facts["clipped_grad"] = float(resumed.col.weight.grad[0, 0])
    facts["clip_norm_inf"] = float(
        again.strategy.clip_grad_norm_(None, resumed.parameters(), 100.0, norm_type=float("inf"))
    )

    # 6. A dense single-process checkpoint (written by the test before the launch) resumes at
    # TP=2: weights and Adam states are sliced to each rank's shard.
    torch.manual_seed(5)
    from_dense = MegatronNet()
    dense_resume = quiet(max_epochs=2)
    dense_resume.fit(from_dense, loader(), ckpt_path=os.path.join(out, "dense5"))
    save_rank0(out, "from_dense.safetensors", gathered(dense_resume, from_dense))

    # 7. The TP=2 checkpoint loads at TP=1 (DP=2): DCP reshards the DTensor slices. (From here
    # on megatron's groups are TP=1: the TP=2 trainers above must not be used any more.)
    reshard = quiet(strategy=megatron(1), max_epochs=2, max_steps=5)
    torch.manual_seed(3)
    reloaded = MegatronNet()
    reshard.fit(reloaded, loader(), ckpt_path=os.path.join(out, "sharded"))
    facts["reshard_equal"] = all(torch.equal(reloaded.state_dict()[k], step5[k]) for k in step5)

    # 8. TP=1 x DP=2: DDP over megatron's data-parallel group; each rank half of the data.
    torch.manual_seed(0)
    replicas = MegatronNet()
    data_parallel = quiet(strategy=megatron(1), max_epochs=2)
    data_parallel.fit(replicas, loader())
    facts["dp_sampler_kwargs"] = data_parallel.strategy.distributed_sampler_kwargs
    facts["dp_wrapper"] = replicas.wrapper
    facts["dp_samples_seen"] = float(data_parallel.callback_metrics["samples_seen"])
    save_rank0(out, "initial_dp2.safetensors", replicas.initial)
    save_rank0(out, "final_dp2.safetensors", gathered(data_parallel, replicas))
    write_facts(out, facts)


def write_facts(out: str, facts: dict[str, Any]) -> None:
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


# ---- CUDA only (2 GPUs): what megatron.core runs only there. Never run on the CPU machine. ----
def cuda_accelerator(**kwargs: Any) -> Any:
    from trainer.strategies import MegatronStrategy

    strategy = MegatronStrategy("cuda", **kwargs)
    trainer.Accelerator(strategy=strategy)  # setup_environment: groups, RNG tracker
    return strategy


def check_cuda_rng(out: str) -> None:
    """The tracker's stream differs per TP rank; the default stream and reseeding agree."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    strategy = cuda_accelerator(tensor_model_parallel_size=2, seed=1234)
    ones = torch.ones(256, device="cuda")
    torch.cuda.manual_seed(7)
    default = torch.nn.functional.dropout(ones, 0.5)
    with get_cuda_rng_tracker().fork():
        forked = torch.nn.functional.dropout(ones, 0.5)
    with strategy.module_init_context():  # reseeds the tracker from seed=1234
        pass
    with get_cuda_rng_tracker().fork():
        again = torch.nn.functional.dropout(ones, 0.5)
    write_facts(out, {
        "default_mask_sum": default.nonzero().flatten().tolist(),
        "forked_mask": forked.nonzero().flatten().tolist(),
        "reseeded_equal": bool(torch.equal(forked, again)),
    })  # fmt: skip


def check_cuda_sequence_parallel(out: str) -> None:
    """gather_output=True, and a sequence-parallel norm -> Column -> Row block, against dense."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    strategy = cuda_accelerator(tensor_model_parallel_size=2, sequence_parallel=True)
    init = torch.nn.init.xavier_normal_
    plain = strategy.model_parallel_config(sequence_parallel=False, use_cpu_initialization=True)
    torch.manual_seed(0)
    gather = ColumnParallelLinear(
        8, 16, config=plain, init_method=init, bias=True, gather_output=True
    ).cuda()
    x = torch.randn(4, 2, 8, device="cuda")  # [sequence, batch, hidden], equal on both ranks
    full = strategy.module_state_dict(gather, full=True)
    out_gathered, _ = gather(x)
    gather_diff = (
        (out_gathered - torch.nn.functional.linear(x, full["weight"], full["bias"])).abs().max()
    )

    config = strategy.model_parallel_config(use_cpu_initialization=True)
    block = torch.nn.ModuleDict({
        "norm": torch.nn.LayerNorm(8),
        "col": ColumnParallelLinear(8, 16, config=config, init_method=init, bias=True, gather_output=False),
        "row": RowParallelLinear(16, 8, config=config, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False),
    })  # fmt: skip
    for param in block["norm"].parameters():
        param.sequence_parallel = True  # megatron's mark: gradient partial over the sequence
    block = strategy.setup_module(block)
    weights = strategy.module_state_dict(block, full=True)
    rank = strategy.tensor_model_parallel_rank
    hidden, _ = block["col"](block["norm"](x.chunk(2, dim=0)[rank]))
    result, _ = block["row"](torch.tanh(hidden))
    strategy.backward(result.pow(2).sum(), block)

    dense_norm = torch.nn.LayerNorm(8).cuda()
    dense_norm.load_state_dict({"weight": weights["norm.weight"], "bias": weights["norm.bias"]})
    dense_hidden = torch.nn.functional.linear(
        dense_norm(x), weights["col.weight"], weights["col.bias"]
    )
    dense = torch.nn.functional.linear(
        torch.tanh(dense_hidden), weights["row.weight"], weights["row.bias"]
    )
    dense.pow(2).sum().backward()
    write_facts(out, {
        "gather_output_max_diff": float(gather_diff),
        "sequence_parallel_output_max_diff": float((result - dense.chunk(2, dim=0)[rank]).abs().max()),
        "norm_grad_max_diff": float((block["norm"].weight.grad - dense_norm.weight.grad).abs().max()),
    })  # fmt: skip


class PipelineStage(torch.nn.Module):
    """One Linear(8, 8) + tanh per stage; stage 1 reads its input from the schedule."""

    def __init__(self, layer: torch.nn.Linear, config: Any, stage: int) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.layer, self.config, self.stage = layer, config, stage
        self.model_type = ModelType.encoder_or_decoder
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, tensors: Any) -> None:
        self.input_tensor = tensors[0] if isinstance(tensors, list) else tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layer(x if self.stage == 0 else self.input_tensor))


def check_cuda_pipeline(out: str) -> None:
    """megatron's 1F1B schedule over 2 stages gives each stage the dense model's gradients."""
    import copy

    from megatron.core.pipeline_parallel import get_forward_backward_func

    strategy = cuda_accelerator(pipeline_model_parallel_size=2)
    stage = strategy.pipeline_model_parallel_rank
    config = strategy.model_parallel_config(use_cpu_initialization=True)
    config.hidden_size = 8  # the schedule sends (sequence, micro batch, hidden_size) tensors
    torch.manual_seed(0)
    dense = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh()
    ).cuda()
    model = strategy.setup_module(PipelineStage(copy.deepcopy(dense[2 * stage]), config, stage))
    inputs = torch.randn(2, 4, 3, 8, device="cuda")  # 2 micro batches of [sequence 4, batch 3, 8]
    targets = torch.randn(2, 4, 3, 8, device="cuda")

    def forward_step(data_iterator: Any, stage_model: torch.nn.Module) -> Any:
        x, y = next(data_iterator)

        def loss_func(output: torch.Tensor) -> Any:
            loss = torch.nn.functional.mse_loss(output, y)
            return loss, {"loss": loss.detach()}

        return stage_model(x), loss_func

    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(list(zip(inputs, targets))),
        model=model, num_microbatches=2, seq_length=4, micro_batch_size=3, forward_only=False,
    )  # fmt: skip
    dense_loss = sum(torch.nn.functional.mse_loss(dense(x), y) for x, y in zip(inputs, targets)) / 2
    dense_loss.backward()
    write_facts(out, {
        "stage": stage,
        "grad_max_diff": float((model.layer.weight.grad - dense[2 * stage].weight.grad).abs().max()),
    })  # fmt: skip


if __name__ == "__main__":
    checks = {
        "cuda-rng": check_cuda_rng,
        "cuda-sequence-parallel": check_cuda_sequence_parallel,
        "cuda-pipeline": check_cuda_pipeline,
    }
    checks.get(sys.argv[2] if len(sys.argv) > 2 else "", main)(sys.argv[1])
