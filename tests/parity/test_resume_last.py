"""Parity by difference: which checkpoint ``fit(ckpt_path="last")`` resumes from.

Lightning takes the most recently written of every checkpoint callback's ``last`` (each
ModelCheckpoint's, an OnExceptionCheckpoint's file): the run that was interrupted, even when an
earlier, longer run left checkpoints of higher steps in the same folder, or when another
callback writes to another folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.parity.frameworks import BOTH, Framework, loader, quiet, regression

pytest.importorskip("lightning.pytorch")


class Crash(Exception):
    pass


def _crashing(fw: Framework, crash_at: int | None) -> Any:
    class Crashing(regression(fw.Module)):  # type: ignore[misc]
        def training_step(self, batch, batch_idx):
            if self.global_step == crash_at:
                raise Crash
            return super().training_step(batch, batch_idx)

    return Crashing()


def _step_resumed_from(fw: Framework, callbacks: Any, crash_at: int, earlier_run: bool) -> int:
    """Optionally a whole earlier run, then a run that crashes at ``crash_at``; then the same
    script with ``ckpt_path="last"``: the step it starts at."""
    options = quiet(max_epochs=5, enable_checkpointing=True, num_sanity_val_steps=0)
    if earlier_run:
        fw.trainer(callbacks=callbacks(), **options).fit(_crashing(fw, None), loader(8), loader(4))
    try:
        fw.trainer(callbacks=callbacks(), **options).fit(
            _crashing(fw, crash_at), loader(8), loader(4)
        )
    except Crash:
        pass
    starts: list[int] = []

    class Start(fw.Callback):  # type: ignore[misc, name-defined]
        def on_train_start(self, trainer: Any, module: Any) -> None:
            starts.append(trainer.global_step)

    resumed = fw.trainer(callbacks=[*callbacks(), Start()], **options)
    resumed.fit(_crashing(fw, None), loader(8), loader(4), ckpt_path="last")
    return starts[0]


@pytest.mark.parametrize(
    "scenario", ["an earlier run in the same folder", "two folders", "OnExceptionCheckpoint"]
)
def test_last_is_the_newest_checkpoint_any_callback_wrote(tmp_path: Path, scenario: str) -> None:
    started = {}
    for fw in BOTH:
        root = tmp_path / fw.name

        def callbacks(fw: Framework = fw, root: Path = root) -> list[Any]:
            checkpoint = fw.callbacks.ModelCheckpoint
            if scenario == "two folders":  # the first saves every 2 epochs only
                return [
                    checkpoint(dirpath=root / "a", save_last=True, every_n_epochs=2),
                    checkpoint(dirpath=root / "b", save_last=True),
                ]
            if scenario == "OnExceptionCheckpoint":
                return [
                    checkpoint(dirpath=root / "a", save_last=True),
                    fw.callbacks.OnExceptionCheckpoint(dirpath=root / "exc"),
                ]
            return [checkpoint(dirpath=root / "a", save_last=True)]

        started[fw.name] = _step_resumed_from(
            fw, callbacks, crash_at=13, earlier_run=scenario.startswith("an earlier")
        )
    assert started["lightning"] in (12, 13), "the scenario is wrong"  # 4 steps an epoch
    assert started["trainer"] == started["lightning"]
