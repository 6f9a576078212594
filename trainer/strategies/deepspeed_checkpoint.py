"""DeepSpeed's checkpoint files inside our atomic checkpoint directory, written and read safely.

What this file owns: the layout (DeepSpeed's own files under ``deepspeed/<tag>/``, and a
``state.json`` entry with the tag, ZeRO stage, key prefix and DeepSpeed version), writing them
with ``engine.save_checkpoint`` on every rank into a staging folder that rank 0 commits, loading
them back into an engine, consolidating full weights in one process (`load_engine_weights`,
used by ``trainer checkpoint consolidate``), and reading every DeepSpeed ``*.pt`` file with
``weights_only=True``, both through the engine and through ``zero_to_fp32``.

What it does not own: the checkpoint format, manifest and atomic commit (``trainer.checkpoint``),
and deciding what a checkpoint holds (``DeepSpeedStrategy.save_checkpoint``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterable, Iterator
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
    "check_optimizer_placeholder",
    "load_engine_weights",
    "load_into_engine",
    "optimizer_placeholder",
    "save_engine_checkpoint",
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

    rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
    prefix = _key_prefix(engine.module.state_dict(), checkpoint.get("state_dict", {}))
    rest[STATE_KEY] = {
        "tag": _TAG, "zero_stage": zero_stage, "module_prefix": prefix, "version": version
    }  # fmt: skip

    def write_engine_shards(staging: Path) -> None:  # every rank writes its own
        engine.save_checkpoint(
            str(staging),
            tag=_TAG,
            client_state={},
            save_latest=False,
            exclude_frozen_parameters=exclude_frozen_parameters,
        )

    save_staged_checkpoint(strategy, path, ENGINE_DIR, write_engine_shards, rest)


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
