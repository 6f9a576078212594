"""prepare_pippy inside one torchrun job of 2 processes (gloo on CPU): 2 stages.

Each process computes the reference outputs with the whole model first, then splits it and
records, per call, the output shape it got (None where it gets nothing) and the largest
difference from the reference. Facts go to OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from trainer.accelerator.pipelining import prepare_pippy


class Net(torch.nn.Module):
    """Linear -> 4 x (Linear, GELU) -> Linear, with an optional keyword input.

    ``shift`` is used in the first stage: torch's pipeline hands keyword inputs to stage 0.
    """

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.layers = torch.nn.Sequential(
            *[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(4)]
        )
        self.out = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.inp(x)
        return self.out(self.layers(hidden if shift is None else hidden + shift))


def compare(output: Any, expected: torch.Tensor) -> dict[str, Any]:
    if output is None:
        return {"shape": None}
    return {"shape": list(output.shape), "difference": float((output - expected).abs().max())}


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=generator)
    longer = torch.randn(9, 4, generator=generator)
    shift = torch.randn(6, 8, generator=generator)
    facts: dict[str, Any] = {}

    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        expected = {"same": model(x), "short": model(x[:5]), "longer": model(longer)}
    auto = prepare_pippy(model, example_args=(x,))  # split_points="auto", 2 micro-batches
    facts["auto_split_points"] = auto.hf_split_points
    facts["auto"] = {
        "same": compare(auto(x), expected["same"]),
        "short": compare(auto(x[:5]), expected["short"]),  # padded to 6, trimmed back
        "longer": compare(auto(longer), expected["longer"]),  # re-traced for 9 rows
    }

    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        reference = model(x, shift=shift)
    gathered = prepare_pippy(
        model,
        split_points=["layers.1"],
        example_args=(x,),
        example_kwargs={"shift": shift},
        num_chunks=3,
        gather_output=True,
    )
    facts["gathered"] = compare(gathered(x, shift=shift), reference)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    main(sys.argv[1])
