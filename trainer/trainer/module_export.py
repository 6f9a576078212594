"""Lightning's export methods of a module: ``to_onnx`` and ``to_torchscript``.

`ExportMixin` gives `trainer.TrainModule` Lightning 2.6's two methods with its arguments: the
input comes from ``input_sample`` / ``example_inputs`` or the module's ``example_input_array``
and goes through the module's batch-transfer hooks to its device, the export runs in eval mode
without gradients, and the module's train / eval mode is put back. The exporters are torch's
own (``torch.onnx.export``, ``torch.jit.script`` / ``torch.jit.trace``). Unlike Lightning's, a
file is written atomically: into a temporary folder beside it, fsynced, then renamed into
place (an ONNX model's external-data files first, the model last), so a crash never leaves a
half-written model under the name; and the ONNX export runs in eval mode.

This module owns only that wrapping; the TorchScript view of the module's properties (which
``torch.jit.script`` must skip) is ``__jit_unused_properties__`` on `trainer.TrainModule`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from trainer._imports import require
from trainer._warnings import warn_user
from trainer.checkpoint.atomic import fsync_directory, process_tag
from trainer.errors import CheckpointError, ConfigurationError

if TYPE_CHECKING:
    from torch.onnx import ONNXProgram

__all__ = ["ExportMixin", "save_files_atomically"]

_METHODS = ("script", "trace")


class ExportMixin:
    """``to_onnx`` and ``to_torchscript`` for a `trainer.TrainModule` (Lightning's)."""

    if TYPE_CHECKING:  # no class annotations at run time: TorchScript would read them
        example_input_array: Any
    _jit_is_scripting = False  # the `trainer` property returns None while True

    def to_onnx(
        self,
        file_path: str | os.PathLike[str] | IO[bytes] | None = None,
        input_sample: Any = None,
        **kwargs: Any,
    ) -> ONNXProgram | None:
        """Export the module's ``forward`` to ONNX with ``torch.onnx.export``.

        Args:
            file_path: where to write the model (written atomically), a binary file object, or
                None to write nothing (the returned ``ONNXProgram`` can be saved later).
            input_sample: the input to export with; default ``self.example_input_array``.
            **kwargs: passed to ``torch.onnx.export`` (``dynamo=False`` picks the TorchScript
                exporter, ``dynamic_shapes=``, ``input_names=``, ...).

        Returns:
            torch's ``ONNXProgram`` (the default exporter), or None (``dynamo=False``).

        Raises:
            MissingDependencyError: ``onnx`` (and, for the default exporter, ``onnxscript``) is
                not installed: ``pip install 'trainer[onnx]'``.
            ConfigurationError: no ``input_sample`` and no ``example_input_array``.

        Examples:
            >>> module.example_input_array = torch.randn(1, 64)
            >>> module.to_onnx("model.onnx")
        """
        feature = f"{type(self).__name__}.to_onnx()"
        require("onnx", extra="onnx", feature=feature)
        if kwargs.get("dynamo", True):
            require("onnxscript", extra="onnx", feature=feature)
        sample = self._export_input(input_sample, "to_onnx", "input_sample")
        module: Any = self
        with self._exporting():
            if file_path is None or not isinstance(file_path, str | os.PathLike):
                return torch.onnx.export(module, sample, file_path, **kwargs)
            programs: list[ONNXProgram | None] = []
            save_files_atomically(
                file_path,
                lambda path: programs.append(torch.onnx.export(module, sample, path, **kwargs)),
            )
            return programs[0]

    def to_torchscript(
        self,
        file_path: str | os.PathLike[str] | IO[bytes] | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> torch.jit.ScriptModule:
        """The module compiled by TorchScript (``torch.jit.script``, or ``torch.jit.trace`` with
        ``method="trace"``), in eval mode; saved with ``torch.jit.save`` when ``file_path`` is
        given (atomically for a path). TorchScript is deprecated in PyTorch: a
        ``DeprecationWarning`` says so, as Lightning's does.

        Args:
            file_path: where to save the compiled module, a binary file object, or None.
            method: "script" (compile ``forward`` and what it calls) or "trace" (record one
                call on ``example_inputs``).
            example_inputs: the input to trace with; default ``self.example_input_array``.
            **kwargs: passed to ``torch.jit.script`` / ``torch.jit.trace``.

        Raises:
            ConfigurationError: ``method`` is neither "script" nor "trace", or tracing has no
                ``example_inputs`` and no ``example_input_array``.

        Examples:
            >>> scripted = module.to_torchscript("model.pt")
            >>> torch.jit.load("model.pt")(torch.randn(1, 64))
        """
        warn_user(
            f"{type(self).__name__}.to_torchscript: TorchScript is deprecated in PyTorch (and "
            "this method in Lightning 2.7); export with to_onnx() or torch.export.export().",
            DeprecationWarning,
        )
        if method not in _METHODS:
            raise ConfigurationError(
                f"{type(self).__name__}.to_torchscript(method={method!r}): expected one of "
                f"{list(_METHODS)}."
            )
        module: Any = self
        with self._exporting():
            if method == "script":
                compiled = torch.jit.script(module, **kwargs)
            else:
                sample = self._export_input(example_inputs, "to_torchscript", "example_inputs")
                compiled = torch.jit.trace(module, example_inputs=sample, **kwargs)
        if isinstance(file_path, str | os.PathLike):
            save_files_atomically(file_path, lambda path: torch.jit.save(compiled, path))
        elif file_path is not None:
            torch.jit.save(compiled, file_path)
        return compiled

    @contextlib.contextmanager
    def _exporting(self) -> Iterator[None]:
        """Eval mode, no gradients, ``trainer`` None for TorchScript; the mode put back after."""
        module: Any = self
        was_training = module.training
        self._jit_is_scripting = True
        try:
            with torch.no_grad():
                module.eval()
                yield
        finally:
            self._jit_is_scripting = False
            module.train(was_training)

    def _export_input(self, given: Any, method: str, argument: str) -> Any:
        """``given`` or ``example_input_array``, through the batch-transfer hooks to the
        module's device (Lightning's order, dataloader_idx 0)."""
        sample = self.example_input_array if given is None else given
        if sample is None:
            raise ConfigurationError(
                f"{type(self).__name__}.{method}() needs an input: pass {argument}=... or set "
                "self.example_input_array."
            )
        module: Any = self
        sample = module.on_before_batch_transfer(sample, 0)
        sample = module.transfer_batch_to_device(sample, module.device, 0)
        return module.on_after_batch_transfer(sample, 0)


def save_files_atomically(final: str | os.PathLike[str], save: Callable[[Path], Any]) -> None:
    """Run ``save(path)`` into a temporary folder beside ``final`` (``path`` has ``final``'s
    name), then move every file it wrote beside ``final``, ``final`` itself last, each fsynced
    and renamed, then the folder fsynced.

    Raises:
        CheckpointError: a file could not be written or moved (the temporary folder is removed).
    """
    final = Path(final)
    staging = final.parent / f".{final.name}.tmp-{process_tag()}"
    try:
        staging.mkdir(parents=False)
        save(staging / final.name)
        written = sorted(staging.iterdir(), key=lambda path: path.name == final.name)
        for path in written:
            with open(path, "rb") as file:
                os.fsync(file.fileno())
            os.replace(path, final.parent / path.name)
        fsync_directory(final.parent)
    except OSError as err:
        raise CheckpointError(f"writing {final} failed: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
