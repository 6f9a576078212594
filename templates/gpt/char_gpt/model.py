"""The network, plain ``torch.nn``: a decoder-only transformer (GPT-2's layout, pre-norm).

Nothing here knows about training or distribution. ``TransformerBlock`` is the unit that
``fsdp`` shards one by one (the launch configs name it in ``fsdp_transformer_layer_cls_to_wrap``)
and that activation checkpointing recomputes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "CausalSelfAttention", "TransformerBlock", "sample_tokens"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions 0..t only."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be a multiple of n_head={n_head}.")
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads)
        q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        return self.resid_dropout(self.proj(y))


class TransformerBlock(nn.Module):
    """LayerNorm -> attention -> residual, LayerNorm -> MLP (4x wide, GELU) -> residual."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final LayerNorm and the vocab head.

    Args:
        vocab_size: number of token ids (256: the model reads UTF-8 bytes).
        block_size: the longest context, in tokens.
        n_layer / n_head / n_embd: depth, attention heads, width.
        dropout: dropout in attention, the MLP and on the embeddings.

    Example:
        >>> model = GPT(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)
        >>> model(torch.zeros(4, 32, dtype=torch.long)).shape
        torch.Size([4, 32, 256])
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(n_embd, n_head, dropout) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) so depth keeps the
        # residual stream's variance in check.
        for name, parameter in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids ``idx`` (B, T), T <= block_size."""
        time = idx.shape[1]
        if time > self.block_size:
            raise ValueError(
                f"sequence of {time} tokens is longer than block_size={self.block_size}."
            )
        positions = torch.arange(time, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; returns (B, T + new)."""
        return sample_tokens(
            self,
            idx,
            max_new_tokens,
            block_size=self.block_size,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
        )


@torch.no_grad()
def sample_tokens(
    forward: Callable[[torch.Tensor], torch.Tensor],
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    block_size: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend ``idx`` (B, T) with tokens sampled from ``forward``'s last-position logits.

    ``forward`` is the model, or the TrainModule that holds it: a sharded model (fsdp,
    deepspeed zero3) must be called through its outermost wrapped module. Every call runs
    exactly ``max_new_tokens`` forwards, so processes that shard the model stay in step even
    when they sample different tokens.
    """
    for _ in range(max_new_tokens):
        logits = forward(idx[:, -block_size:])[:, -1, :].float() / max(temperature, 1e-5)
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1)
        next_id = torch.multinomial(probs, num_samples=1, generator=generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx
