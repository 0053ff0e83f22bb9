"""A minimal nanoGPT-style decoder (Karpathy's nanoGPT `model.py`, reduced): learned positions,
GELU MLP (4x), Pre-LayerNorm, fused causal SDPA, tied embeddings, no biases in linear layers.
The speed reference for the workbench's decoder of the same shape: nothing here is pluggable,
so its tokens/s is what the plain architecture costs in eager PyTorch."""

import torch.nn.functional as F
from torch import Tensor, nn


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.up, self.down = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model, bias=False)

    def attn(self, x: Tensor) -> Tensor:
        B, n, d = x.shape
        q, k, v = (t.view(B, n, self.n_heads, d // self.n_heads).transpose(1, 2) for t in self.qkv(x).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, n, hd)
        return self.proj(y.transpose(1, 2).reshape(B, n, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.down(F.gelu(self.up(self.ln_2(x))))


class MinimalGPT(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, max_len: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]  # (B, n, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, n, vocab)
