"""#13: a script whose Trainer is a module-level variable exits cleanly (2 processes, gloo).

The Trainer ends its process group when ``fit`` ends, but a module-level ``run`` keeps what runs
on it alive (FSDP's mesh in the module's state, DeepSpeed's engine and ZeRO optimizer) until
interpreter shutdown; the group freed there joins its gloo threads without the GIL to spare and
can abort the process ("terminate called without an active exception"). That needs an unlucky
schedule, so the test checks its cause, on every run: each group still alive after trainer's exit
fallback is one the fallback keeps for ever (never freed during finalization).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.distributed.launch import ROOT, job_env, torchrun

pytestmark = pytest.mark.distributed

WORKER = ROOT / "tests/distributed/group_lifetime_worker.py"


@pytest.mark.parametrize(
    "name",
    [
        "fsdp",
        pytest.param(
            "deepspeed",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
            ),
        ),
    ],
)
def test_a_module_level_trainer_leaves_no_group_to_be_freed_during_shutdown(tmp_path, name):
    env = job_env(DS_ACCELERATOR="cpu")
    env.setdefault(  # as test_deepspeed.py's jobs: DeepSpeed's built comm op cached
        "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    )
    result = torchrun(WORKER, str(tmp_path), name, timeout=300, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "terminate called" not in output
    for rank in range(2):
        at_exit = json.loads((tmp_path / f"rank{rank}_exit.json").read_text())
        assert at_exit["seen"] >= 1
        # The scenario: the global Trainer really holds a group past the fallback ...
        assert at_exit["alive"] >= 1, at_exit
        # ... and the fallback keeps it, so it is not freed while Python shuts down.
        assert at_exit["kept"] is True, at_exit
