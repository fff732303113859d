"""Token log-probs and entropy from hidden states, a chunk of logits at a time.

Why: the plain route materialises float32 logits for every position of a micro-batch (and a
log-softmax copy, and their gradients): 4 sequences x 8192 tokens x 152k vocabulary is ~20 GB
per tensor. Here the output layer runs on `chunk_tokens` positions at a time and, under
autograd, each chunk is checkpointed, so backward recomputes its logits instead of keeping them:
peak memory for the head is one chunk's logits, whatever the sequence length. The results equal
`log_softmax(logits).gather(labels)` and the softmax entropy of the full logits (tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ENTROPY_MODES = ("none", "metric", "grad")   # not wanted / reported only / part of the loss


def _chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           labels: torch.Tensor, temperature: float, entropy: str):
    logits = F.linear(h, weight, bias)
    if logits.dtype in (torch.float16, torch.bfloat16):   # softmax in float32
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, labels[:, None])[:, 0] - lse
    if entropy == "none":
        return logp, torch.zeros_like(logp)
    if entropy == "grad":
        return logp, lse - (torch.softmax(logits, -1) * logits).sum(-1)
    with torch.no_grad():   # a metric: no graph through the (chunk, V) softmax
        return logp, lse.detach() - (torch.softmax(logits.detach(), -1) * logits.detach()).sum(-1)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     labels: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = 1024,
                     entropy: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(labels), entropy), each shaped like `labels`; hidden is (..., H), labels (...).
    `entropy`: "none" (zeros), "metric" (no gradient) or "grad"."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy={entropy!r}: expected one of {ENTROPY_MODES}")
    shape = labels.shape
    h, y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    lps, ents = [], []
    for s in range(0, y.numel(), max(1, chunk_tokens)):
        args = (h[s:s + chunk_tokens], weight, bias, y[s:s + chunk_tokens], temperature, entropy)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(shape, dtype=torch.float32)
        return empty, empty
    return torch.cat(lps).view(shape), torch.cat(ents).view(shape)
