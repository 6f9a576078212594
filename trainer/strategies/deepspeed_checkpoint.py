"""DeepSpeed's checkpoint files inside our atomic checkpoint directory, written and read safely.

What this file owns: the layout (DeepSpeed's own files under ``deepspeed/<tag>/``, and a
``state.json`` entry with the tag, ZeRO stage, key prefix and DeepSpeed version), writing them
with ``engine.save_checkpoint`` on every rank into a staging folder that rank 0 commits (at once,
or, for ``AsyncCheckpointIO``, staged: `stage_engine_checkpoint` runs ``engine.save_checkpoint``
with a checkpoint engine of DeepSpeed's interface that copies each file's state to host memory
and defers its write, and the plugin's writer thread writes the copies with DeepSpeed's own
checkpoint engine and commits), loading them back into an engine, consolidating full weights in one process (`load_engine_weights`,
used by ``trainer checkpoint consolidate``), and reading every DeepSpeed ``*.pt`` file with
``weights_only=True``, both through the engine and through ``zero_to_fp32``.

What it does not own: the checkpoint format, manifest and atomic commit (``trainer.checkpoint``),
and deciding what a checkpoint holds (``DeepSpeedStrategy.save_checkpoint``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import CheckpointError
from trainer.strategies.deepspeed_engine import import_deepspeed

if TYPE_CHECKING:
    from trainer.checkpoint.sharded import ShardedStrategy

__all__ = [
    "ENGINE_DIR",
    "STATE_KEY",
    "EngineState",
    "StagedCheckpoint",
    "check_optimizer_placeholder",
    "load_engine_weights",
    "load_into_engine",
    "optimizer_placeholder",
    "save_engine_checkpoint",
    "stage_engine_checkpoint",
    "stage_full_checkpoint",
    "with_gathered_weights",
]

ENGINE_DIR = "deepspeed"  # the checkpoint's sub-directory that holds DeepSpeed's own files
STATE_KEY = "deepspeed"  # state.json entry: tag, ZeRO stage, key prefix, DeepSpeed version
_TAG = "checkpoint"  # DeepSpeed's tag (sub-directory) inside ENGINE_DIR
_SAVED_BY_ENGINE = "deepspeed"  # optimizer_placeholder's marker: {"saved_by": "deepspeed"}


class EngineState(dict):
    """Stands for weights or optimizer state that ``engine.load_checkpoint`` already restored."""


def optimizer_placeholder(zero_stage: int) -> dict[str, Any]:
    """What stands in a checkpoint for the optimizer state ``engine.save_checkpoint`` shards."""
    return {"saved_by": _SAVED_BY_ENGINE, "zero_stage": zero_stage}


def check_optimizer_placeholder(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any], *, is_restored: bool
) -> None:
    """Accept `optimizer_placeholder` once ``engine.load_checkpoint`` restored ``optimizer``.

    Raises:
        CheckpointError: the state was not restored by the engine (saved elsewhere, or by
            ``Accelerator.save_state``, which does not write DeepSpeed's shards).
    """
    is_placeholder = state_dict.get("saved_by") == _SAVED_BY_ENGINE
    if is_placeholder and is_restored:
        return
    where = (
        "its state lives in DeepSpeed's shards of a checkpoint directory; resume with "
        "fit(ckpt_path=...) / strategy.load_checkpoint on a checkpoint that "
        "trainer.save_checkpoint / strategy.save_checkpoint wrote"
        if is_placeholder
        else "it is a torch optimizer's state from another strategy; load only the weights "
        "(module.load_state_dict(read_checkpoint(path)['state_dict'])) and fit without "
        "ckpt_path"
    )
    raise CheckpointError(
        f"DeepSpeedStrategy: this optimizer state cannot be loaded into DeepSpeed's "
        f"{type(optimizer).__name__}: {where}."
    )


def save_engine_checkpoint(
    strategy: ShardedStrategy,
    engine: Any,
    path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    *,
    zero_stage: int,
    version: str,
    exclude_frozen_parameters: bool,
) -> None:
    """Every rank writes DeepSpeed's shards into a staging directory; rank 0 commits.

    The committed directory holds ``deepspeed/`` (the engine's weights and optimizer state, in
    place of ``checkpoint``'s ``state_dict`` and ``optimizer_states``), ``state.json`` with the
    rest of ``checkpoint`` and the `STATE_KEY` entry, and the manifest listing every file.
    """
    from trainer.checkpoint.sharded import save_staged_checkpoint

    rest = _engine_rest(engine, checkpoint, zero_stage=zero_stage, version=version)

    def write_engine_shards(staging: Path) -> None:  # every rank writes its own
        _save_engine_files(engine, staging, exclude_frozen_parameters)

    save_staged_checkpoint(strategy, path, ENGINE_DIR, write_engine_shards, rest)


def _engine_rest(
    engine: Any, checkpoint: dict[str, Any], *, zero_stage: int, version: str
) -> dict[str, Any]:
    """What rank 0 writes beside DeepSpeed's files: ``checkpoint`` without the state DeepSpeed
    holds, with the `STATE_KEY` entry."""
    rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
    prefix = _key_prefix(engine.module.state_dict(), checkpoint.get("state_dict", {}))
    rest[STATE_KEY] = {
        "tag": _TAG, "zero_stage": zero_stage, "module_prefix": prefix, "version": version
    }  # fmt: skip
    return rest


def _save_engine_files(engine: Any, staging: Path, exclude_frozen_parameters: bool) -> None:
    engine.save_checkpoint(
        str(staging),
        tag=_TAG,
        client_state={},
        save_latest=False,
        exclude_frozen_parameters=exclude_frozen_parameters,
    )


# ---- background saves: staged here, written by trainer.plugins' writer thread ---------------
@dataclasses.dataclass
class StagedCheckpoint:
    """A checkpoint copied to host memory on the training thread, to be written later.

    Made on every rank by `stage_engine_checkpoint` (or `stage_full_checkpoint`);
    ``trainer.plugins.AsyncCheckpointIO`` writes ``files`` on its writer thread (each with
    ``save``, DeepSpeed's own checkpoint engine, then ``commit``), and process 0 commits the
    checkpoint with ``rest`` as a synchronous save does.

    Attributes:
        staging: the staging folder agreed for the first destination; DeepSpeed's folders and
            the files it wrote itself are already in it.
        subdir: the checkpoint's folder for DeepSpeed's files (`ENGINE_DIR`); None for a
            weights-only checkpoint, which process 0 writes whole from ``rest``.
        rest: what process 0 writes beside them (a host copy; empty on the other processes).
        files: this rank's DeepSpeed files, as (path relative to the staging folder, host
            copy of the state that ``engine.save_checkpoint`` gave its checkpoint engine).
        copied: files DeepSpeed wrote itself at once (its recovery scripts), on process 0:
            (relative path, content), for another destination.
        save: DeepSpeed's checkpoint engine's ``save(state_dict, path)``.
        commit: its ``commit``, once this rank's files are written.
    """

    staging: Path
    subdir: str | None
    rest: dict[str, Any]
    files: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    copied: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)
    save: Callable[[Any, str], Any] | None = None
    commit: Callable[[], Any] | None = None


def stage_engine_checkpoint(
    strategy: ShardedStrategy,
    engine: Any,
    path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    *,
    stage: Callable[[Any], Any],
    zero_stage: int,
    version: str,
    exclude_frozen_parameters: bool,
) -> StagedCheckpoint | None:
    """`save_engine_checkpoint`'s files copied now and written later (every rank, training thread).

    ``engine.save_checkpoint`` runs as in a synchronous save, into an agreed staging folder,
    with a checkpoint engine that copies each state dict it is given with ``stage`` and writes
    nothing; DeepSpeed's own checkpoint engine writes the copies later (`StagedCheckpoint`).

    Returns:
        The staged checkpoint; None when DeepSpeed writes with another checkpoint engine than
        its default one (a ``checkpoint.writer`` in its config) or swaps optimizer state to
        NVMe: save it synchronously.

    Raises:
        CheckpointError: on every rank, when ``path`` holds something that is not a checkpoint,
            its folder cannot be created, or a value cannot be stored (naming where it is).
    """
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    from trainer.checkpoint.sharded import agree_on_staging

    original = engine.checkpoint_engine
    if type(original) is not TorchCheckpointEngine or engine.zero_nvme_offload_optimizer():
        return None
    final = Path(path)
    rest = _engine_rest(engine, checkpoint, zero_stage=zero_stage, version=version)
    staging = agree_on_staging(
        strategy, final, ENGINE_DIR, check=lambda: _refusal_to_stage(final, rest)
    )
    deferring = _deferring_engine_class()(original, staging, stage)
    engine.checkpoint_engine = deferring
    try:
        _save_engine_files(engine, staging, exclude_frozen_parameters)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        engine.checkpoint_engine = original
    is_zero = strategy.is_global_zero
    return StagedCheckpoint(
        staging, ENGINE_DIR, stage(rest) if is_zero else {}, files=deferring.files,
        copied=_read_files(staging) if is_zero else [], save=original.save,
        commit=functools.partial(original.commit, deferring.info),
    )  # fmt: skip


def stage_full_checkpoint(
    strategy: ShardedStrategy,
    path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    *,
    stage: Callable[[Any], Any],
) -> StagedCheckpoint:
    """A whole checkpoint (weights-only, gathered) copied now; process 0 writes it later.

    Raises:
        CheckpointError: on every rank, as `stage_engine_checkpoint` does.
    """
    from trainer.checkpoint.sharded import agree_on_staging

    final = Path(path)
    rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
    check = functools.partial(_refusal_to_stage, final, rest)
    staging = agree_on_staging(strategy, final, "full", check=check)
    return StagedCheckpoint(staging, None, stage(checkpoint) if strategy.is_global_zero else {})


def _refusal_to_stage(final: Path, rest: dict[str, Any]) -> str | None:
    """On rank 0, before anything is copied: why the state cannot be stored, or None (a folder
    that cannot be created is `agree_on_staging`'s own refusal)."""
    from trainer.checkpoint.codec import encode

    try:
        encode(rest, {}, "state")
    except CheckpointError as err:
        return str(err)
    return None


def _read_files(folder: Path) -> list[tuple[str, bytes]]:
    """Every file in ``folder``: (relative "/"-separated path, content)."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            file = Path(root, name)
            found.append((file.relative_to(folder).as_posix(), file.read_bytes()))
    return found


@functools.cache
def _deferring_engine_class() -> type:
    """DeepSpeed's ``CheckpointEngine`` that copies and defers (built once DeepSpeed is imported)."""
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    class DeferringCheckpointEngine(CheckpointEngine):
        """Stands in for ``original`` during ``engine.save_checkpoint``: ``save`` copies the state
        dict with ``stage`` and notes its path (relative to ``root``); ``commit`` notes the
        commit info. Folders are made at once; nothing else is written."""

        def __init__(self, original: Any, root: Path, stage: Callable[[Any], Any]) -> None:
            super().__init__()
            self.name = "DeferringCheckpointEngine"
            self.original, self.root, self.stage = original, root, stage
            self.files: list[tuple[str, Any]] = []
            self.info: Any = None

        def create(self, info: Any) -> None:
            self.original.create(info)

        def save(self, state_dict: Any, path: str) -> None:
            name = Path(path).relative_to(self.root).as_posix()
            self.files.append((name, self.stage(state_dict)))

        def load(self, path: str, map_location: Any = None) -> Any:
            return self.original.load(path, map_location=map_location)

        def commit(self, info: Any) -> bool:
            self.info = info
            return True

        def is_data_parallel_writer(self, dp_rank: int) -> bool:
            return self.original.is_data_parallel_writer(dp_rank)

        def preserves_storage_sharing(self) -> bool:
            return self.original.preserves_storage_sharing()

    return DeferringCheckpointEngine


def with_gathered_weights(checkpoint: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with its ``state_dict`` replaced by ``full`` (the engine's gathered ZeRO-3
    weights), keyed as the module whose state dict the checkpoint holds."""
    prefix = _key_prefix(full.keys(), checkpoint.get("state_dict", {}).keys())
    state = {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
    return {**checkpoint, "state_dict": state}


def load_into_engine(engine: Any, directory: Path, info: dict[str, Any] | None) -> None:
    """``engine.load_checkpoint`` on a verified directory: weights, optimizer state, counters.

    Args:
        engine: the running ``DeepSpeedEngine``.
        directory: the checkpoint directory (holding ``deepspeed/``), already verified.
        info: its ``state.json`` `STATE_KEY` entry.

    Raises:
        CheckpointError: the checkpoint does not fit the engine (another world size or stage).
    """
    tag = _checked_tag(directory, info)
    try:
        with _weights_only_engine_loads(engine):
            loaded, _ = engine.load_checkpoint(
                str(directory / ENGINE_DIR), tag=tag, load_lr_scheduler_states=False
            )
    except (RuntimeError, ValueError, KeyError, AssertionError, FileNotFoundError) as err:
        raise CheckpointError(
            f"{directory}: DeepSpeed could not load it into this engine ({err}). Resume with "
            "the same number of processes and ZeRO stage, or consolidate it (`trainer "
            "checkpoint consolidate`) and load the weights."
        ) from err
    if loaded is None:
        raise CheckpointError(f"{directory}: DeepSpeed found no checkpoint with tag {tag!r}.")


def load_engine_weights(
    directory: str | os.PathLike[str], info: dict[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """Full weights from a checkpoint's DeepSpeed shards, in this one process.

    ZeRO 1-3: fp32 master weights merged with
    ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``; stage 0: the
    module's weights as saved. Keys are those of the module the Trainer/Accelerator saved.

    Args:
        directory: the checkpoint directory (holding ``deepspeed/``), already verified.
        info: its ``state.json`` ``"deepspeed"`` entry (tag, zero_stage, module_prefix); read
            from the directory when None.

    Raises:
        CheckpointError: the shards cannot be read.
    """
    directory = Path(directory)
    if info is None:
        info = json.loads((directory / "state.json").read_text(encoding="utf-8")).get(STATE_KEY)
    info = info or {}
    tag, prefix = _checked_tag(directory, info), info.get("module_prefix", "")
    engine_dir = directory / ENGINE_DIR
    import_deepspeed()
    try:
        if int(info.get("zero_stage", 1)) == 0:
            states = engine_dir / tag / "mp_rank_00_model_states.pt"
            saved = _load_engine_file(states)["module"]
        else:
            from deepspeed.utils import zero_to_fp32

            # zero_to_fp32 calls torch.load(weights_only=False) through its module's `torch`
            # name; for this call that name is torch with a weights-only load.
            with (
                _patched(zero_to_fp32, "torch", _WeightsOnlyTorch()),
                contextlib.redirect_stdout(io.StringIO()),  # it prints a line per file
            ):
                saved = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                    str(engine_dir), tag=tag
                )
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(
            f"{engine_dir}: DeepSpeed's shards could not be read: {err}."
        ) from err
    return {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}


def _key_prefix(outer: Iterable[str], inner: Iterable[str]) -> str:
    """The prefix that turns ``inner`` keys into ``outer`` ones ("module." when the engine wraps a
    module around the one whose state dict was asked for), or ""."""
    outer_keys, inner_keys = set(outer), list(inner)
    if not inner_keys:
        return ""
    first = inner_keys[0]
    for key in outer_keys:
        prefix = key[: len(key) - len(first)]
        if key.endswith(first) and (not prefix or prefix.endswith(".")):
            if all(prefix + k in outer_keys for k in inner_keys):
                return prefix
    return ""


def _checked_tag(directory: Path, info: dict[str, Any] | None) -> str:
    """The DeepSpeed tag from ``state.json``, refused unless it names a folder in ``deepspeed/``."""
    from trainer.checkpoint.paths import resolve_inside

    tag = (info or {}).get("tag", _TAG)
    resolve_inside(directory / ENGINE_DIR, tag, source=directory / "state.json", field="tag")
    return tag


# ---- reading DeepSpeed's files without running code ------------------------------------------
def _engine_safe_globals() -> list[Any]:
    """The classes DeepSpeed's optimizer files pickle besides tensors: data classes and enums."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _load_engine_file(file: str | os.PathLike[str], *, mmap: bool = False) -> Any:
    """One of DeepSpeed's ``*.pt`` files, read with ``weights_only=True`` (never runs code)."""
    from trainer.checkpoint.safe_unpickle import load_weights_only

    return load_weights_only(file, source=file, safe_globals=_engine_safe_globals(), mmap=mmap)


@contextlib.contextmanager
def _weights_only_engine_loads(engine: Any) -> Iterator[None]:
    """``engine.load_checkpoint`` reads every file through ``engine.checkpoint_engine.load``
    (``torch.load(weights_only=False)``); for the duration, that is `_load_engine_file`."""
    checkpoint_engine = engine.checkpoint_engine

    def load(path: str, map_location: Any = None) -> Any:
        return _load_engine_file(path)

    checkpoint_engine.load = load  # an instance attribute shadows the class's method
    try:
        yield
    finally:
        del checkpoint_engine.load


class _WeightsOnlyTorch:
    """``torch`` for DeepSpeed's ``zero_to_fp32`` module: the same, but ``load`` is weights-only."""

    def load(self, file: Any, map_location: Any = None, mmap: bool = False, **_: Any) -> Any:
        return _load_engine_file(file, mmap=mmap)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` for the duration (DeepSpeed offers no hook to pass it in)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
