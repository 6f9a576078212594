"""#13: fits refused at restore, then another fit or the end of the script, in a real 2-process
DeepSpeed job (torchrun, gloo on CPU, failed_restore_worker.py): every process exits 0.

The abort this guards against ("terminate called without an active exception", SIGABRT at exit)
came when a process group outlived trainer's exit fallback: DeepSpeed's engines, never freed by
Python's collector, held it, and its gloo threads ran into interpreter shutdown, where one that
freed the tensors of the ranks' last all-gather (the agreement on the refusal) aborted. That
needs an unlucky schedule (5 launches in 159 on a loaded 2-core machine, none when quiet), so
the tests also check its cause, which is there on every run: no gloo thread is left once the
fallback has run (6 per process were before the fix).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.distributed.launch import ROOT, job_env, torchrun

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install 'trainer[deepspeed]')",
    ),
]

FAILS = 4  # refused fits per launch, in turn a flipped byte in rank 0's and rank 1's ZeRO shard


def _env() -> dict[str, str]:
    """As test_deepspeed.py's jobs: DeepSpeed on the CPU, its built comm op cached."""
    env = job_env(DS_ACCELERATOR="cpu")
    env.setdefault(
        "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    )
    return env


@pytest.mark.parametrize("then", ["fit", "exit"])
def test_refused_deepspeed_restores_then_a_fit_or_the_end_exit_cleanly(tmp_path, then):
    script = ROOT / "tests/distributed/failed_restore_worker.py"
    result = torchrun(script, str(tmp_path), "deepspeed", str(FAILS), then, timeout=300, env=_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]  # torchrun: 0 only when every process exits 0
    assert "terminate called" not in output
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert facts[0]["refusals"] == facts[1]["refusals"]  # both ranks refuse, with one message
    flipped = [damaged for damaged, _ in facts[0]["refusals"]]
    assert [f"zero_pp_rank_{index % 2}_" in name for index, name in enumerate(flipped)] == [True] * FAILS  # fmt: skip
    for rank in range(2):
        assert facts[rank]["saved_step"] == 4
        for damaged, error in facts[rank]["refusals"]:
            assert error is not None and damaged in error, error
            assert "does not match its sha256 in the manifest" in error
        if then == "fit":  # the fit after the refusals resumes the good checkpoint and trains
            assert facts[rank]["after_steps"] == 8
            assert facts[rank]["after_weights_finite"] is True
            # After the group ended, a new engine runs on the new group, not on DeepSpeed's cached
            # copy of the ended one ("Group ... is not registered" before).
            assert facts[rank]["after_end_steps"] == 2
        at_exit = json.loads((tmp_path / f"rank{rank}_exit.json").read_text())
        assert at_exit["gloo_threads"] == []  # the groups were freed before Python shut down


@pytest.mark.parametrize("name", ["fsdp", "ddp"])
def test_refused_restores_then_the_end_leave_no_group_running_at_exit(tmp_path, name):
    # FSDP: its DeviceMesh kept the world group in a registry of its own, reachable from DTensor's
    # caches, so the group outlived the exit fallback (3 gloo threads at exit; 1 abort in 30).
    script = ROOT / "tests/distributed/failed_restore_worker.py"
    result = torchrun(script, str(tmp_path), name, "2", "exit", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "terminate called" not in output
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert facts[0]["refusals"] == facts[1]["refusals"]
    assert all(error is not None for _, error in facts[0]["refusals"]), facts[0]
    for rank in range(2):
        at_exit = json.loads((tmp_path / f"rank{rank}_exit.json").read_text())
        assert at_exit["gloo_threads"] == [], at_exit
