"""Kwargs handlers on a real 2-process job (torchrun, gloo on CPU): what DDP and the process
group are built with, and one Chrome trace per process from ``accelerator.profile()``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, output_tail, torchrun

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("handlers")
    result = torchrun(ROOT / "tests/distributed/handlers_worker.py", str(out))
    assert result.returncode == 0, output_tail(result)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert "error" not in rank, rank.get("error")
    return out, ranks


def test_ddp_kwargs_reach_distributed_data_parallel(facts):
    _, ranks = facts
    for rank in ranks:
        assert (
            rank["strategy"] == "DDPStrategy"
            and rank["ddp_handler"] == "DistributedDataParallelKwargs"
        )
        assert rank["find_unused_parameters"] is True  # the unused head would fail without it
        assert rank["bucket_bytes_cap"] == 1024 * 1024
        assert rank["gradient_as_bucket_view"] is True
        assert rank["comm_hooks"] == ["fp16_compress_hook"]
        assert rank["weights_equal_across_ranks"] is True


def test_the_process_group_is_created_with_the_backend_and_timeout(facts):
    _, ranks = facts
    assert [(r["backend"], r["timeout_s"]) for r in ranks] == [("gloo", 123.0)] * 2


def test_profile_writes_one_chrome_trace_per_process(facts):
    out, _ = facts
    for rank in range(2):
        trace = json.loads((out / "traces" / f"profile_{rank}.json").read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "aten::addmm" in names or "aten::linear" in names
