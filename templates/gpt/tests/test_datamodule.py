"""The data: byte tokens, shifted windows, the bundled corpus."""

import pytest
import torch
from trainer import ConfigurationError

from char_gpt.datamodule import (
    DEFAULT_TEXT,
    CharDataModule,
    TextWindows,
    decode,
    encode,
)


def test_encode_and_decode_round_trip() -> None:
    text = "First Citizen:\nBefore we proceed"

    assert decode(encode(text)) == text


def test_targets_are_the_inputs_shifted_by_one() -> None:
    windows = TextWindows(torch.arange(100), block_size=8, stride=4)

    inputs, targets = windows[3]
    assert torch.equal(targets[:-1], inputs[1:])
    assert int(inputs[0]) == 12
    assert len(windows) == (100 - 8 - 1) // 4 + 1


def test_bundled_corpus_is_shakespeare_and_small() -> None:
    text = DEFAULT_TEXT.read_text(encoding="utf-8")

    assert text.startswith("First Citizen:")
    assert 10_000 < len(text) < 300_000
    assert text.isascii()


def test_datamodule_holds_out_the_end_of_the_text() -> None:
    data = CharDataModule(block_size=32, batch_size=4, val_fraction=0.1)
    data.setup("fit")

    inputs, targets = next(iter(data.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 32)
    text = DEFAULT_TEXT.read_bytes()
    split = int(len(text) * 0.9)
    assert decode(data.val_set.tokens) == text[split:].decode("ascii")
    assert len(data.val_set) == (len(text) - split - 33) // 32 + 1


def test_a_missing_text_file_says_what_to_set(tmp_path) -> None:
    data = CharDataModule(text_path=str(tmp_path / "missing.txt"))

    with pytest.raises(ConfigurationError, match=r"data\.text_path"):
        data.setup("fit")
