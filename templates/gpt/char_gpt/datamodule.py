"""The data: a text file read as UTF-8 bytes, cut into (input, next-token) windows.

Byte-level tokens keep the template free of a vocabulary file: for ASCII text (the bundled
Shakespeare) one byte is one character, and any other UTF-8 text works unchanged (a character
may take several tokens). The last ``val_fraction`` of the text is the validation set.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from trainer import ConfigurationError, DataModule

__all__ = ["DEFAULT_TEXT", "VOCAB_SIZE", "CharDataModule", "TextWindows", "decode", "encode"]

DEFAULT_TEXT = Path(__file__).resolve().parent / "corpus" / "shakespeare.txt"
VOCAB_SIZE = 256  # one token per byte


def encode(text: str) -> torch.Tensor:
    """Token ids (a 1-D long tensor) of ``text``: its UTF-8 bytes."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor | list[int]) -> str:
    """The text of token ids (bytes that do not form UTF-8 become U+FFFD)."""
    values = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    return bytes(int(v) for v in values).decode("utf-8", errors="replace")


class TextWindows(Dataset):
    """Windows of ``block_size + 1`` tokens every ``stride`` tokens, as (input, target) pairs.

    Example:
        >>> windows = TextWindows(encode("abcdefgh"), block_size=3, stride=2)
        >>> [decode(x) + ">" + decode(y) for x, y in windows]
        ['abc>bcd', 'cde>def', 'efg>fgh']
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, stride: int) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.stride = stride

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - self.block_size - 1) // self.stride + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.stride
        chunk = self.tokens[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class CharDataModule(DataModule):
    """A text file split into training and validation windows.

    Args:
        text_path: the UTF-8 text to learn (None: the bundled Shakespeare).
        block_size: tokens per training window (the model's ``block_size`` must be >= this).
        stride: tokens between window starts (None: ``block_size``, no overlap).
        batch_size: windows per batch per process.
        val_fraction: the share of the text, from its end, held out for validation.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        text_path: str | None = None,
        block_size: int = 64,
        stride: int | None = None,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if not 0.0 < val_fraction < 1.0:
            raise ConfigurationError(
                f"CharDataModule(val_fraction={val_fraction!r}): expected a float in (0, 1)."
            )
        self.train_set: TextWindows | None = None
        self.val_set: TextWindows | None = None

    def read_text(self) -> str:
        path = Path(self.hparams.text_path) if self.hparams.text_path else DEFAULT_TEXT
        if not path.is_file():
            raise ConfigurationError(
                f"CharDataModule(text_path={str(path)!r}): no such file. Point data.text_path "
                "at a UTF-8 text file, or leave it null for the bundled Shakespeare."
            )
        return path.read_text(encoding="utf-8")

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        tokens = encode(self.read_text())
        block, stride = self.hparams.block_size, self.hparams.stride or self.hparams.block_size
        split = int(len(tokens) * (1.0 - self.hparams.val_fraction))
        self.train_set = TextWindows(tokens[:split], block, stride)
        self.val_set = TextWindows(tokens[split:], block, block)
        if len(self.train_set) == 0 or len(self.val_set) == 0:
            raise ConfigurationError(
                f"CharDataModule: the text ({len(tokens)} tokens) is too short for "
                f"block_size={block} with val_fraction={self.hparams.val_fraction}."
            )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )
