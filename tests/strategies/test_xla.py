"""XLAStrategy: argument checks and the missing-torch_xla path here; the real runtime in .ci/xla.

torch_xla wheels match one torch release each and do not import beside the project's torch, so
the tests marked ``xla`` are skipped here and run by ``.ci/xla`` in a virtualenv with a matching
torch/torch_xla pair and ``PJRT_DEVICE=CPU``. Each of them runs one scenario of this file in a
fresh interpreter (``python tests/strategies/test_xla.py SCENARIO``), because the PJRT runtime
starts once per process and SPMD must be chosen before it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import trainer
from trainer.errors import ConfigurationError, MissingDependencyError
from trainer.strategies import STRATEGY_REGISTRY, resolve_strategy
from trainer.strategies.xla import XLAStrategy

ROOT = Path(__file__).resolve().parents[2]
# Importable, not merely installed: a torch_xla built for another torch fails on import.
# (A scenario process skips the check: it only runs one scenario.)
_HAS_TORCH_XLA = "XLA_SCENARIO" not in os.environ and (
    subprocess.run([sys.executable, "-c", "import torch_xla"], capture_output=True).returncode == 0
)
needs_torch_xla = pytest.mark.skipif(
    not _HAS_TORCH_XLA, reason="torch_xla is not importable here; .ci/xla runs these"
)


def _run_python(code: str, env: dict[str, str] | None = None, timeout: int = 300):
    """Run ``code`` in a fresh interpreter from the repository root."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full_env,
        timeout=timeout,
    )


# ---- here: no torch_xla ------------------------------------------------------------------
def test_xla_is_registered_and_imports_without_torch_xla():
    assert STRATEGY_REGISTRY["xla"] == "trainer.strategies.xla:XLAStrategy"
    result = _run_python(
        """
        import sys
        sys.modules["torch_xla"] = None
        from trainer.strategies import XLAStrategy, resolve_strategy
        strategy = resolve_strategy("xla")
        print(type(strategy).__name__, repr(strategy), strategy.distributed_type)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "XLAStrategy",
        "XLAStrategy(device=PJRT_DEVICE,",
        "spmd=False,",
        "precision='32-true')",
        "XLA",
    ]


_HIDDEN_TORCH_XLA = """
    import sys
    sys.modules["torch_xla"] = None  # what an environment without torch_xla looks like
    import trainer
    from trainer.errors import MissingDependencyError
    for build in (
        lambda: trainer.strategies.XLAStrategy().setup_environment(),
        lambda: trainer.Trainer(strategy="xla"),
        lambda: trainer.Accelerator(strategy="xla"),
    ):
        try:
            build()
        except MissingDependencyError as err:
            print(err)
"""


def test_missing_torch_xla_names_the_extra():
    result = _run_python(_HIDDEN_TORCH_XLA)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    for line in lines:
        assert line.startswith("XLAStrategy needs the package 'torch_xla', which is not installed")
        assert line.endswith("Install it with: pip install 'trainer[xla]'")


def test_torch_xla_that_does_not_import_names_the_matching_pair(tmp_path):
    # An installed torch_xla built for another torch fails with an ImportError (undefined
    # symbols in _XLAC); a stand-in package that raises the same way.
    package = tmp_path / "torch_xla"
    package.mkdir()
    (package / "__init__.py").write_text(
        'raise ImportError("_XLAC.so: undefined symbol: _ZN5torch8autograd")\n'
    )
    result = _run_python(
        """
        from trainer.errors import MissingDependencyError
        from trainer.strategies.xla import XLAStrategy
        try:
            XLAStrategy().setup_environment()
        except MissingDependencyError as err:
            print(err)
        """,
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"XLAStrategy: torch_xla is installed but does not import beside torch "
        f"{torch.__version__} (_XLAC.so: undefined symbol: _ZN5torch8autograd). Each torch_xla "
        "wheel needs the torch release of the same number: install a matching pair, e.g. "
        "pip install 'torch==2.9.0' 'torch_xla==2.9.0' (see .ci/xla)."
    )


@pytest.mark.skipif(_HAS_TORCH_XLA, reason="checks the message where torch_xla is absent")
def test_missing_torch_xla_in_this_process():
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainer\[xla\]'"):
        XLAStrategy().setup_environment()


@pytest.mark.parametrize(
    ("accelerator", "pjrt_device"),
    [(None, None), ("auto", None), ("xla", None), ("tpu", "TPU"), ("CPU", "CPU"), ("gpu", "CUDA")],
)
def test_accelerator_names_map_to_pjrt_devices(accelerator, pjrt_device, monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert XLAStrategy(accelerator).pjrt_device == pjrt_device


def test_unknown_accelerator_lists_the_valid_ones():
    with pytest.raises(
        ConfigurationError,
        match=r"^XLAStrategy\(accelerator='mps' \(type str\)\): expected one of 'auto', 'xla', "
        r"'tpu', 'cpu', 'cuda', 'gpu', 'neuron' or None\.$",
    ):
        XLAStrategy("mps")


def test_accelerator_that_contradicts_pjrt_device(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert XLAStrategy("tpu").pjrt_device == "TPU"
    assert XLAStrategy().pjrt_device is None  # None: the environment decides
    with pytest.raises(
        ConfigurationError,
        match=r"^XLAStrategy\(accelerator='cpu'\) asks for PJRT_DEVICE=CPU, but the environment "
        r"sets PJRT_DEVICE=TPU\. Unset PJRT_DEVICE, or pass accelerator=None to use it\.$",
    ):
        XLAStrategy("cpu")


def test_mesh_arguments_need_spmd():
    with pytest.raises(ConfigurationError, match=r"only in SPMD mode\. Pass spmd=True"):
        XLAStrategy(mesh_shape=(4,))
    with pytest.raises(ConfigurationError, match="one axis name per mesh dimension"):
        XLAStrategy(spmd=True, mesh_shape=(2, 2), mesh_axis_names=("data",))
    strategy = XLAStrategy(spmd=True, mesh_shape=(2, 2), mesh_axis_names=("data", "model"))
    assert strategy.mesh is None  # built in setup_environment, once the runtime runs


def test_trainer_passes_its_accelerator_to_the_strategy(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    strategy = resolve_strategy("xla", accelerator="cpu")
    assert isinstance(strategy, XLAStrategy) and strategy.pjrt_device == "CPU"


def test_invalid_reduce_op_is_rejected_before_any_xla_call():
    with pytest.raises(trainer.StrategyError, match=r"all_reduce\(op='avg'\)"):
        XLAStrategy().all_reduce(torch.ones(1), op="avg")


# ---- the real runtime (.ci/xla) ----------------------------------------------------------
def _scenario(name: str, env: dict[str, str] | None = None) -> str:
    """Run one scenario below in a fresh interpreter; return what it printed."""
    full_env = {"PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU"), **(env or {})}
    result = _run_python(
        f"import runpy; runpy.run_path({str(Path(__file__))!r}, run_name='__main__')",
        env={**full_env, "XLA_SCENARIO": name},
        timeout=600,
    )
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.mark.xla
@needs_torch_xla
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fit_on_one_xla_device_matches_the_cpu(precision):
    out = _scenario("fit", {"XLA_PRECISION": precision})
    assert "device xla:0" in out and "parity ok" in out, out


@pytest.mark.xla
@needs_torch_xla
def test_checkpoint_from_xla_resumes_exactly():
    out = _scenario("checkpoint")
    assert "tensors on cpu in the checkpoint" in out and "resume ok" in out, out


@pytest.mark.xla
@needs_torch_xla
def test_async_checkpoints_from_xla_are_written_in_the_background_and_equal_synchronous_ones():
    out = _scenario("async_checkpoint")
    assert "in the background: 8 of 8" in out and "checkpoints equal" in out, out
    assert "training unchanged" in out, out
    assert "accelerator state saved in the background: 1" in out, out


@pytest.mark.xla
@needs_torch_xla
def test_mp_device_loader_feeds_the_device():
    out = _scenario("loader")
    assert "batches 4 on xla" in out, out


@pytest.mark.xla
@needs_torch_xla
def test_spmd_on_two_devices_matches_one_device():
    out = _scenario("spmd", {"CPU_NUM_DEVICES": "2"})
    assert "mesh (2,) ('data',)" in out and "batch sharded" in out and "parity ok" in out, out


@pytest.mark.xla
@needs_torch_xla
@pytest.mark.skipif(
    os.environ.get("PJRT_DEVICE", "CPU") == "CPU",
    reason="XLA:CPU has no cross-replica collectives (pytorch/xla#5005): they hang; run with "
    "PJRT_DEVICE=TPU",
)
def test_replicas_reduce_gradients_and_collectives():
    out = _scenario("replicas")
    assert "collectives ok" in out and "parity ok" in out, out


# ---- scenarios, run in a fresh interpreter by _scenario ----------------------------------
def _fit_linear(strategy: object, precision: str, **options: object) -> dict[str, torch.Tensor]:
    from tests.conftest import LinearModule, make_loader

    torch.manual_seed(0)
    module = LinearModule()
    fit_trainer = trainer.Trainer(
        strategy=strategy,
        precision=precision,
        max_epochs=2,
        gradient_clip_val=1.0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        **options,
    )
    fit_trainer.fit(module, make_loader())
    print("device", fit_trainer.strategy.root_device)
    return {k: v.detach().cpu().float() for k, v in module.state_dict().items()}


def _scenario_fit() -> None:
    precision = os.environ["XLA_PRECISION"]
    # XLA first: torch_xla must start before the first CPU backward pass of the process.
    on_xla = _fit_linear("xla", precision)
    on_cpu = _fit_linear("single", precision, accelerator="cpu")
    atol = 1e-5 if precision == "32-true" else 2e-2
    for key, value in on_cpu.items():
        torch.testing.assert_close(on_xla[key], value, atol=atol, rtol=0)
    print("parity ok")


def _scenario_checkpoint() -> None:
    import tempfile

    from tests.conftest import LinearModule, make_loader

    root = tempfile.mkdtemp()
    options = dict(
        strategy="xla",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    torch.manual_seed(0)
    straight = LinearModule()
    trainer.Trainer(max_epochs=2, **options).fit(straight, make_loader())

    torch.manual_seed(0)
    first = LinearModule()
    half = trainer.Trainer(max_epochs=1, **options)
    half.fit(first, make_loader())
    path = os.path.join(root, "epoch1")
    half.save_checkpoint(path)
    loaded = half.strategy.load_checkpoint(path)
    devices = {t.device.type for t in _tensors(loaded)}
    print("tensors on", ",".join(sorted(devices)), "in the checkpoint")

    torch.manual_seed(1)  # a different start: everything must come from the checkpoint
    resumed = LinearModule()
    trainer.Trainer(max_epochs=2, **options).fit(resumed, make_loader(), ckpt_path=path)
    for (key, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-6, rtol=0, msg=key)
    print("resume ok")


def _scenario_async_checkpoint() -> None:
    import tempfile
    import warnings

    from tests.conftest import LinearModule, make_loader, quiet_trainer
    from trainer.callbacks import ModelCheckpoint
    from trainer.checkpoint import read_checkpoint
    from trainer.plugins import AsyncCheckpointIO

    root = Path(tempfile.mkdtemp())

    def fit(name: str, plugins: list[object]) -> tuple[trainer.Trainer, LinearModule]:
        torch.manual_seed(0)
        module = LinearModule()
        saves = ModelCheckpoint(dirpath=root / name, every_n_train_steps=2, save_top_k=-1)
        run = quiet_trainer(
            root, strategy="xla", max_epochs=2, callbacks=[saves], plugins=plugins,
            enable_checkpointing=True,
        )  # fmt: skip
        run.fit(module, make_loader())
        return run, module

    _, synchronous = fit("sync", [])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="AsyncCheckpointIO")  # no synchronous fallback
        run, in_background = fit("async", [AsyncCheckpointIO()])
    names = sorted(p.name for p in (root / "sync").iterdir())
    assert names == sorted(p.name for p in (root / "async").iterdir()), names
    print(f"in the background: {run.checkpoint_io.save_count} of {len(names)}")
    for name in names:  # each holds the weights of its own step, equal to the synchronous save
        expected = read_checkpoint(root / "sync" / name)
        written = read_checkpoint(root / "async" / name)
        assert expected["global_step"] == written["global_step"], name
        for a, b in zip(_tensors(expected), _tensors(written), strict=True):
            assert a.device.type == b.device.type == "cpu" and torch.equal(a, b), name
    print("checkpoints equal")
    for (key, a), b in zip(synchronous.state_dict().items(), in_background.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu()), key
    print("training unchanged")

    # The Accelerator's save_state takes the same plugin: the state of the step it was called at.
    accelerator = trainer.Accelerator(strategy=XLAStrategy())
    torch.manual_seed(0)
    network = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(network, torch.optim.SGD(network.parameters(), lr=0.1))
    io = AsyncCheckpointIO()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    batches = [(x.to(accelerator.device), y.to(accelerator.device)) for x, y in make_loader()]
    step(*batches[0])
    saved = {key: value.cpu().clone() for key, value in model.state_dict().items()}
    accelerator.save_state(root / "accelerator", checkpoint_io=io)
    step(*batches[1])  # training goes on while the save may be in flight
    io.wait()
    accelerator.load_state(root / "accelerator")
    for key, value in model.state_dict().items():
        assert torch.equal(value.cpu(), saved[key]), key
    print(f"accelerator state saved in the background: {io.save_count}")


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _scenario_loader() -> None:
    from tests.conftest import make_loader

    strategy = XLAStrategy()
    strategy.setup_environment()
    batches = list(strategy.process_dataloader(make_loader(n=16, batch_size=4)))
    types = {t.device.type for batch in batches for t in batch}
    print("batches", len(batches), "on", ",".join(sorted(types)))


def _linear_steps(strategy: XLAStrategy | None, loader: object) -> torch.Tensor:
    """Four SGD steps with clipping on a Linear(4, 1); the final weight on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    if strategy is not None:
        model = strategy.setup_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if strategy is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        else:
            strategy.backward(loss, model)
            strategy.clip_grad_norm_(model, model.parameters(), 1.0)
            strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    return torch.cat([model.weight.detach().cpu().flatten(), model.bias.detach().cpu()])


def _scenario_spmd() -> None:
    from tests.conftest import make_loader

    strategy = XLAStrategy(spmd=True)
    strategy.setup_environment()
    print("mesh", strategy.mesh.mesh_shape, strategy.mesh.axis_names)
    loader = strategy.process_dataloader(make_loader(n=32, batch_size=8))
    first_x, _ = next(iter(loader))
    import torch_xla

    spec = torch_xla._XLAC._get_xla_sharding_spec(first_x)
    print("batch sharded" if "devices=[2,1]" in spec else f"batch not sharded: {spec!r}")
    on_mesh = _linear_steps(strategy, loader)
    on_cpu = _linear_steps(None, make_loader(n=32, batch_size=8))
    torch.testing.assert_close(on_mesh, on_cpu, atol=1e-5, rtol=0)
    print("parity ok")


def _replica(index: int) -> None:
    from tests.conftest import make_loader

    strategy = XLAStrategy()
    strategy.setup_environment()
    rank, world = strategy.global_rank, strategy.world_size
    value = torch.tensor([float(rank + 1)])
    expected_mean = (world + 1) / 2
    assert strategy.all_reduce(value).item() == expected_mean
    assert strategy.all_reduce(value, op="max").item() == world
    assert strategy.all_gather(value).flatten().tolist() == [float(r + 1) for r in range(world)]
    assert strategy.broadcast(torch.tensor([rank * 10.0]), src=1).item() == 10.0
    assert strategy.broadcast({"rank": rank}, src=1) == {"rank": 1}
    strategy.barrier()
    if rank == 0:
        print("collectives ok", flush=True)
    # Each replica reads its shard; the averaged gradients equal one device on the full batch.
    full = make_loader(n=32, batch_size=8 * world)
    device = strategy.root_device
    shard = [(x[rank::world].to(device), y[rank::world].to(device)) for x, y in full]
    replicated = _linear_steps(strategy, shard)
    reference = _linear_steps(None, full)
    torch.testing.assert_close(replicated, reference, atol=1e-5, rtol=0)
    if rank == 0:
        print("parity ok", flush=True)


def _scenario_replicas() -> None:
    XLAStrategy.spawn(_replica)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    {
        "fit": _scenario_fit,
        "checkpoint": _scenario_checkpoint,
        "async_checkpoint": _scenario_async_checkpoint,
        "loader": _scenario_loader,
        "spmd": _scenario_spmd,
        "replicas": _scenario_replicas,
    }[os.environ["XLA_SCENARIO"]]()
