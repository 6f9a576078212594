"""Run by torchrun: the Accelerate idiom ``if accelerator.is_main_process:
accelerator.save_model(...)`` under DDP, then ``wait_for_everyone`` and every rank reads the file.

Args: output folder. Writes ``rank<N>.json`` with the saved weights' names and whether they
equal this rank's model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from trainer import Accelerator


def main(out: Path) -> None:
    accelerator = Accelerator(strategy="ddp")
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    if accelerator.is_main_process:  # as Accelerate's examples do
        accelerator.save_model(model, out / "model")
    accelerator.wait_for_everyone()
    saved = load_file(out / "model" / "model.safetensors")
    own = accelerator.unwrap_model(model).state_dict()
    facts = {
        "names": sorted(saved),
        "equal": all(torch.equal(saved[name], own[name]) for name in own),
    }
    accelerator.end_training()
    rank = accelerator.process_index
    (out / f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
