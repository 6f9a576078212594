"""The network: shapes, causality, generation."""

import pytest
import torch

from char_gpt.model import GPT


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def test_forward_gives_logits_for_every_position() -> None:
    logits = tiny_gpt()(torch.randint(0, 256, (3, 16)))

    assert logits.shape == (3, 16, 256)


def test_a_position_never_sees_the_future() -> None:
    model = tiny_gpt().eval()
    ids = torch.randint(0, 256, (1, 16))
    changed = ids.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 256

    with torch.no_grad():
        before, after = model(ids), model(changed)

    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_generate_appends_the_asked_number_of_tokens_beyond_the_context() -> None:
    out = tiny_gpt().generate(torch.zeros(2, 4, dtype=torch.long), max_new_tokens=20, top_k=5)

    assert out.shape == (2, 24)
    assert int(out.max()) < 256


def test_too_long_a_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size=16"):
        tiny_gpt()(torch.zeros(1, 17, dtype=torch.long))
