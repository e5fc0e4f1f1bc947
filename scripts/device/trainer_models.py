"""Models for the real trainers of issue 61 (scripts/device/gpu_trainer_*.py), from
random weights: a GPT of pre-norm blocks (as nanoGPT's), and a llama-like decoder
(RMSNorm, SwiGLU, causal attention) whose layers FSDP2 shards and pipelining splits."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GptBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2, self.heads = nn.LayerNorm(dim), nn.LayerNorm(dim), heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.proj(attention(self.qkv(self.ln1(x)), self.heads))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, layers, dim, heads, block, vocab):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(GptBlock(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def attention(qkv, heads):
    b, t, three_d = qkv.shape
    q, k, v = qkv.view(b, t, 3, heads, three_d // 3 // heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b, t, three_d // 3)


class LlamaBlock(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.n1, self.n2, self.heads = nn.RMSNorm(dim), nn.RMSNorm(dim), heads
        self.qkv, self.o = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        x = x + self.o(attention(self.qkv(self.n1(x)), self.heads))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LlamaStage(nn.Module):
    """Layers [first, last) of a llama-like decoder; the embedding on the first stage,
    the norm and head on the last (one stage: the whole model)."""

    def __init__(self, dim, heads, hidden, vocab, layers, first=True, last=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim) if first else None
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim) if last else None
        self.head = nn.Linear(dim, vocab, bias=False) if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)) if self.head is not None else x


def lm_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
