"""The engine core: requests in, completions out, continuous batching over one KV slab.

A request is a prompt's token ids, its own sampling parameters and an id. The core keeps a
queue of waiting requests and a batch of running rows, and ``step()`` does one round:

1. admit waiting requests into free rows (at most ``max_num_seqs`` run): their prompts are
   prefilled, once per distinct prompt (a GRPO group's n rows share one prefill; a prompt
   that continues a kept multi-turn context prefills only its new tokens; distinct prompts
   that open alike prefill the opening once), and their keys and values join the running
   rows' in the slab (``slab.py``);
2. sample one token for every running row, each with its own parameters;
3. finish the rows that stopped (EOS, a stop token or string, the length) and free their rows;
4. run one decode step over the rows left.

The batch engine of earlier versions was this loop without step 1 after the first round: a
batch decoded until its longest row ended. Its callers (the trainer's rollout, validation,
``rlvr eval``, the multi-turn loop) are now clients that submit every row and gather.

Randomness is per request, not per batch: request ``row`` of a draw ``width`` wide takes, at
its t-th token, value ``row`` of the t-th draw of ``torch.rand(width)`` from a generator
seeded with its ``seed`` (one stream per (seed, width), shared by the requests that name it).
A row's uniforms therefore never depend on its neighbours or on when it was admitted, and a
trainer batch submitted at once samples exactly as the batch engine did. Its logits do depend
on the batch's composition in the last bits (a matrix product's blocking follows the row
count), so which rows share a step matters for bitwise equality, not for the distribution:
the synchronous trainer submits a step's rows together in a fixed order, which fixes every
step's composition (same seed, same run). A server's composition follows arrival times.

Rows admitted together with one prompt (a GRPO group) hold the same keys and values in the
same columns for as long as they run: they generate in step, and every move of the slab moves
whole rows or right-aligns equal counts of columns. A decode step on the lean path reads those
columns once per group (``_shared_prefixes``, ``lean.shared_prefix_attention``).

Weights: ``pause(mode)`` stops admitting (``"wait"`` lets the running rows finish first,
``"abort"`` ends them with finish reason ``"abort"``, ``"in_place"`` keeps them for after the
update), ``set_weight_version`` names the new weights, ``resume()`` admits again. A completion
carries the version it ran under; one that an in-place update crossed lists where each
version's tokens start (``version_starts``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable, Hashable
from collections.abc import Sequence as Seq

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from rlvr.data.dataset import left_pad
from rlvr.rollout.base import Completion
from rlvr.rollout.kv_cache import advance, make_cache, row_chunks, supports_preallocated
from rlvr.rollout.lean import PrefixBatch, SharedPrefixes
from rlvr.rollout.sampling import SamplingParams, sample_tokens
from rlvr.rollout.slab import Slab

SHARED_PREFIX_MIN_TOKENS = 16
"""Distinct prompts of one admission that open with at least this many common tokens (a system
prompt, a template's header) prefill them once."""

PREFILL_CHUNK = 2048
"""Prompt columns one prefill forward takes; a longer prompt prefills in chunks (bounded
activation memory). The chunks run one after another within one admission, not between decode
steps as vLLM's chunked prefill does: the running rows wait for a long prompt's whole prefill."""

PREFILL_ROW_TOKENS = 1024
"""Prompt tokens (rows x the padded length) one prefill forward takes at most on a CPU: more prompts than
that prefill in chunks of whole rows, one after another. The same tokens, log-probs within float
rounding (a matmul's row count can change its blocking; tested); on the built-in model's
validation, bit for bit the same. A forward's activations are (tokens, 1536) matrices for the
built-in model: one forward over validation's 300 prompts (6,300 tokens) allocated each as a fresh
39 MB mapping, took up to 1.7 M more page faults and 1.09x the prefill time of chunks (1.05-1.17;
``bench/prefill.py --rows-ab``)."""

SHARED_COLUMN_READS_MIN = 4096
"""Cache columns (summed over rows) a decode step must save by reading shared prompts once per
group before it attends in two parts; below that, the second attention call costs more than
the reads it saves."""

COLUMNS_AHEAD_MAX = 512
"""Columns the slab reserves beyond the current length at most; past them it grows when needed."""


@dataclass
class Request:
    """One completion to make. ``params.max_new_tokens`` bounds it; ``group`` keys requests that
    share a prompt and are admitted together (one prefill; default: the prompt's tokens);
    ``row`` and ``width`` pick its uniforms (module docstring)."""

    id: str
    prompt_ids: list[int]
    params: SamplingParams
    group: Hashable | None = None
    row: int = 0
    width: int = 1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    on_tokens: Callable[[list[int], list[float]], None] | None = None
    """Streaming: called with each step's new token (and its log-prob) while the row runs."""
    on_finish: Callable[[Completion], None] | None = None


@dataclass
class KeptTurn:
    """A stopped completion's context — its prompt and every sampled token but the last, which was
    never fed to the model — and that context's keys and values, (H, L, D) per layer."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class UniformStream:
    """The t-th ``torch.rand(width)`` draw of a generator seeded with ``seed``, as 1 - u in (0, 1]."""

    def __init__(self, seed: int, width: int):
        self.generator = torch.Generator().manual_seed(int(seed))
        self.width = width
        self.draws: list[torch.Tensor] = []
        self.users = 0

    def uniform(self, t: int, row: int) -> float:
        while len(self.draws) <= t:
            self.draws.append(1.0 - torch.rand(self.width, generator=self.generator, dtype=torch.float64))
        return float(self.draws[t][row])


@dataclass
class Sequence:
    """A request's state in the core."""

    request: Request
    stream: UniformStream
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    matched: int | str | None = None
    version_starts: list[tuple[int, int]] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    segment: Hashable | None = None  # rows of one admission with one prompt share that prompt's columns

    @property
    def budget(self) -> int:
        return self.request.params.max_new_tokens

    def completion(self) -> Completion:
        return Completion(self.tokens, self.log_probs, self.finish_reason or "abort",
                          weight_version=self.version_starts[-1][1] if self.version_starts else -1,
                          version_starts=self.version_starts if len(self.version_starts) > 1 else None,
                          request_id=self.request.id, matched=self.matched)


def common_prefix_length(seqs: Seq[Seq[int]]) -> int:
    """Tokens every sequence opens with: [[1, 2, 3], [1, 2, 4]] -> 2."""
    shortest = min(len(s) for s in seqs)
    for i in range(shortest):
        token = seqs[0][i]
        if any(s[i] != token for s in seqs):
            return i
    return shortest


def take_longest_prefix(kept: list[KeptTurn], prompt: Seq[int]) -> KeptTurn | None:
    """The longest of ``kept`` whose ids are a strict prefix of ``prompt``, removed from ``kept``
    (a strict prefix leaves at least one token to prefill, whose logits start the turn)."""
    best = None
    for i, turn in enumerate(kept):
        n = len(turn.ids)
        if n < len(prompt) and (best is None or n > len(kept[best].ids)) and tuple(prompt[:n]) == turn.ids:
            best = i
    return kept.pop(best) if best is not None else None


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


class EngineCore:
    """Continuous batching over ``model`` (a transformers causal LM). ``step`` is called by one
    thread at a time; ``add`` and ``abort`` between steps."""

    def __init__(self, model, tokenizer, eos_ids: Seq[int], pad_id: int, max_num_seqs: int,
                 decode_step: Callable | None = None, max_model_len: int | None = None,
                 max_num_batched_tokens: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids, self.pad_id = frozenset(eos_ids), pad_id
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens  # tokens one step may take (vLLM's meaning; None: no bound)
        self.max_model_len = max_model_len  # a request's prompt + max_new_tokens at most (None: no bound)
        self.decode_step = decode_step  # (tokens, mask, positions, cache) -> logits; None: the model's forward
        self.slab_ok = supports_preallocated(model.config)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in slab row order
        self.slab = Slab(model.config.num_hidden_layers) if self.slab_ok else None
        self.cache = None  # models without the slab: transformers' cache of the running batch
        self.logits: torch.Tensor | None = None  # (rows, V): each running row's next-token logits
        self.mask: torch.Tensor | None = None  # (rows, L) key mask
        self.last_pos: torch.Tensor | None = None  # (rows,) each row's last position
        self.streams: dict[tuple[int, int], UniformStream] = {}
        self.kept: list[KeptTurn] = []  # contexts a new prompt may continue (its prefill then starts after them)
        self.keeping: list[KeptTurn] | None = None  # set by a client: stopped rows' contexts are kept here
        self.weight_version = 0
        self.admitting = True
        self.stepping = True
        self.prefill_tokens = {"computed": 0, "reused": 0}
        self.on_sampled: Callable[[], None] | None = None  # called once a step's tokens are sampled
        self.share_prompts = False  # set by the engine: decode_step takes ``prefixes`` (a CPU lean step)
        self.shared_steps = 0  # decode steps that read shared prompts once per group
        self._admissions = 0
        self._finished_now: list[Sequence] = []

    # ------------------------------------------------------------------ requests
    def add(self, request: Request) -> Sequence:
        if not request.prompt_ids:
            raise ValueError(f"request {request.id}: the prompt has no tokens")
        if request.params.max_new_tokens < 1:
            raise ValueError(f"request {request.id}: max_new_tokens is {request.params.max_new_tokens}, at least 1")
        asked = len(request.prompt_ids) + request.params.max_new_tokens
        if self.max_model_len is not None and asked > self.max_model_len:
            raise ValueError(f"request {request.id}: {len(request.prompt_ids)} prompt tokens + max_new_tokens "
                             f"{request.params.max_new_tokens} = {asked} is more than max_model_len {self.max_model_len}")
        key = (int(request.params.seed), int(request.width))
        stream = self.streams.get(key) or self.streams.setdefault(key, UniformStream(*key))
        stream.users += 1
        stop = set(request.stop_token_ids) | (set() if request.ignore_eos else set(self.eos_ids))
        seq = Sequence(request, stream, stop_ids=frozenset(stop))
        self.waiting.append(seq)
        return seq

    @torch.inference_mode()  # freeing a row moves another's keys into its slot: the slab's buffers are inference tensors
    def abort(self, request_id: str) -> bool:
        """End a waiting or running request now (finish reason ``"abort"``, the tokens so far)."""
        for seq in list(self.waiting):
            if seq.request.id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort")
                return True
        for i, seq in enumerate(self.running):
            if seq.request.id == request_id and seq.finish_reason is None:
                done = torch.zeros(len(self.running), dtype=torch.bool)
                done[i] = True
                self._remove_rows(done, "abort")
                return True
        return False

    @torch.inference_mode()
    def abort_all(self) -> int:
        n = len(self.waiting) + len(self.running)
        while self.waiting:
            self._finish(self.waiting.popleft(), "abort")
        if self.running:
            self._remove_rows(torch.ones(len(self.running), dtype=torch.bool), "abort")
        return n

    def has_work(self) -> bool:
        return (bool(self.running) and self.stepping) or (bool(self.waiting) and self.admitting)

    # ------------------------------------------------------------------ weights
    def pause(self, mode: str = "wait") -> None:
        """Stop admitting. ``"wait"``: the running rows go on until they finish; ``"abort"``: every
        request ends now; ``"in_place"``: the running rows stop where they are, for after the
        update (their completions then say which tokens came from which version)."""
        if mode not in ("wait", "abort", "in_place"):
            raise ValueError(f"pause mode {mode!r}: use 'wait', 'abort' or 'in_place'")
        self.admitting = False
        if mode == "abort":
            self.abort_all()
        self.stepping = mode != "in_place"

    def resume(self) -> None:
        self.admitting = self.stepping = True

    def set_weight_version(self, version: int) -> None:
        """The weights the model now holds are ``version``; rows kept in place continue under it.
        Their next token comes from logits the last decode step computed, under the old weights:
        the new version's tokens start one later (and attend to keys and values the old wrote)."""
        self.weight_version = int(version)
        pending = int(self.logits is not None)
        for seq in self.running:
            start = len(seq.tokens) + pending
            if seq.version_starts and seq.version_starts[-1][0] == start:
                seq.version_starts.pop()  # the version before made no token (a bucket of a multi-part update)
            seq.version_starts.append((start, self.weight_version))

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One round (module docstring) -> the requests that finished in it."""
        self._finished_now = []
        if self.admitting and self.waiting:
            self._admit()
        if not self.running or not self.stepping:
            return self._finished_now
        next_tok, next_lp = self._sample()
        next_tok = next_tok.cpu()
        self.logits = None  # consumed: the decode step makes the next (no (rows, V) copy when rows finish)
        done = torch.zeros(len(self.running), dtype=torch.bool)
        for i, (seq, tok, lp) in enumerate(zip(self.running, next_tok.tolist(), next_lp.tolist())):
            seq.tokens.append(tok)
            seq.log_probs.append(lp)
            if seq.request.on_tokens is not None:
                seq.request.on_tokens([tok], [lp])
            reason = self._stopped(seq, tok)
            if reason:
                seq.finish_reason = reason
                done[i] = True
        if bool(done.any()):
            next_tok = next_tok[self._remove_rows(done, None)]
        if self.on_sampled is not None:
            self.on_sampled()  # a server streams this step's tokens now, not after the decode step
        if self.running:
            self._decode(next_tok)
        return self._finished_now

    def run(self, requests: Seq[Request]) -> list[Completion]:
        """Submit every request, step until all are done -> their completions, in order."""
        seqs = [self.add(r) for r in requests]
        while any(s.finish_reason is None for s in seqs):
            self.step()
        return [s.completion() for s in seqs]

    def _stopped(self, seq: Sequence, tok: int) -> str | None:
        if tok in seq.stop_ids:
            seq.matched = tok
            return "stop"
        stop = seq.request.params.stop
        if stop:
            tail = max(len(s) for s in stop) + 8  # tokens enough to span any stop string
            text = self.tokenizer.decode(seq.tokens[-tail:])
            hit = next((s for s in stop if s in text), None)
            if hit is not None:
                seq.matched = hit
                return "stop"
        if len(seq.tokens) >= seq.budget:
            return "length"
        return None

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each running row's next token and its log-prob, rows with the same parameters together."""
        rows = len(self.running)
        by_params: dict[tuple, list[int]] = {}
        for i, seq in enumerate(self.running):
            p = seq.request.params
            by_params.setdefault((p.greedy, p.temperature, p.top_p, p.top_k, p.min_p), []).append(i)
        uniforms = torch.tensor([s.stream.uniform(len(s.tokens), s.request.row) for s in self.running],
                                dtype=torch.float64)
        if len(by_params) == 1:
            return sample_tokens(self.logits, self.running[0].request.params, uniforms.to(self.logits.device))
        tokens = torch.empty(rows, dtype=torch.long)
        log_probs = torch.empty(rows)
        for idx in by_params.values():
            index = torch.tensor(idx)
            t, lp = sample_tokens(self.logits[index.to(self.logits.device)], self.running[idx[0]].request.params,
                                  uniforms[index].to(self.logits.device))
            tokens[index], log_probs[index] = t.cpu(), lp.float().cpu()
        return tokens, log_probs

    def _finish(self, seq: Sequence, reason: str | None) -> None:
        if reason is not None:
            seq.finish_reason = reason
        if not seq.version_starts:
            seq.version_starts.append((0, self.weight_version))
        seq.stream.users -= 1
        if seq.stream.users == 0:
            self.streams.pop((int(seq.request.params.seed), seq.stream.width), None)
        self._finished_now.append(seq)
        if seq.request.on_finish is not None:
            seq.request.on_finish(seq.completion())

    def _remove_rows(self, done: torch.Tensor, reason: str | None) -> torch.Tensor:
        """Finish the running rows where ``done`` and free their rows of the cache -> the rows kept,
        in their new order (``fill_finished_slots``)."""
        for i in done.nonzero().squeeze(-1).tolist():
            seq = self.running[i]
            if self.keeping is not None and (reason or seq.finish_reason) == "stop" and self.slab is not None:
                ids = tuple(seq.request.prompt_ids) + tuple(seq.tokens[:-1])
                keys, values = self.slab.row_context(i, self.mask[i])
                if len(ids) != keys[0].shape[1]:
                    raise RuntimeError(f"kept turn of {seq.request.id}: {len(ids)} tokens, {keys[0].shape[1]} cached")
                self.keeping.append(KeptTurn(ids, keys, values))
            self._finish(seq, reason)
        keep = fill_finished_slots(done)
        self.running = [self.running[i] for i in keep.tolist()]
        device = self.mask.device
        if self.slab is not None:
            self.slab.keep(keep.to(self.slab.base_k[0].device) if self.slab.base_k else keep)
        elif self.running:
            select_cache_rows(self.cache, keep.to(device))
        else:
            self.cache = None
        if self.logits is not None:  # between steps (an abort): the next step samples from them
            self.logits = self.logits[keep.to(device)]
        self.mask, self.last_pos = self.mask[keep.to(device)], self.last_pos[keep.to(device)]
        return keep

    def _decode(self, tokens: torch.Tensor) -> None:
        """One decode step over the running rows, fed their last tokens."""
        device = self.model.device
        if self.slab is not None and self.slab.length + 1 > self.slab.capacity:
            ahead = max(s.budget - len(s.tokens) for s in self.running)
            self.mask = self.slab.make_room(self.mask, min(max(ahead, 1), COLUMNS_AHEAD_MAX))
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.running), 1)], dim=1)
        self.last_pos = self.last_pos + 1
        cache = self.slab.cache if self.slab is not None else self.cache
        tokens = tokens.to(device)
        if self.decode_step is not None:
            # fp32 only: in bf16 the two parts' outputs are rounded before they merge (log-probs moved by
            # up to 0.13 against the one-part step's, bf16's own distance from fp32)
            shared = self.share_prompts and device.type == "cpu" and self.model.dtype == torch.float32
            prefixes = self._shared_prefixes() if shared else None
            if prefixes is None:
                self.logits = self.decode_step(tokens, self.mask, self.last_pos, cache)
            else:
                self.logits = self.decode_step(tokens, self.mask, self.last_pos, cache, prefixes=prefixes)
                self.shared_steps += 1
        else:
            out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask,
                             position_ids=self.last_pos.unsqueeze(-1), past_key_values=cache, use_cache=True)
            self.logits = out.logits[:, -1]
        if self.slab is not None:
            self.slab.sync_length()

    def _shared_prefixes(self) -> SharedPrefixes | None:
        """The running groups' shared prompt columns for this decode step, or None when reading them
        once per group saves fewer than ``SHARED_COLUMN_READS_MIN`` column reads. Each row attends
        to columns [start, L) itself; ``start`` is the first column of the earliest row that shares
        nothing, so a group's columns before it are read once, from its first row."""
        members: dict[Hashable, list[int]] = {}
        for slot, seq in enumerate(self.running):
            if seq.segment is not None:
                members.setdefault(seq.segment, []).append(slot)
        if not any(len(slots) > 1 for slots in members.values()):
            return None
        own = self.mask.bool()
        rows, L = own.shape
        first = own.int().argmax(dim=1).tolist()  # each row's first own column
        shared = torch.tensor([len(seq.request.prompt_ids) for seq in self.running])
        end = ((own.cumsum(dim=1) < shared[:, None]).sum(dim=1) + 1).tolist()  # after its prompt's last column
        groups = {}
        alone = set(range(rows))
        for slots in members.values():
            lead = slots[0]
            lo, hi = first[lead], end[lead]
            same = [s for s in slots[1:] if first[s] == lo and end[s] == hi
                    and torch.equal(own[s, lo:hi], own[lead, lo:hi])]  # true by construction; checked, cheaply
            if same and hi - lo >= SHARED_PREFIX_MIN_TOKENS:
                groups[lead] = (lo, hi, [lead, *same])
                alone.difference_update([lead, *same])
        start = min((first[r] for r in alone), default=L - 1)
        while True:  # a group that ends after ``start`` shares only its columns before it
            short = [lead for lead, (lo, hi, _) in groups.items() if min(hi, start) - lo < SHARED_PREFIX_MIN_TOKENS]
            if not short:
                break
            for lead in short:
                start = min(start, groups.pop(lead)[0])
        if not groups:
            return None
        start = min(start, min(hi for _, hi, _ in groups.values()))
        saved = rows * start - sum(start - lo for lo, _, _ in groups.values())
        if saved < SHARED_COLUMN_READS_MIN:
            return None
        by_lo: dict[int, list[list[int]]] = {}
        for lo, _, slots in groups.values():
            by_lo.setdefault(lo, []).append(slots)
        batches = []
        device = self.mask.device
        for lo, batch in by_lo.items():
            m = max(len(slots) for slots in batch)
            padded = [slots + [slots[0]] * (m - len(slots)) for slots in batch]
            real = [i * m + j for i, slots in enumerate(batch) for j in range(len(slots))]
            heads = [slots[0] for slots in batch]
            leads = torch.tensor(heads, device=device)
            additive = torch.zeros(len(batch), start - lo, device=device, dtype=self.model.dtype)
            additive.masked_fill_(~own[leads, lo:start], float("-inf"))
            step = heads[1] - heads[0] if len(heads) > 1 else 1
            if step > 0 and heads == list(range(heads[0], heads[0] + step * len(heads), step)):
                leads = slice(heads[0], heads[0] + step * (len(heads) - 1) + 1, step)  # a view, no copy
            batches.append(PrefixBatch(lo, start, torch.tensor(padded, device=device), leads, additive[:, None, None, :],
                                       torch.tensor(real, device=device),
                                       torch.tensor([s for slots in batch for s in slots], device=device)))
        return SharedPrefixes(start, batches)

    # ------------------------------------------------------------------ admission
    def _take_waiting(self) -> list[Sequence]:
        """Waiting requests in arrival order, as many as free rows allow, a group's rows together
        (one that does not fit waits, unless it alone is larger than ``max_num_seqs``), and as
        many prompt tokens as ``max_num_batched_tokens`` leaves beside one decode token per
        running row (vLLM's budget; a group's prompt counts once; the first group always goes):
        a burst of requests is prefilled a part per step, so the first get their first token
        while the rest wait, instead of all waiting for the whole burst's prefill."""
        if not self.slab_ok and self.running:
            return []  # transformers' own cache: a new batch once this one is done
        free = self.max_num_seqs - len(self.running)
        tokens_left = None if self.max_num_batched_tokens is None else self.max_num_batched_tokens - len(self.running)
        taken: list[Sequence] = []
        while self.waiting and free > 0:
            key = self._group_key(self.waiting[0])
            members = [s for s in self.waiting if self._group_key(s) == key]
            if tokens_left is not None:
                cost = len(members[0].request.prompt_ids)
                if taken and cost > tokens_left:
                    break  # the next step's
                tokens_left -= cost
            if len(members) > free:
                if taken or self.running:
                    break  # the group waits for rows to free
                members = members[:free]  # a group larger than max_num_seqs: cut
            for s in members:
                self.waiting.remove(s)
            taken.extend(members)
            free -= len(members)
        return taken

    @staticmethod
    def _group_key(seq: Sequence) -> Hashable:
        r = seq.request
        return ("group", r.group) if r.group is not None else ("prompt", tuple(r.prompt_ids))

    def _admit(self) -> None:
        new = self._take_waiting()
        if not new:
            return
        first: dict[Hashable, int] = {}
        unique: list[list[int]] = []
        row_to_unique = []
        self._admissions += 1
        for seq in new:
            key = self._group_key(seq)
            if key not in first:
                first[key] = len(unique)
                unique.append(list(seq.request.prompt_ids))
            row_to_unique.append(first[key])
            seq.version_starts.append((0, self.weight_version))
            seq.segment = (self._admissions, first[key])
        pasts = [take_longest_prefix(self.kept, u) for u in unique] if self.kept else [None] * len(unique)
        pasts = self._share_prefix(unique, pasts)
        cache, logits, mask, last_pos = self._prefill(unique, pasts)
        rows = torch.tensor(row_to_unique)
        device = self.model.device
        if self.slab is not None:
            ahead = min(max(s.budget for s in new + self.running), COLUMNS_AHEAD_MAX) + 1
            keys = [layer.keys for layer in cache.layers]
            values = [layer.values for layer in cache.layers]
            self.mask = self.slab.admit(keys, values, rows, mask.to(device), self.mask if self.running else None,
                                        self.max_num_seqs, ahead)
        else:
            select_cache_rows(cache, rows.to(device))
            self.cache, self.mask = cache, mask.to(device)[rows.to(device)]
        new_logits, new_pos = logits[rows.to(device)], last_pos.to(device)[rows.to(device)]
        if self.running:
            self.logits = torch.cat([self.logits, new_logits])
            self.last_pos = torch.cat([self.last_pos, new_pos])
        else:
            self.logits, self.last_pos = new_logits, new_pos
        self.running.extend(new)

    def _share_prefix(self, unique: list[list[int]], pasts: list[KeptTurn | None]) -> list[KeptTurn | None]:
        """Distinct prompts that open alike (the chat template's system prompt: 27 of the built-in
        task's 48 tokens) prefill their common opening once: one row's keys and values, copied to
        each prompt that continues no longer kept turn. The rest of each prompt prefills on top,
        as a kept turn's continuation does."""
        if not self.slab_ok or len(unique) < 2:
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

    def _prefill(self, unique: list[list[int]], pasts: list[KeptTurn | None]):
        """Prefill the distinct prompts -> their cache, each prompt's last logits, the (U, P) key
        mask and each prompt's last position. A prompt whose ``pasts`` entry is a kept turn (or
        the shared opening) prefills only the tokens after it. On a CPU, a forward takes whole rows
        up to ``PREFILL_ROW_TOKENS`` tokens (into views of the one cache)."""
        reused = sum(len(p.ids) for p in pasts if p is not None)
        if reused:
            input_ids, mask, positions, cache, start = self._continue_kept(unique, pasts)
        else:
            input_ids, mask, positions = left_pad(unique, self.pad_id)
            cache, start = make_cache(self.model.config, input_ids.shape[1]), 0
        self.prefill_tokens["reused"] += reused
        self.prefill_tokens["computed"] += sum(len(u) for u in unique) - reused
        device = self.model.device
        U, T = input_ids.shape
        logits = []
        rows = max(1, PREFILL_ROW_TOKENS // T) if device.type == "cpu" else U
        for r0, r1, rows_cache in row_chunks(cache, U, rows):
            for lo in range(0, T, PREFILL_CHUNK):  # long prompts in chunks: bounded activations
                hi = min(T, lo + PREFILL_CHUNK)
                out = self.model(input_ids=input_ids[r0:r1, lo:hi].to(device),
                                 attention_mask=mask[r0:r1, :start + hi].to(device),
                                 position_ids=positions[r0:r1, lo:hi].to(device), past_key_values=rows_cache,
                                 use_cache=True, logits_to_keep=1)
            logits.append(out.logits[:, -1])
        if len(logits) > 1:
            advance(cache, T)
        return cache, torch.cat(logits) if len(logits) > 1 else logits[0], mask, positions[:, -1]

    def _continue_kept(self, unique: list[list[int]], pasts: list[KeptTurn | None]):
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
        cache = make_cache(self.model.config, S + T)
        first = next(p for p in pasts if p is not None)
        for layer_index, layer in enumerate(cache.layers):
            k0, v0 = first.keys[layer_index], first.values[layer_index]  # (H, L, D)
            keys = k0.new_zeros(U, k0.shape[0], layer.capacity, k0.shape[-1])  # holes stay finite (0)
            values = v0.new_zeros(U, v0.shape[0], layer.capacity, v0.shape[-1])
            for row, past in enumerate(pasts):
                if past is not None:
                    n = len(past.ids)
                    keys[row, :, S - n:S] = past.keys[layer_index]
                    values[row, :, S - n:S] = past.values[layer_index]
            layer.restore(keys, values, S)
        return input_ids, mask, positions, cache, S

    def release(self) -> None:
        """Drop the cache buffers (nothing may be running)."""
        if self.slab is not None and not self.running:
            self.slab.release()
