"""prepare_pippy: 2 pipeline stages on 2 CPU processes give the one-process outputs.

The job (tests/distributed/pipelining_worker.py) splits a 6-layer model automatically and at a
named module, with positional and keyword inputs, 2 and 3 micro-batches, a short batch (padded
and trimmed), a longer one (re-traced), and with and without ``gather_output``. The argument
checks and the one-process pass-through run here.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import ROOT, torchrun
from tests.distributed.pipelining_worker import Net
from trainer import ConfigurationError
from trainer.accelerator.pipelining import balanced_split_points, prepare_pippy


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipelining")
    result = torchrun(ROOT / "tests/distributed/pipelining_worker.py", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
def test_two_stages_give_the_one_process_outputs_on_the_last_process(run2):
    first, last = run2
    assert first["auto_split_points"] == last["auto_split_points"] == ["layers.2"]
    assert first["auto"] == {call: {"shape": None} for call in ("same", "short", "longer")}
    assert {call: facts["shape"] for call, facts in last["auto"].items()} == {
        "same": [6, 2],
        "short": [5, 2],
        "longer": [9, 2],
    }
    # Equal up to float rounding: a micro-batch of 5 or 4 rows may take another GEMM kernel than
    # the reference's 9 rows (1.5e-8 on an AVX-512 Xeon; 0 on the AMD machines before). A wrong
    # stage, split or padding differs by orders of magnitude more.
    assert all(facts["difference"] <= 1e-6 for facts in last["auto"].values()), last["auto"]


@pytest.mark.distributed
def test_gather_output_brings_the_output_to_every_process(run2):
    assert [facts["gathered"] for facts in run2] == [{"shape": [6, 2], "difference": 0.0}] * 2


def test_auto_split_points_balance_parameter_size():
    # parameters: inp 40 + layers.0 72 + layers.1 72 | layers.2 72 + layers.3 72 + out 18
    assert balanced_split_points(Net(), 2) == ["layers.2"]
    assert balanced_split_points(Net(), 2, no_split_module_classes=["Sequential"]) == ["out"]
    with pytest.raises(ConfigurationError, match="too few to cut into 20 stages"):
        balanced_split_points(Net(), 20)


def test_one_process_keeps_the_model_forward():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 4)
    expected = model(x)
    prepared = prepare_pippy(model, example_args=(x,))
    assert prepared.hf_split_points == [] and torch.equal(prepared(x), expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split_points": ["nope"]}, "unknown: \\['nope'\\]"),
        ({"num_chunks": 0}, "num_chunks=0 \\(type int\\)\\): expected an int >= 1"),
        ({"example_args": ()}, "need a tensor whose dim 0"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, message):
    options = {"example_args": (torch.randn(4, 4),), **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        prepare_pippy(Net(), **options)
