"""MegatronStrategy in one process: argument errors, the registry, the missing-package error,
and the examples of docs/strategies/megatron.md and model_parallel.md (run in subprocesses, so
this pytest process never starts a process group). The 2-process jobs are in
tests/distributed/test_megatron.py and test_model_parallel.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer._imports import is_available
from trainer.errors import ConfigurationError
from trainer.strategies import STRATEGY_REGISTRY

ROOT = Path(__file__).resolve().parents[2]
has_megatron = pytest.mark.skipif(
    not is_available("megatron.core"), reason="pip install 'trainer[megatron]'"
)


def run_python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env,
        cwd=cwd or ROOT,
    )  # fmt: skip


def test_missing_megatron_raises_missing_dependency_error_naming_the_extra():
    code = textwrap.dedent(
        """
        import sys
        import trainer.strategies.megatron  # the module imports megatron only when constructed
        assert "megatron" not in sys.modules, "importing the strategy module imported megatron"
        sys.modules["megatron"] = None  # as if megatron-core were not installed
        import trainer
        from trainer.strategies import MegatronStrategy
        for build in (lambda: MegatronStrategy("cpu"),
                      lambda: trainer.Trainer(strategy="megatron", accelerator="cpu")):
            try:
                build()
            except trainer.MissingDependencyError as err:
                print("MissingDependencyError:", err)
            else:
                raise SystemExit("no error")
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "MegatronStrategy needs the package 'megatron'" in line
        assert "pip install 'trainer[megatron]'" in line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tensor_model_parallel_size": 0}, r"tensor_model_parallel_size=0 \(type int\)\): expected an int >= 1"),
        ({"pipeline_model_parallel_size": "2"}, r"pipeline_model_parallel_size='2' \(type str\)"),
        ({"tensor_model_parallel_size": True}, r"tensor_model_parallel_size=True \(type bool\)"),
        ({"sequence_parallel": True}, r"set tensor_model_parallel_size >= 2"),
        ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, r"sequence_parallel=True\) needs CUDA"),
        ({"pipeline_model_parallel_size": 2}, r"pipeline_model_parallel_size=2\) needs CUDA"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_argument_and_the_fix(kwargs, message):
    from trainer.strategies import MegatronStrategy

    with pytest.raises(ConfigurationError, match=message):
        MegatronStrategy("cpu", **kwargs)


def test_registered_as_megatron_and_model_parallel():
    assert STRATEGY_REGISTRY["megatron"] == "trainer.strategies.megatron:MegatronStrategy"
    assert STRATEGY_REGISTRY["model_parallel"] == (
        "trainer.strategies.model_parallel:ModelParallelStrategy"
    )
    import trainer.strategies as strategies

    assert strategies.MegatronStrategy.name == "megatron"
    assert strategies.ModelParallelStrategy.name == "model_parallel"
    assert {"MegatronStrategy", "ModelParallelStrategy"} <= set(strategies.__all__)


def _runnable_blocks(page: Path) -> list:
    """The page's python blocks that tests/test_docs.py would run (not ``<!-- no-run -->``)."""
    from tests.test_docs import NO_RUN, _parse_blocks

    return [b for b in _parse_blocks(page) if b.info == "python" and b.marker != NO_RUN]


@pytest.mark.parametrize(
    "page", [pytest.param("megatron.md", marks=has_megatron), "model_parallel.md"]
)
def test_docs_page_example_runs_in_one_process_and_prints_what_the_page_shows(page, tmp_path):
    from tests.test_docs import _matches

    blocks = _runnable_blocks(ROOT / "docs" / "strategies" / page)
    assert len(blocks) == 1, f"docs/strategies/{page}: expected one runnable example"
    result = run_python(blocks[0].code, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert blocks[0].expected_output is not None
    assert _matches(result.stdout, blocks[0].expected_output), result.stdout


@has_megatron
def test_mixed_precision_on_the_cpu_is_refused_before_any_process_group(tmp_path):
    # Before: the first backward failed inside megatron-core ("expected m1 and m2 to have the
    # same dtype"): its layers' backward runs outside CPU autocast.
    code = textwrap.dedent(
        """
        import torch
        import trainer
        from trainer.errors import ConfigurationError
        from trainer.strategies import MegatronStrategy
        from tests.distributed.megatron_worker import MegatronNet, loader

        try:  # refused when the Trainer is built (its Accelerator sets the strategy up)
            fit = trainer.Trainer(
                strategy=MegatronStrategy("cpu", tensor_model_parallel_size=1),
                precision="bf16-mixed", max_steps=2, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False,
            )
            fit.fit(MegatronNet(), loader())
        except ConfigurationError as err:
            import torch.distributed as dist
            print("refused:", err, "| group started:", dist.is_initialized())
        """
    )
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused: MegatronStrategy: precision='bf16-mixed' does not run on the CPU" in (
        result.stdout
    )
    assert "precision='bf16-true'" in result.stdout
    assert "group started: False" in result.stdout
