"""Smoke test of benchmarks/bench_data_seeding.py: it runs and reports every variant.

Speed is never asserted (a shared machine makes thresholds flaky); the figures are in
docs/checkpointing.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_each_variant_against_the_plain_loader(tmp_path: Path) -> None:
    path = tmp_path / "seeding.json"
    args = ["--batches", "4", "--rounds", "1", "--workers", "0", "--json", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_data_seeding", *args],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(path.read_text(encoding="utf-8"))
    for dataset in ("tiny_w0", "augment_w0"):
        figures = result[dataset]
        assert {"plain", "shard", "seeded"} <= set(figures)
        assert figures["plain"]["cpu_ratio"] == 1.0
        assert all(f["wall_us_per_batch"] > 0 for f in figures.values())
    assert "| seeded |" in done.stdout
