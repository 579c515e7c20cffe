"""Sampling parameters and the token sampler of the native engine.

Sampling is inverse-CDF: each row draws one uniform number per step and takes the token
where the cumulative probability passes it. That costs a softmax and a cumsum over the
vocabulary, several times cheaper on a CPU than ``torch.multinomial`` or Gumbel noise
(which draw a random number per vocabulary entry). The uniforms come from a generator
seeded per call and are drawn for every row of the batch at every step, finished or not,
so a row's samples do not depend on which other rows are still decoding.

The search and the uniforms are float64. In float32 the cumulative sum over a 49k
vocabulary reaches 1 with a spacing of 6e-8, so tail tokens below that probability get an
empty interval (never drawn) and rounding moves mass onto their neighbours; in float64
every token above ~1e-15 keeps its own interval, so tokens are drawn from the distribution
whose log-probs are reported (``inverse_cdf``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlvr.config.schema import RolloutConfig


SAMPLING_EPS = 1e-5
"""A temperature below this samples greedily (vLLM's ``_SAMPLING_EPS``)."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    row_offset: int = 0
    """Data-parallel ranks: this batch's first row in the whole batch, which has ``total_rows``;
    each step draws the whole batch's uniforms and keeps this part, so a row samples the same
    tokens on any number of ranks."""
    total_rows: int = 0
    row_ids: tuple[int, ...] = ()
    """Each prompt's row in the whole batch, when the prompts are not consecutive rows from
    ``row_offset`` (a multi-turn turn over the requests still running): a row's uniforms then do
    not depend on which other rows take part."""

    @property
    def greedy(self) -> bool:
        """No sampling, or a temperature below ``SAMPLING_EPS`` (vLLM's rule: logits / 1e-50 are inf in
        float32, and every log-prob NaN)."""
        return not self.do_sample or self.temperature < SAMPLING_EPS

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the distribution the reported log-probs come from (1 for greedy)."""
        return 1.0 if self.greedy else self.temperature

    @classmethod
    def from_config(cls, config: RolloutConfig, max_new_tokens: int, meta: dict[str, Any] | None = None):
        """Config values, overridden by ``meta_info`` keys of the same names (and ``max_new_tokens``)."""
        params = cls(max_new_tokens=max_new_tokens, do_sample=config.do_sample, temperature=config.temperature,
                     top_p=config.top_p, top_k=config.top_k, min_p=config.min_p, stop=tuple(config.stop),
                     seed=config.seed)
        meta = meta or {}
        overrides = {k: meta[k] for k in ("do_sample", "temperature", "top_p", "top_k", "min_p", "seed",
                                          "max_new_tokens", "row_offset", "total_rows") if k in meta}
        if "stop" in meta:
            overrides["stop"] = tuple(meta["stop"])
        return replace(params, **overrides)


def filter_probs(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Zero the tokens that top-k, top-p and min-p exclude (rows need not sum to 1 after)."""
    if params.top_k is not None and 0 < params.top_k < probs.shape[-1]:
        kth = torch.topk(probs, params.top_k, dim=-1).values[:, -1:]  # (B, 1)
        probs = probs.masked_fill(probs < kth, 0.0)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        total = sorted_probs.sum(dim=-1, keepdim=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        # keep the smallest prefix reaching top_p: a token goes once the mass before it does (at an
        # exact tie too, as transformers' and vLLM's "cumulative from the tail <= 1 - top_p")
        drop_sorted = before >= params.top_p * total
        drop_sorted[..., 0] = False  # the most likely token always stays (a top_p of 1e-50 dropped every token)
        probs = probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return probs


def sample_tokens(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None):
    """Pick one token per row and its log-prob under the distribution it was drawn from.  (B, V) -> (B,), (B,)

    That is softmax(logits / T); with top-k, top-p or min-p it is softmax(logits / T)
    renormalised over the tokens they keep (as vLLM reports), so the rollout's log-probs are
    those of the sampler, and pi_old / pi_rollout measures what truncation did."""
    logits = logits.float()
    log_probs = torch.log_softmax(logits / params.logprob_temperature, dim=-1)  # (B, V)
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    probs = log_probs.exp()
    kept = filter_probs(probs, params)
    tokens = inverse_cdf(kept, uniforms.unsqueeze(-1)).squeeze(-1)
    token_log_probs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if kept is probs:  # nothing truncated
        return tokens, token_log_probs
    return tokens, token_log_probs - torch.log(kept.sum(dim=-1, dtype=torch.float64)).float()


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Tokens where each row's cumulative probability passes ``uniform * total``.  (B, V), (B, m) -> (B, m)

    ``uniforms`` lie in (0, 1]; ``probs`` need not sum to 1 (filtered). The search runs in two
    float64 levels (see the module docstring): the vocabulary's blocks of ``block`` tokens by
    their summed mass, then the tokens of the chosen block, so only one block per draw gets a
    cumulative sum (3x faster than a float32 cumsum over 49k tokens, and exact). A token of
    probability 0 is never chosen."""
    B, V = probs.shape
    if V % block:
        probs = torch.nn.functional.pad(probs, (0, block - V % block))  # padding has probability 0
    blocks = probs.view(B, -1, block)  # (B, nb, K)
    block_cdf = blocks.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # (B, nb)
    target = uniforms.to(torch.float64) * block_cdf[:, -1:]  # (B, m), in (0, total]
    b = torch.searchsorted(block_cdf, target).clamp(max=blocks.shape[1] - 1)  # (B, m)
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks[torch.arange(B, device=probs.device).unsqueeze(-1), b]  # (B, m, K)
    rest = (target - before).clamp(min=torch.finfo(torch.float64).tiny).unsqueeze(-1)  # (B, m, 1)
    k = torch.searchsorted(inner.cumsum(dim=-1, dtype=torch.float64), rest).clamp(max=block - 1)  # (B, m, 1)
    # rounding can put ``rest`` a hair past the block's own sum: take its last token with mass
    last = block - 1 - (inner.flip(-1) > 0).to(torch.uint8).argmax(dim=-1, keepdim=True)
    k = torch.where(inner.gather(-1, k) > 0, k, last)
    return b * block + k.squeeze(-1)
