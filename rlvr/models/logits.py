"""Log-probabilities and entropy from logits, numerically stable and in chunks.

A (B, T, V) float32 logits tensor for V = 49152 is 196 KB per token; the helpers take
row chunks so the temporary log-softmax never holds more than ``chunk_size`` rows of it.
"""

from __future__ import annotations

import torch


def _chunks(n: int, chunk_size: int | None):
    size = n if not chunk_size or chunk_size <= 0 else chunk_size
    for start in range(0, n, size):
        yield start, min(start + size, n)


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 for half-precision logits (softmax in bf16 loses digits), else the input's dtype."""
    return torch.promote_types(logits.dtype, torch.float32)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits)[label] per position: (..., V), (...) -> (...), at least float32."""
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    dtype = _compute_dtype(logits)
    out = torch.empty(flat_labels.shape, dtype=dtype, device=logits.device)
    for s, e in _chunks(flat_labels.shape[0], chunk_size):
        chunk = flat_logits[s:e].to(dtype)
        # logit[label] - logsumexp(logits): no full log-softmax tensor kept
        out[s:e] = chunk.gather(-1, flat_labels[s:e, None]).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
    return out.reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z per position: (..., V) -> (...), at least float32."""
    flat = logits.reshape(-1, logits.shape[-1])
    dtype = _compute_dtype(logits)
    out = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
    for s, e in _chunks(flat.shape[0], chunk_size):
        chunk = flat[s:e].to(dtype)
        probs = torch.softmax(chunk, dim=-1)
        out[s:e] = torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)
    return out.reshape(logits.shape[:-1])
