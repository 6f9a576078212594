"""LocalSGD: a real 2-process DDP job against a one-process simulation of two replicas.

The job is tests/distributed/local_sgd_worker.py. The simulation trains two copies of the
model on the two halves of the data with plain SGD, averaging their parameters after step 3
and at the end: the job's weights must be those.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.distributed.launch import ROOT, torchrun
from tests.distributed.local_sgd_worker import LR, STEPS, data
from trainer import Accelerator, ConfigurationError, DistributedType
from trainer.accelerator.local_sgd import LocalSGD


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    out = tmp_path_factory.mktemp("local_sgd")
    result = torchrun(ROOT / "tests/distributed/local_sgd_worker.py", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def simulate_two_replicas() -> dict[str, torch.Tensor]:
    replicas = []
    for _ in range(2):
        torch.manual_seed(0)
        replicas.append(torch.nn.Linear(4, 1))
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in replicas]

    def average() -> None:
        with torch.no_grad():
            for params in zip(*(m.parameters() for m in replicas)):
                mean = torch.stack([p for p in params]).mean(0)
                for p in params:
                    p.copy_(mean)

    batches = [data(rank) for rank in range(2)]
    for step, pairs in enumerate(zip(*batches), start=1):
        for model, optimizer, (x, y) in zip(replicas, optimizers, pairs):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if step % STEPS == 0:
            average()
    average()  # leaving the context
    return replicas[0].state_dict()


@pytest.mark.distributed
def test_replicas_step_apart_then_average_to_the_simulation(run2):
    assert [f["distributed_type"] for f in run2] == ["MULTI_CPU"] * 2
    facts = [f["local_sgd"] for f in run2]
    assert [f["differ_after_step_1"] for f in facts] == [True, True]  # no gradient all-reduce
    assert [f["num_steps"] for f in facts] == [4, 4]
    assert facts[0]["weights"] == facts[1]["weights"]
    expected = simulate_two_replicas()
    for name, value in expected.items():
        assert torch.allclose(torch.tensor(facts[0]["weights"][name]), value.flatten(), atol=1e-6)


@pytest.mark.distributed
def test_disabled_is_plain_ddp(run2):
    facts = [f["disabled"] for f in run2]
    assert [f["differ_after_step_1"] for f in facts] == [False, False]
    assert facts[0]["weights"] == facts[1]["weights"] != run2[0]["local_sgd"]["weights"]


# ---- one process -----------------------------------------------------------------------
def test_one_process_counts_steps_and_changes_nothing():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("steps", [0, 1.5, True])
def test_bad_step_counts_name_the_argument(steps):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ConfigurationError, match="local_sgd_steps=.*expected an int >= 1"):
        LocalSGD(accelerator, torch.nn.Linear(2, 1), local_sgd_steps=steps)


def test_sharded_engines_are_refused_with_the_fix():
    sharded = SimpleNamespace(distributed_type=DistributedType.FSDP, strategy=object())
    with pytest.raises(ConfigurationError, match="use DDPStrategy") as info:
        LocalSGD(sharded, torch.nn.Linear(2, 1), local_sgd_steps=2)  # type: ignore[arg-type]
    assert "FSDP" in str(info.value)
