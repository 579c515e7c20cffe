"""rlvr's native rollout engine: batched sampling with a KV cache over any transformers
causal LM, built for GRPO's workload (every prompt sampled n times).

What makes it faster than ``model.generate`` on that workload:

- **Shared prompt prefill**: the distinct prompts of a batch (same ``uid``, else same
  tokens) are prefilled once, with logits only at the last position, and their KV cache
  rows are repeated to the n rows that sample from them; the opening the distinct prompts
  have in common (a system prompt) is prefilled once for all of them.
- **No cache concatenation**: keys and values are written in place into preallocated
  buffers (``kv_cache.py``).
- **No wasted decode work**: finished rows (EOS, stop string, length) leave the decode
  batch at once (the cache copy that costs is a few ms, less than decoding a dead row),
  and the loop ends when every row is done.
- **Cheap sampling**: inverse-CDF sampling, one random number per row per step.
- **Turns continue their cache** (inside ``turn_cache()``, which the multi-turn loop enters):
  a completion that stopped keeps its keys and values until the next call, and a prompt that
  continues it (its tokens, then the tool's) prefills only the new tokens on top of them.

``generate`` is the request-level entry point (token ids in; token ids, log-probs and a
finish reason out) that a multi-turn loop can call to continue a conversation without
re-tokenising it; ``generate_sequences`` is the batch API the trainer calls.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import sys
from dataclasses import dataclass, replace
from typing import Hashable, Sequence

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from rlvr.config.schema import RolloutConfig
from rlvr.data.dataset import left_pad
from rlvr.models.loader import DTYPES
from rlvr.progress import advance
from rlvr.rollout.base import BaseRollout, Completion, register_rollout
from rlvr.rollout.kv_cache import make_cache, supports_preallocated
from rlvr.rollout.lean import LeanDecoder, supports_lean_decode
from rlvr.rollout.sampling import SamplingParams, sample_tokens



def _load_libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _load_libc()


def decode_attention(device: torch.device):
    """On CUDA, attention without cuDNN's SDPA backend while decoding. cuDNN builds an execution
    plan for each new key length, which in decode is every step: 1.5 ms of host time per call,
    45% of a bf16 rollout of the default job on an H100 (torch 2.11's profiler, bench/gpu.py
    --parts profile); flash and memory-efficient attention need no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def trim_heap() -> None:
    """Return the heap's free pages to the OS (glibc only; a no-op elsewhere).

    The decode loop frees buffers of a new size at every step (logits, cache rows after a
    row finishes); glibc keeps such memory mapped, so without a trim the process's resident
    memory on the rollout benchmark kept growing to 1.7-2.1 GB instead of 1.4 GB. One trim
    per cache compaction costs well under a millisecond.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep the cache's batch rows ``rows`` (in that order, repeats allowed), in every layer.

    A linear-attention layer (Qwen3.5, Qwen3-Next) has no ``batch_select_indices``, and its
    combined layers' one selects the attention keys only, leaving the recurrent state of the
    old rows; its ``reorder_cache`` selects both (an ``index_select`` on the batch dimension)."""
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            layer.reorder_cache(rows)
        else:
            layer.batch_select_indices(rows)


def fill_finished_slots(done: torch.Tensor) -> torch.Tensor:
    """The rows to keep, as indices: the slot of each finished row among the first ``m`` (the
    number still running) takes a running row from beyond ``m``, so the cache moves only as
    many rows as finished.  done = [F, T, F, T, F, F] -> keep = [0, 4, 2, 5]"""
    m = int((~done).sum())
    keep = torch.arange(m, device=done.device)
    holes = done[:m].nonzero().squeeze(-1)
    movers = (~done[m:]).nonzero().squeeze(-1) + m
    keep[holes] = movers
    return keep


def group_waves(keys: Sequence[Hashable], max_rows: int) -> list[list[int]]:
    """Rows in waves of at most ``max_rows``, each group's rows (same key) kept together where
    the group fits, so that a group's prompt is prefilled once. A group larger than
    ``max_rows`` is cut into waves of its own. keys = [a, a, b, b, c], max_rows = 4 ->
    [[0, 1, 2, 3], [4]]"""
    members: dict[Hashable, list[int]] = {}
    for r, key in enumerate(keys):
        members.setdefault(key, []).append(r)
    waves: list[list[int]] = [[]]
    for rows in members.values():
        for start in range(0, len(rows), max_rows):
            piece = rows[start:start + max_rows]
            if len(waves[-1]) + len(piece) > max_rows:
                waves.append([])
            waves[-1].extend(piece)
    return waves


@dataclass
class KeptTurn:
    """A stopped completion's context — its prompt and every sampled token but the last, which was
    never fed to the model — and that context's keys and values, (H, L, D) per layer."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


SHARED_PREFIX_MIN_TOKENS = 16
"""Distinct prompts of one wave that open with at least this many common tokens (a system
prompt, a template's header) prefill them once."""


def common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens every sequence opens with: [[1, 2, 3], [1, 2, 4]] -> 2."""
    shortest = min(len(s) for s in seqs)
    for i in range(shortest):
        token = seqs[0][i]
        if any(s[i] != token for s in seqs):
            return i
    return shortest


def take_longest_prefix(kept: list[KeptTurn], prompt: Sequence[int]) -> KeptTurn | None:
    """The longest of ``kept`` whose ids are a strict prefix of ``prompt``, removed from ``kept``
    (a strict prefix leaves at least one token to prefill, whose logits start the turn)."""
    best = None
    for i, turn in enumerate(kept):
        n = len(turn.ids)
        if n < len(prompt) and (best is None or n > len(kept[best].ids)) and tuple(prompt[:n]) == turn.ids:
            best = i
    return kept.pop(best) if best is not None else None


@register_rollout("native")
class NativeRollout(BaseRollout):
    """Generates responses with a model it shares with the actor (or with the worker that gathers its
    weights, in ``rollout.dtype``), or a synced copy when the model's dtype is not ``rollout.dtype``."""

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int,
                 max_prompt_length: int | None = None, device: torch.device | str | None = None):
        super().__init__(model, tokenizer, config, max_response_length, max_prompt_length, device)
        self.actor_model = model
        # "auto" is resolved by load_config; a config built directly leaves it: the model's own dtype
        dtype = model.dtype if config.dtype == "auto" else DTYPES[config.dtype]
        if model.dtype != dtype:  # a copy in the rollout dtype, synced by sync_weights()
            self.model = copy.deepcopy(model).eval()
            for p in self.model.parameters():  # buffers (rotary frequencies) keep their dtype, as
                p.data = p.data.to(dtype)  # transformers keeps them when it loads in bf16
        else:
            self.model = model  # shared: no copy, always the actor's (or the worker's gathered) weights
        self.lean = LeanDecoder(self.model) if config.lean_decode and supports_lean_decode(self.model) else None
        self._kept: list[KeptTurn] | None = None  # inside turn_cache(): the last call's stopped rows
        self.prefill_tokens = {"computed": 0, "reused": 0}  # prompt tokens prefilled, and taken from kept turns

    @contextlib.contextmanager
    def turn_cache(self):
        """Keep each stopped completion's keys and values for one call: a prompt in the next call
        that continues it prefills only its new tokens. Models with transformers' own cache
        (sliding windows, hybrids) keep nothing."""
        if not supports_preallocated(self.model.config):
            yield
            return
        self._kept = []
        try:
            yield
        finally:
            self._kept = None

    def sync_weights(self, version: int | None = None) -> None:
        """Copy the actor's weights into the rollout copy (only when the rollout has its own dtype)."""
        if self.model is self.actor_model:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), self.actor_model.parameters()):
                dst.copy_(src)

    # ------------------------------------------------------------------ request level
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 groups: Sequence[Hashable] | None = None, max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """Sample one completion per prompt; prompts with the same ``groups`` key (default: the
        same tokens) share one prefill. ``max_new_tokens`` caps each row (at most
        ``params.max_new_tokens``), for requests with different budgets left.

        At most ``rollout.max_num_seqs`` rows decode at once: more rows run in waves of whole
        groups (one prefill per group, as in one wave), each row drawing the uniforms of its row
        in the whole call, so the completions equal those of a single wave."""
        if not prompts:
            return []
        keys = list(groups) if groups is not None else [tuple(p) for p in prompts]
        budgets = torch.tensor([min(int(b), params.max_new_tokens) for b in max_new_tokens]) if max_new_tokens \
            is not None else torch.full((len(prompts),), params.max_new_tokens)
        waves = group_waves(keys, self.config.max_num_seqs)
        if len(waves) > 1:  # name each row by its row in the whole call, which fixes its uniforms
            rows = params.row_ids or tuple(range(params.row_offset, params.row_offset + len(prompts)))
            params = replace(params, row_ids=rows, total_rows=max(len(prompts), params.total_rows, max(rows) + 1))
        completions: list[Completion | None] = [None] * len(prompts)
        kept, self._kept = self._kept, ([] if self._kept is not None else None)  # the last call's turns: used now or dropped
        self._finished = (0, len(prompts))  # rows of the call finished in earlier waves, of all: for the progress
        for wave in waves:
            first: dict[Hashable, int] = {}
            unique, row_to_unique = [], []
            for r in wave:
                if keys[r] not in first:
                    first[keys[r]] = len(unique)
                    unique.append(list(prompts[r]))
                row_to_unique.append(first[keys[r]])
            wave_params = replace(params, row_ids=tuple(params.row_ids[r] for r in wave)) if params.row_ids else params
            with decode_attention(self.model.device):
                pasts = [take_longest_prefix(kept, u) for u in unique] if kept else [None] * len(unique)
                pasts = self._share_prefix(unique, pasts)
                decoded = self._decode(unique, torch.tensor(row_to_unique), wave_params, budgets[wave], pasts)
            for r, completion in zip(wave, decoded):
                completions[r] = completion
            self._finished = (self._finished[0] + len(wave), len(prompts))
            advance("rows", *self._finished)  # the rows cut at their length too
            trim_heap()  # the wave's cache is gone now
        return completions

    def _share_prefix(self, unique: list[list[int]], pasts: list[KeptTurn | None]) -> list[KeptTurn | None]:
        """Distinct prompts that open alike (the chat template's system prompt: 27 of the built-in
        task's 48 tokens) prefill their common opening once: one row's keys and values, copied to
        each prompt that continues no longer kept turn. The rest of each prompt prefills on top,
        as a kept turn's continuation does."""
        if not supports_preallocated(self.model.config) or len(unique) < 2:
            return pasts
        n = min(common_prefix_length(unique), min(len(u) for u in unique) - 1)  # each prompt keeps a token to prefill
        if n < SHARED_PREFIX_MIN_TOKENS or all(p is not None and len(p.ids) >= n for p in pasts):
            return pasts
        ids = unique[0][:n]
        cache = make_cache(self.model.config, n)
        self.model(input_ids=torch.tensor([ids], device=self.model.device), past_key_values=cache, use_cache=True,
                   logits_to_keep=1)
        self.prefill_tokens["computed"] += n
        shared = KeptTurn(tuple(ids), [layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers])
        return [p if p is not None and len(p.ids) >= n else shared for p in pasts]

    def _prefill(self, unique: list[list[int]], max_new: int, pasts: list[KeptTurn | None]):
        """Prefill the distinct prompts -> the cache, each prompt's last logits, the (U, L) key mask
        and each prompt's last position. A prompt whose ``pasts`` entry is a kept turn (or the
        shared opening) prefills only the tokens after it."""
        reused = sum(len(p.ids) for p in pasts if p is not None)
        if reused:
            input_ids, mask, positions, cache = self._continue_kept(unique, pasts, max_new)
        else:
            input_ids, mask, positions = left_pad(unique, self.pad_id)
            cache = make_cache(self.model.config, input_ids.shape[1] + max_new)
        self.prefill_tokens["reused"] += reused
        self.prefill_tokens["computed"] += sum(len(u) for u in unique) - reused
        device = self.model.device
        out = self.model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                         position_ids=positions.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, out.logits[:, -1], mask.to(device), positions[:, -1].to(device)

    def _continue_kept(self, unique: list[list[int]], pasts: list[KeptTurn | None], max_new: int):
        """The cache of the kept turns, each right-aligned at columns [S - L_i, S) for S the
        longest, and the rest of each prompt left-padded after them: a (U, S + T) key mask with
        holes that attention skips, and position ids that continue each row's own context."""
        kept = torch.tensor([len(p.ids) if p is not None else 0 for p in pasts])  # (U,)
        S = int(kept.max())
        input_ids, rest_mask, rest_pos = left_pad([u[int(n):] for u, n in zip(unique, kept)], self.pad_id)
        U, T = input_ids.shape
        columns = torch.arange(S)
        mask = torch.cat([(columns >= S - kept[:, None]).long(), rest_mask], dim=1)  # (U, S + T)
        positions = rest_pos + kept[:, None]
        cache = make_cache(self.model.config, S + T + max_new)
        first = next(p for p in pasts if p is not None)
        for layer_index, layer in enumerate(cache.layers):
            k0, v0 = first.keys[layer_index], first.values[layer_index]  # (H, L, D)
            keys = k0.new_empty(U, k0.shape[0], layer.capacity, k0.shape[-1])
            values = v0.new_empty(U, v0.shape[0], layer.capacity, v0.shape[-1])
            keys[:, :, :S] = 0  # holes stay finite: a masked key still meets a 0 weight in attention
            values[:, :, :S] = 0
            for row, past in enumerate(pasts):
                if past is not None:
                    n = len(past.ids)
                    keys[row, :, S - n:S] = past.keys[layer_index]
                    values[row, :, S - n:S] = past.values[layer_index]
            layer.restore(keys, values, S)
        return input_ids, mask, positions, cache

    def _keep_turns(self, cache, mask: torch.Tensor, stopped: torch.Tensor, live: torch.Tensor, tokens: torch.Tensor,
                    lengths: torch.Tensor, prompt_of_row) -> None:
        """Keep the context of each row that stopped this step (its cached columns, where ``mask``
        is 1) for the next call's turns."""
        for j in stopped.nonzero().squeeze(-1).tolist():
            r = int(live[j])
            columns = mask[j].bool()
            ids = tuple(prompt_of_row(r)) + tuple(tokens[r, :int(lengths[r]) - 1].tolist())
            if len(ids) != int(columns.sum()):
                raise RuntimeError(f"kept turn of row {r}: {len(ids)} tokens but {int(columns.sum())} cached positions")
            self._kept.append(KeptTurn(ids, [layer.keys[j][:, columns] for layer in cache.layers],
                                       [layer.values[j][:, columns] for layer in cache.layers]))

    def _decode(self, unique: list[list[int]], row_to_unique: torch.Tensor, params: SamplingParams,
                budgets: torch.Tensor, pasts: list[KeptTurn | None]):
        device = self.model.device
        B = len(row_to_unique)
        max_new = int(budgets.max())
        cache, logits, mask, last_pos = self._prefill(unique, max_new, pasts)
        rows = row_to_unique.to(device)
        select_cache_rows(cache, rows)  # repeat each prompt's cache to its n rows
        logits, mask, last_pos = logits[rows], mask[rows], last_pos[rows]
        tokens = torch.full((B, max_new), self.pad_id, dtype=torch.long)
        log_probs = torch.zeros(B, max_new)
        lengths = torch.zeros(B, dtype=torch.long)
        finish = ["length"] * B
        generator = torch.Generator().manual_seed(int(params.seed))
        eos = torch.tensor(self.eos_ids, device=device)
        live = torch.arange(B, device=device)  # original row of each decode-batch row
        done = torch.zeros(B, dtype=torch.bool, device=device)  # per decode-batch row
        uneven = bool((budgets < max_new).any())  # multi-turn requests with different budgets left
        batch_rows = torch.tensor(params.row_ids) if params.row_ids else torch.arange(B) + params.row_offset  # (B,)
        draws = max(B, params.total_rows, int(batch_rows.max()) + 1)
        for step in range(max_new):
            live_cpu = live.cpu()
            uniforms = 1.0 - torch.rand(draws, generator=generator, dtype=torch.float64)[batch_rows]  # (0, 1], (B,)
            next_tok, next_lp = sample_tokens(logits, params, uniforms[live_cpu].to(device))
            active = ~done
            idx = live[active].cpu()
            tokens[idx, step] = next_tok[active].cpu()
            log_probs[idx, step] = next_lp[active].float().cpu()
            lengths[idx] += 1
            stopped = active & torch.isin(next_tok, eos)
            if params.stop:
                stopped |= active & self._hit_stop(tokens, live, lengths, params.stop)
            for r in live[stopped].tolist():
                finish[r] = "stop"
            if self._kept is not None and bool(stopped.any()):
                self._keep_turns(cache, mask, stopped, live, tokens, lengths, lambda r: unique[int(row_to_unique[r])])
            done |= stopped
            if uneven:  # a row whose own budget is spent ends ("length") before the batch's longest
                done |= active & (lengths[live_cpu] >= budgets[live_cpu]).to(device)
            before, total = self._finished
            advance("rows", before + B - len(live) + int(done.sum()), total)  # drawn by the listener at its own rate
            if bool(done.all()) or step == max_new - 1:
                break
            if bool(done.any()):  # moving a few cache rows is cheaper than decoding dead rows
                keep = fill_finished_slots(done)
                select_cache_rows(cache, keep)
                live, next_tok, mask, last_pos, done = live[keep], next_tok[keep], mask[keep], last_pos[keep], done[keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            last_pos = last_pos + 1
            logits = self._step(next_tok, mask, last_pos, cache)
        return [Completion(tokens[r, :lengths[r]].tolist(), log_probs[r, :lengths[r]].tolist(), finish[r])
                for r in range(B)]

    def _step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """One decode step: (B,) tokens at (B,) positions, (B, L) key mask -> (B, V) logits."""
        if self.lean is not None:
            return self.lean.step(tokens, mask, positions, cache)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=positions.unsqueeze(-1),
                         past_key_values=cache, use_cache=True)
        return out.logits[:, -1]

    def _hit_stop(self, tokens, live, lengths, stop: tuple[str, ...]) -> torch.Tensor:
        """Rows whose text now contains a stop string (decodes only each row's tail)."""
        tail = max(len(s) for s in stop) + 8  # tokens enough to span any stop string
        hits = []
        for r in live.tolist():
            n = int(lengths[r])
            text = self.tokenizer.decode(tokens[r, max(0, n - tail):n])
            hits.append(any(s in text for s in stop))
        return torch.tensor(hits, device=live.device)

    def free_cache(self) -> None:
        """Each call's KV cache is freed when it returns; the packed vocabulary projection goes here."""
        if self.lean is not None:
            self.lean.release()
