"""Parity by difference: ``lightning.pytorch.utilities``' ``grad_norm``, ``measure_flops`` and
``rank_zero_*`` against ``trainer.utilities`` (the same call, the same result)."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

from trainer import utilities as ours

pytest.importorskip("lightning.pytorch")
import lightning.pytorch.utilities as theirs


def _net_with_grads() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    net[2].bias.requires_grad_(False)  # a parameter without a gradient is left out
    net(torch.randn(5, 4)).pow(2).sum().backward()
    return net


def _values(norms: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: round(float(value), 5) for key, value in norms.items()}


@pytest.mark.parametrize("norm_type", [2, 1, 2.5, "inf", "2"])
@pytest.mark.parametrize("separator", ["/", "."])
def test_grad_norm_equals_lightnings(norm_type, separator) -> None:
    net = _net_with_grads()
    expected = _values(theirs.grad_norm(net, norm_type, group_separator=separator))
    assert f"grad_{float(norm_type)}_norm_total" in expected
    assert _values(ours.grad_norm(net, norm_type, group_separator=separator)) == expected


def test_grad_norm_without_gradients_and_bad_norms_as_in_lightning() -> None:
    net = torch.nn.Linear(2, 1)
    assert ours.grad_norm(net, 2) == theirs.grad_norm(net, 2) == {}
    for bad in (0, -1):
        with pytest.raises(ValueError):
            theirs.grad_norm(net, bad)
        with pytest.raises(ValueError, match="norm_type"):
            ours.grad_norm(net, bad)


@pytest.mark.parametrize("with_loss", [False, True])
def test_measure_flops_equals_lightnings(with_loss) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    loss_fn = (lambda out: out.sum()) if with_loss else None
    expected = theirs.measure_flops(net, lambda: net(x), loss_fn)
    assert expected > 0
    assert ours.measure_flops(net, lambda: net(x), loss_fn) == expected


class _Records(logging.Handler):
    """Keeps the messages of the loggers it is attached to (Lightning's do not propagate to the
    root logger once a Lightning Trainer configured them, so caplog may not see them)."""

    def __init__(self, *names: str) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.records: list[logging.LogRecord] = []
        self.loggers = [logging.getLogger(name) for name in names]

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.records.append(record)

    def __enter__(self) -> _Records:
        self.levels = [logger.level for logger in self.loggers]
        for logger in self.loggers:
            logger.addHandler(self)
            logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, level in zip(self.loggers, self.levels, strict=True):
            logger.removeHandler(self)
            logger.setLevel(level)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_rank_zero_helpers_as_in_lightning(monkeypatch, rank) -> None:
    """On rank 1 nothing runs, logs or warns; on rank 0 all do (the rank from the launcher's
    environment, as Lightning reads it before a Trainer exists)."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(theirs.rank_zero_only, "rank", int(rank))  # Lightning reads it at import
    calls: list[str] = []
    for name, module, logger in (
        ("lightning", theirs, "lightning.pytorch.utilities.rank_zero"),
        ("trainer", ours, "trainer.utilities"),
    ):
        result = module.rank_zero_only(lambda who=name: calls.append(who) or who)()
        assert result == (name if rank == "0" else None)
        with _Records(logger) as records, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.rank_zero_info(f"{name} info")
            module.rank_zero_warn(f"{name} warning")
        assert records.messages == ([f"{name} info"] if rank == "0" else [])
        assert [str(w.message) for w in caught] == ([f"{name} warning"] if rank == "0" else [])
    assert calls == (["lightning", "trainer"] if rank == "0" else [])


def test_rank_zero_debug_logs_on_rank_zero_only(monkeypatch) -> None:
    for rank, expected in (("1", []), ("0", ["details"])):
        monkeypatch.setenv("RANK", rank)
        with _Records("trainer.utilities") as records:
            ours.rank_zero_debug("details")
        assert records.messages == expected


def test_rank_zero_warn_and_info_name_the_callers_line_as_lightning(monkeypatch) -> None:
    """Our frames were one fewer than Lightning's for the same stacklevel: the warning pointed
    past the caller (to "sys:1" from a script's top level)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(theirs.rank_zero_only, "rank", 0)
    places = {}
    for name, module, logger in (
        ("lightning", theirs, "lightning.pytorch.utilities.rank_zero"),
        ("trainer", ours, "trainer.utilities"),
    ):
        with _Records(logger) as records, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.rank_zero_warn("here"), module.rank_zero_info("here")  # one line, both calls
        (record,) = records.records
        places[name] = (caught[0].filename, caught[0].lineno, record.pathname, record.lineno)
    assert places["trainer"] == places["lightning"]
    assert places["trainer"][0] == __file__


@pytest.mark.parametrize("configured", [False, True])
def test_rank_zero_info_prints_unless_logging_is_configured_as_lightning(configured) -> None:
    """With no logging set up, Lightning's rank_zero_info prints on stderr (its package logger
    has a handler) and ours printed nothing; with a root handler, that handler prints it."""
    import subprocess
    import sys

    setup = (
        "import logging; logging.basicConfig(format='root: %(message)s'); " if configured else ""
    )
    printed = {}
    for name, module in (
        ("lightning", "lightning.pytorch.utilities"),
        ("trainer", "trainer.utilities"),
    ):
        code = f"{setup}from {module} import rank_zero_info; rank_zero_info('shown')"
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
            env={**os.environ, "RANK": "0"},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        printed[name] = [line for line in run.stderr.splitlines() if "shown" in line]
    if configured:  # the program's handler prints it (Lightning's also prints "INFO: shown")
        assert printed["trainer"] == ["root: shown"] and "root: shown" in printed["lightning"]
    else:
        assert printed["trainer"] == printed["lightning"] == ["shown"]
