"""Accelerator.join_uneven_inputs over a real 2-process gloo job (torchrun)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import ROOT, output_tail, torchrun

pytestmark = pytest.mark.distributed


def test_uneven_batches_under_join_finish_with_the_replicas_equal(tmp_path):
    result = torchrun(ROOT / "tests/distributed/join_worker.py", str(tmp_path), timeout=180)
    assert result.returncode == 0, output_tail(result)
    facts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [f["batches"] for f in facts] == [3, 2]  # 5 batches of 2, not repeated
    assert [f["even_batches_inside"] for f in facts] == [False, False]
    assert [f["even_batches_after"] for f in facts] == [True, True]  # put back
    assert facts[0]["weights"] == facts[1]["weights"]  # Join kept the replicas together
