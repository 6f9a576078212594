"""Where the start-up of a 2-process DDP job goes: ``trainer launch`` against plain torchrun.

Three jobs, each a tiny DDP fit (``Linear(4, 1)``, 8 steps of batch 4 per process, gloo on
CPU), started from this process and timed from the moment it starts the launcher:

- ``raw``: ``python -m torch.distributed.run --standalone --nproc_per_node 2`` of a plain
  script (``init_process_group``, ``DistributedDataParallel``, a ``DistributedSampler`` loop,
  the wrapper dropped, then ``destroy_process_group``; it imports
  ``torch.distributed.nn.functional`` before the group, as docs/reliability.md advises, or the
  group and its gloo threads outlive it);
- ``torchrun+trainer``: the same torchrun of a script that runs
  ``Trainer(strategy="ddp").fit(...)``;
- ``trainer launch``: ``trainer launch --num_processes 2`` of that Trainer script
  (``python -m trainer.cli launch``).

Each training process writes, on the launcher's clock (``time.time()``), when it started to
run the script, when its imports were done, when the process group was ready, when the first
optimizer step was done and when the fit (process group ended) was done; the launcher's exit
closes the job. Each also counts its OS threads after the fit (``threads_left``: 1 when the
process group and its gloo threads are gone; trainer's launcher-watch thread not counted). The
report gives, per phase, the median over ``--rounds`` interleaved rounds (of the slower
process), so each cost can be put where it belongs: interpreter and launcher start, imports,
rendezvous and group, first step (DDP's constructor imports ``torch._dynamo``:
torch's cost, in both), the rest of the steps, teardown.

    python -m benchmarks.bench_launch --rounds 5 [--no-warmup] [--json launch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("raw", "torchrun+trainer", "trainer launch")
PHASES = ("script", "imports", "group", "first_step", "fit_end", "exit")

_RAW = """
import json, os, sys, time
marks = {"script": time.time()}
import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # before any group: see the end of this script
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
marks["imports"] = time.time()
dist.init_process_group("gloo")
marks["group"] = time.time()
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4)
data = TensorDataset(x, x[:, :1])
for index, (inputs, targets) in enumerate(
    DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
):
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()
    optimizer.zero_grad()
    if index == 0:
        marks["first_step"] = time.time()
    if index == 7:
        break
# docs/reliability.md, "Clean multi-process exit" (issue #13): DDP imports
# torch.distributed.nn.functional, whose default arguments hold the group they find; imported
# above, before the group, they hold none. Otherwise the group outlives destroy_process_group,
# 3 gloo threads stay, and one aborts the process at exit now and then (it failed this
# benchmark in CI). The DDP wrapper goes before its group ends too (its reducer).
del model, optimizer
dist.barrier()
dist.destroy_process_group()
marks["fit_end"] = time.time()
marks["threads_left"] = len(os.listdir("/proc/self/task"))  # OS threads: 1 = the main one
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as file:
    json.dump(marks, file)
"""

_TRAINER = """
import json, os, sys, threading, time
marks = {"script": time.time()}
import torch
from torch.utils.data import DataLoader, TensorDataset
import trainer
from trainer.callbacks import Callback
marks["imports"] = time.time()


class Marks(Callback):
    def setup(self, trainer, module, stage):  # after the process group was joined
        marks["group"] = time.time()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 0:
            marks["first_step"] = time.time()


class Net(trainer.TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(64, 4)
fit = trainer.Trainer(
    strategy="ddp", accelerator="cpu", max_steps=8, logger=False, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False, callbacks=[Marks()],
)
fit.fit(Net(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
marks["fit_end"] = time.time()
# OS threads: 1 = the main one; trainer's launcher watch (a Python daemon thread that sleeps,
# trainer.runtime.launcher_watch) is not one of the group's
watch = sum(t.name == "trainer-launcher-watch" for t in threading.enumerate())
marks["threads_left"] = len(os.listdir("/proc/self/task")) - watch
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as file:
    json.dump(marks, file)
"""


def _command(variant: str, scripts: dict[str, Path], out: Path) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    if variant == "raw":
        return [*torchrun, "2", str(scripts["raw"]), str(out)]
    if variant == "torchrun+trainer":
        return [*torchrun, "2", str(scripts["trainer"]), str(out)]
    return [
        sys.executable, "-m", "trainer.cli", "launch", "--num_processes", "2",
        str(scripts["trainer"]), str(out),
    ]  # fmt: skip


def run_once(variant: str, scripts: dict[str, Path], folder: Path) -> dict[str, float]:
    """One job; each phase's time since the launcher started, for the slower process."""
    out = Path(tempfile.mkdtemp(dir=folder))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    start = time.time()
    done = subprocess.run(
        _command(variant, scripts, out), env=env, capture_output=True, text=True, timeout=300
    )
    end = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    marks = {phase: max(rank[phase] for rank in ranks) - start for phase in PHASES[:-1]}
    marks["exit"] = end - start
    # OS threads alive in a process after its training ended (the most of the two): a gloo
    # thread left there can abort the process as Python exits
    marks["threads_left"] = max(rank["threads_left"] for rank in ranks)
    return marks


def run_benchmark(rounds: int, *, warmup: bool = True) -> dict[str, Any]:
    """Every variant ``rounds`` times, interleaved and rotated, after one untimed round."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as directory:
        folder = Path(directory)
        scripts = {"raw": folder / "raw_ddp.py", "trainer": folder / "trainer_ddp.py"}
        scripts["raw"].write_text(textwrap.dedent(_RAW))
        scripts["trainer"].write_text(textwrap.dedent(_TRAINER))
        first = 0 if warmup else 1
        for index in range(first, rounds + 1):
            shift = index % len(VARIANTS)
            for name in VARIANTS[shift:] + VARIANTS[:shift]:
                marks = run_once(name, scripts, folder)
                if index:  # round 0 warms the page cache and bytecode
                    runs[name].append(marks)
    return {
        "rounds": rounds,
        "median": {
            name: {phase: statistics.median(m[phase] for m in marks) for phase in PHASES}
            for name, marks in runs.items()
        },
        "runs": runs,
    }


def format_table(result: dict[str, Any]) -> str:
    """Per variant: the median time since launch of each phase's end, and each phase's share."""
    lines = [
        f"2-process DDP job of 8 tiny steps, gloo on CPU; seconds since the launcher started, "
        f"median of {result['rounds']} rounds (the slower process)",
        "",
        "| job | script runs | imports done | group ready | first step | fit done | launcher exit |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, marks in result["median"].items():
        cells = " | ".join(f"{marks[phase]:.2f}" for phase in PHASES)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = run_benchmark(args.rounds, warmup=not args.no_warmup)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
