"""The policy forward pass: log-probs (and entropy) of each response token, computing only
what the loss needs.

Two layouts give the same numbers (up to float rounding):

- **plain**: each row is ``[left-padded prompt, right-padded response]``, trimmed to the
  micro-batch's own longest prompt and response (no global padding);
- **prompt-once** (``actor.share_prompt_forward``): the n responses of a group share one
  prompt, so a group is packed as one row ``[prompt, response_1, ..., response_n]``. A 4-D
  attention mask lets each response see the prompt and its own past only, and position ids
  restart after the prompt, so each response sees exactly what it sees in the plain layout.
  The prompt is computed once per group: P + n*R tokens instead of n*(P + R). With SDPA
  attention the groups' rows lie back to back in a single row, without padding, and attention
  runs group by group on its span (``segment_attention``): every projection sees only real
  tokens, where padded rows would feed each group up to the longest group's length (at the
  default job's lengths 1.3-1.4x the real tokens).

In both layouts the vocabulary projection runs only at the positions that predict a
response token (never a (B, T, V) logits tensor), in row chunks.

Each family's own code decides the rest, so that both layouts compute what ``model(ids).logits``
computes (docs/training.md has the family table):

- **after the vocabulary projection** (Cohere's ``logit_scale``, Granite's ``logits_scaling``,
  Gemma's ``final_logit_softcapping``, and whatever a family's ``forward`` does after ``lm_head``):
  each chunk's logits come from the model's own ``forward``, run with its backbone stood in for by
  the hidden states already computed (``model_logits``); the temperature divides after that, as
  in the rollout engine.
- **sliding windows** (Mistral, Gemma-2/3/4, OLMo-3, Cohere-2, ...): the plain layout gets them
  from the model's own masks. In the prompt-once layout each attention call names its layer's
  window (``sliding_window``, the argument transformers passes to the attention function), and
  the segment mask for that window is used: a token sees keys less than the window away in
  *position*, as in the plain layout.
- **layouts the prompt-once packing cannot express** (linear-attention or recurrent layers, which
  would carry state from one group's tokens into the next; chunked attention; windows under a
  non-SDPA attention): such a model runs the plain layout, with a warning once per family
  (``grouped_layout_problem``).

Departure from verl: verl removes padding with flash-attention varlen kernels on a GPU; here
the same saving comes from the flat packing above, which works with CPU SDPA attention.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import MoeModelOutputWithPast

from rlvr.models.lora import unwrap

LOGIT_CHUNK_TOKENS = 1024  # rows of (tokens, V) logits alive at once in the vocabulary projection
PACK_FLAT = True  # prompt-once groups back to back in one row where the attention allows (else a padded row each)


@dataclass
class Segments:
    """The prompt-once masks that ``segment_attention`` applies.

    Flat: one row split into each group's span of ``lengths`` tokens, which attends only within
    itself under its own (1, 1, L, L) mask. Padded (``lengths`` None): one (G, 1, L, L) mask for
    the whole batch. ``masks`` are for full-attention layers, ``windowed[w]`` for layers of
    sliding window ``w``."""

    lengths: list[int] | None
    masks: list[torch.Tensor]
    windowed: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def for_window(self, window: int | None, module) -> list[torch.Tensor]:
        """The masks of a layer whose attention has sliding ``window`` (None: full attention)."""
        if window is None:
            return self.masks
        if window not in self.windowed:  # a window the config does not name: refuse rather than drop it
            raise ValueError(f"{type(module).__name__} asks for a sliding window of {window}, which its config does "
                             f"not name ({sorted(self.windowed)}); set actor.share_prompt_forward=false")
        return self.windowed[window]


@dataclass
class PackedGroups:
    """Groups packed for one forward, and where each response token's prediction sits.

    Padded: one row per group, ``attention_mask`` (G, 1, L, L). Flat: every group back to back in
    one row with no padding, ``segments`` saying where each group's attention begins and ends."""

    input_ids: torch.Tensor  # (G, L), or (1, T) flat
    position_ids: torch.Tensor  # (G, L), or (1, T) flat
    attention_mask: torch.Tensor | None  # (G, 1, L, L) bool, True = may attend, full attention; None when flat
    segments: Segments  # the masks of each window, for segment_attention
    gather_row: torch.Tensor  # (N,) packed row of each predicted response token
    gather_pos: torch.Tensor  # (N,) position in that row whose output predicts the token
    labels: torch.Tensor  # (N,) the response token
    out_row: torch.Tensor  # (N,) row of the token in the (B, R) response layout
    out_col: torch.Tensor  # (N,) column of the token in the (B, R) response layout


def response_lengths(data_batch: dict, prompt_width: int) -> torch.Tensor:
    """Tokens present in each response (attention mask over the response part; tool output included)."""
    return data_batch["attention_mask"][:, prompt_width:].sum(dim=-1)


def group_rows(uids) -> list[list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    groups: dict = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    return list(groups.values())


def prompt_groups(uids, batch: dict) -> list:
    """``uids`` refined so that rows share a group only when they share the prompt too: the packing
    takes a group's prompt from its first row, and the rows of one uid may hold other prompts (an
    agent whose first call was not the dataset's prompt, or the later samples of an episode whose
    context it rewrote). Rows whose prompt differs from their uid's first get a group of their own
    prompt."""
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    prompts, mask = batch["input_ids"][:, :P].cpu(), batch["attention_mask"][:, :P].cpu().bool()
    first: dict = {}
    groups = []
    for row, uid in enumerate(uids):
        prompt = tuple(prompts[row][mask[row]].tolist())
        groups.append(uid if first.setdefault(uid, prompt) == prompt else (uid, prompt))
    return groups


def pack_groups(prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                resp_lengths: torch.Tensor, groups: list[list[int]], pad_id: int, flat: bool = False,
                windows: tuple[int, ...] = ()) -> PackedGroups:
    """Pack each group's prompt (taken from its first row) and its responses into one row; with
    ``flat``, those rows back to back in a single row (see ``PackedGroups``). ``windows``: the
    sliding windows of the model's layers, each of which gets its masks."""
    rows, positions, segments = [], [], []
    gather_row, gather_pos, labels, out_row, out_col = [], [], [], [], []
    offset = 0  # where this group's row starts in the flat row
    for g, members in enumerate(groups):
        prompt = prompts[members[0]][prompt_mask[members[0]].bool()]
        P = len(prompt)
        parts, pos, seg = [prompt], [torch.arange(P)], [torch.zeros(P, dtype=torch.long)]
        start = P
        for i, row in enumerate(members, start=1):
            L = int(resp_lengths[row])
            parts.append(responses[row, :L])
            pos.append(P + torch.arange(L))
            seg.append(torch.full((L,), i, dtype=torch.long))
            # token t is predicted by the output at the previous position: the prompt's last
            # token for t = 0, the response's own token t-1 after that
            predictor = torch.cat([torch.tensor([P - 1]), start + torch.arange(L - 1)]) if L else torch.empty(0, dtype=torch.long)
            gather_row.append(torch.full((L,), 0 if flat else g, dtype=torch.long))
            gather_pos.append(predictor + (offset if flat else 0))
            labels.append(responses[row, :L])
            out_row.append(torch.full((L,), row, dtype=torch.long))
            out_col.append(torch.arange(L))
            start += L
        rows.append(torch.cat(parts))
        positions.append(torch.cat(pos))
        segments.append(torch.cat(seg))
        offset += start
    gathered = (torch.cat(gather_row), torch.cat(gather_pos), torch.cat(labels), torch.cat(out_row), torch.cat(out_col))
    if flat:
        masks = {w: [segment_mask(s[None], p[None], w) for s, p in zip(segments, positions)] for w in (None, *windows)}
        layout = Segments([len(r) for r in rows], masks.pop(None), masks)
        return PackedGroups(torch.cat(rows)[None], torch.cat(positions)[None], None, layout, *gathered)
    width = max(len(r) for r in rows)
    G = len(groups)
    input_ids = torch.full((G, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((G, width), dtype=torch.long)
    segment = torch.full((G, width), -1, dtype=torch.long)  # -1 marks padding
    for g, (r, p, s) in enumerate(zip(rows, positions, segments)):
        input_ids[g, :len(r)], position_ids[g, :len(p)], segment[g, :len(s)] = r, p, s
    full = segment_mask(segment)
    windowed = {w: [segment_mask(segment, position_ids, w)] for w in windows}
    return PackedGroups(input_ids, position_ids, full, Segments(None, [full], windowed), *gathered)


def segment_mask(segment: torch.Tensor, positions: torch.Tensor | None = None,
                 window: int | None = None) -> torch.Tensor:
    """(G, L) segment ids (0 prompt, i response i, -1 padding) -> (G, 1, L, L) attention mask.

    A query attends to earlier-or-same keys of the prompt or of its own segment; a padding
    position attends to itself only (a fully masked row would give NaN in SDPA). With a sliding
    ``window``, only to keys less than ``window`` away in ``positions`` (G, L): transformers'
    ``kv_idx > q_idx - window``, measured in position ids, which in the plain layout are the
    row's own indices (a response's segment starts at the position after its prompt).
    """
    L = segment.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L) key <= query
    q, k = segment.unsqueeze(2), segment.unsqueeze(1)  # (G, L, 1), (G, 1, L)
    visible = causal & (k == 0) & (q >= 0) | causal & (k == q) & (q > 0)
    if window is not None:
        visible &= positions.unsqueeze(2) - positions.unsqueeze(1) < window  # (G, L, L)
    visible |= torch.eye(L, dtype=torch.bool) & (q < 0)
    return visible.unsqueeze(1)


def _attention_mask_for(model, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean masks work with SDPA; other attention implementations take an additive mask."""
    if _uses_sdpa(model):
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def _uses_sdpa(model) -> bool:
    return getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"


def segment_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                      segments: Segments | None = None, **kwargs):
    """transformers' SDPA attention under the prompt-once masks of ``segments`` for this layer's
    window (the ``sliding_window`` transformers passes; None for a full-attention layer). Padded
    rows: one SDPA call under that mask. A flat packed row: SDPA within each group's span under
    that group's mask, the outputs side by side: (1, T, heads, D).

    Registered as transformers' ``"sdpa"`` attention (``_register_segment_attention``): every call
    without ``segments`` is transformers' own function, unchanged."""
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    _SEGMENT_CALLS[0] += 1
    masks = segments.for_window(kwargs.get("sliding_window"), module)
    if segments.lengths is None:  # padded rows: the whole batch under one mask
        return sdpa_attention_forward(module, query, key, value, masks[0].to(query.device), **kwargs)
    spans = zip(query.split(segments.lengths, dim=2), key.split(segments.lengths, dim=2),
                value.split(segments.lengths, dim=2), masks)
    outs = [sdpa_attention_forward(module, q, k, v, mask.to(q.device), **kwargs)[0] for q, k, v, mask in spans]
    return torch.cat(outs, dim=1), None


# calls that read a layout, counted here rather than on the layout: FSDP2 copies a forward's arguments
_SEGMENT_CALLS = [0]
_REGISTERED = [False]


def _register_segment_attention() -> None:
    if not _REGISTERED[0]:
        AttentionInterface.register("sdpa", segment_attention)
        _REGISTERED[0] = True


def token_log_probs(model, hidden: torch.Tensor, labels: torch.Tensor, temperature: float,
                    calculate_entropy: bool, entropy_grad: bool = False, topk: int = 0,
                    gather_ids: torch.Tensor | None = None, max_abs_logit: bool = False) -> tuple:
    """(N, H) hidden states at predicting positions -> (N,) log-probs of ``labels`` (and entropy).

    The vocabulary projection runs in chunks of ``LOGIT_CHUNK_TOKENS`` positions. When a
    backward will follow and there is more than one chunk, each chunk is recomputed in the
    backward (activation checkpointing) instead of keeping its fp32 (n, V) log-softmax: autograd
    then holds one chunk's logits at a time, not every response token's (at a 152k vocabulary,
    4 x 152064 bytes = 0.6 MB per token: 26 GB for a 40 x 1024-token micro-batch), for one more
    vocabulary projection per token. The entropy carries a gradient only with ``entropy_grad``
    (an entropy bonus in the loss); as a metric it is computed detached.

    For on-policy distillation, from the same log-softmax: ``topk`` > 0 adds the (N, k) largest
    log-probs and their token ids (a teacher's top-k); ``gather_ids`` (N, k) adds the log-probs at
    those ids (the student's, at its teacher's top-k). ``max_abs_logit`` adds each position's
    largest |logit| over the vocabulary, before the temperature (N,): the scale of the logits,
    which sets their rounding step in 16 bits (the freshness probe's tolerance). Any of these
    makes the result a 3-tuple, the third a dict of those tensors.
    """
    recompute = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > LOGIT_CHUNK_TOKENS
    parts: list[tuple] = []
    for start in range(0, hidden.shape[0], LOGIT_CHUNK_TOKENS):
        end = start + LOGIT_CHUNK_TOKENS
        args = (model, hidden[start:end], labels[start:end], temperature, calculate_entropy, entropy_grad, topk,
                None if gather_ids is None else gather_ids[start:end], max_abs_logit)
        if recompute:
            parts.append(torch.utils.checkpoint.checkpoint(_chunk_log_probs, *args, use_reentrant=False,
                                                           preserve_rng_state=False))
        else:
            parts.append(_chunk_log_probs(*args))
    if not parts:
        k = topk or (0 if gather_ids is None else gather_ids.shape[-1])
        parts = [(hidden.new_zeros(0, dtype=torch.float32), hidden.new_zeros(0) if calculate_entropy else None,
                  hidden.new_zeros(0, k, dtype=torch.float32) if topk or gather_ids is not None else None,
                  hidden.new_zeros(0, k, dtype=torch.long) if topk else None,
                  hidden.new_zeros(0, dtype=torch.float32) if max_abs_logit else None)]
    columns = [torch.cat(column) if column[0] is not None else None for column in zip(*parts)]
    log_probs, entropy = columns[0], columns[1]
    extra = {}
    if topk:
        extra.update(topk_log_probs=columns[2], topk_ids=columns[3])
    elif gather_ids is not None:
        extra["gathered_log_probs"] = columns[2]
    if max_abs_logit:
        extra["max_abs_logits"] = columns[4]
    return (log_probs, entropy, extra) if extra else (log_probs, entropy)


class _BackboneOutput(MoeModelOutputWithPast):
    """A backbone's output holding the last hidden states only; any other field a family's
    ``forward`` passes on (router logits, Gemma-4's shared key-value states) reads as None."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _StatesAsBackbone(torch.nn.Module):
    """Stands in for a model's backbone inside the model's own ``forward``: returns the hidden
    states it is given, as the backbone's output (no router logits: no auxiliary loss). Any other
    attribute is the backbone's (Falcon-H1's ``forward`` reads ``self.model.lm_head_multiplier``)."""

    def __init__(self, hidden: torch.Tensor, backbone: torch.nn.Module):
        super().__init__()
        self.hidden = hidden  # (1, n, H)
        self.__dict__["_backbone"] = backbone  # not a submodule: nothing of it runs or registers here

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_backbone"], name)

    def forward(self, *args, **kwargs) -> _BackboneOutput:
        return _BackboneOutput(last_hidden_state=self.hidden)


def model_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """(n, H) last hidden states -> (n, V) logits, as the model's own ``forward`` makes them from its
    backbone's output: the vocabulary projection and every transform the family applies after it
    (Cohere's ``logit_scale``, Granite's ``logits_scaling``, Gemma's soft-cap, ...).

    The model's ``forward`` runs with its backbone swapped, for this call, for a module returning
    ``hidden``: the family's own code, not a re-implementation of it. ``forward`` is called as a
    method, not through the module, so no hook (FSDP2's gathering) runs a second time."""
    lm = unwrap(model)
    prefix = lm.base_model_prefix
    if prefix not in lm._modules:
        raise ValueError(f"{type(lm).__name__} keeps no backbone under its base_model_prefix {prefix!r}; rlvr's "
                         "training forward cannot run its vocabulary projection")
    backbone = lm._modules[prefix]
    lm._modules[prefix] = _StatesAsBackbone(hidden.unsqueeze(0), backbone)
    try:  # input_ids only give the stand-in its length; labels None: no loss
        dummy = torch.zeros(1, hidden.shape[0], dtype=torch.long, device=hidden.device)
        logits = lm.forward(input_ids=dummy, use_cache=False).logits
    finally:
        lm._modules[prefix] = backbone
    return logits[0]


def _chunk_log_probs(model, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool,
                     entropy_grad: bool, topk: int = 0, gather_ids: torch.Tensor | None = None,
                     max_abs_logit: bool = False) -> tuple:
    """One chunk: (n, H) states -> (n,) log-probs of ``labels``, (n,) entropies or None, the
    (n, k) top-k log-probs or the log-probs at ``gather_ids`` (else None), the top-k ids (or
    None), and with ``max_abs_logit`` the (n,) largest |logit| of each position (else None). The
    temperature divides the family's logits, after its own transform, as in the rollout engine."""
    logits = model_logits(model, hidden).float()  # (n, V)
    peaks = logits.detach().abs().amax(dim=-1) if max_abs_logit else None  # (n,)
    if temperature != 1.0:  # the common T = 1 skips a pass over the (n, V) logits, forward and backward
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    log_probs = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if calculate_entropy:
        logp_h = logp if entropy_grad else logp.detach()  # H = -sum p log p, from the log-softmax already computed
        entropy = -(logp_h.exp() * logp_h).sum(dim=-1)
    k_values = k_ids = None
    if topk:
        k_values, k_ids = logp.topk(topk, dim=-1)  # (n, k) each, largest first
    elif gather_ids is not None:
        k_values = logp.gather(-1, gather_ids)  # (n, k)
    return log_probs, entropy, k_values, k_ids, peaks


def _hidden_states(model, **inputs) -> torch.Tensor:
    """Last hidden states of the backbone (the model without its vocabulary or value head; inside
    a LoRA wrapper, the wrapped model's backbone, whose layers carry the adapter)."""
    return unwrap(model).base_model(**inputs, use_cache=False).last_hidden_state


@dataclass
class ResponseStates:
    """Hidden states at the positions that predict response tokens, and where those tokens sit."""

    hidden: torch.Tensor  # (N, H)
    labels: torch.Tensor  # (N,) the response token each state predicts
    rows: torch.Tensor  # (N,) row in the (B, R) response layout
    cols: torch.Tensor  # (N,) column in the (B, R) response layout


def response_states_plain(model, batch: dict) -> ResponseStates:
    """Padded rows, trimmed to this micro-batch's longest prompt and response."""
    responses = batch["responses"]  # (b, R)
    P_total = batch["input_ids"].shape[1] - responses.shape[1]
    attention_mask = batch["attention_mask"]
    R = int(response_lengths(batch, P_total).max()) if len(responses) else 0
    first = int((attention_mask[:, :P_total].sum(dim=0) > 0).nonzero().min()) if P_total else 0
    end = P_total + max(R, 1)
    hidden = _hidden_states(model, input_ids=batch["input_ids"][:, first:end],
                            attention_mask=attention_mask[:, first:end], position_ids=batch["position_ids"][:, first:end])
    # the output at column c predicts the token at c + 1: responses start at column P_total
    P = P_total - first
    rows, cols = attention_mask[:, P_total:P_total + R].bool().nonzero(as_tuple=True)
    return ResponseStates(hidden[rows, P - 1 + cols], responses[rows, cols], rows, cols)


def response_states_packed(model, batch: dict, uids, pad_id: int) -> ResponseStates:
    """Groups packed with a prompt-once attention mask (see the module docstring).

    With SDPA attention the groups lie back to back in one row (``flat``): the projections see no
    padding, where one padded row per group feeds each group's row up to the longest group's
    length through every layer (a third more tokens at the default job's lengths)."""
    responses = batch["responses"]
    P_total = batch["input_ids"].shape[1] - responses.shape[1]
    backbone = unwrap(model).base_model
    flat = _flat_packing_possible(model)
    args = (batch["input_ids"][:, :P_total].cpu(), batch["attention_mask"][:, :P_total].cpu(), responses.cpu(),
            response_lengths(batch, P_total).cpu(), group_rows(uids), pad_id)
    windows = sliding_windows(backbone.config)
    device = responses.device

    def run(packed: PackedGroups) -> torch.Tensor:
        inputs = dict(input_ids=packed.input_ids.to(device), position_ids=packed.position_ids.to(device),
                      segments=packed.segments)
        if packed.attention_mask is not None:  # padded: the full-attention mask, for an attention that reads it
            mask = _attention_mask_for(model, packed.attention_mask.to(device), model.dtype)
            return _hidden_states(model, **inputs, attention_mask=mask)
        # a 4-D mask is passed through untouched (no (T, T) mask is built); segment_attention reads the spans
        return _hidden_states(model, **inputs, attention_mask=FLAT_MASK_PLACEHOLDER)

    packed = pack_groups(*args, flat=flat, windows=windows)
    _register_segment_attention()
    calls = _SEGMENT_CALLS[0]
    hidden = run(packed)
    if _SEGMENT_CALLS[0] == calls and flat:  # attention of its own (remote code): it saw one unmasked row, so
        _BYPASSES_SEGMENTS.add(type(backbone))  # its output is thrown away and the padded layout used
        if windows:  # which cannot give that attention its windows
            return response_states(model, batch, uids, True, pad_id)
        packed = pack_groups(*args, windows=windows)
        hidden = run(packed)
    picked = pick_states(hidden, packed.gather_row.to(device), packed.gather_pos.to(device))  # (N, H)
    return ResponseStates(picked, packed.labels.to(device), packed.out_row.to(device), packed.out_col.to(device))


def pick_states(hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``hidden[rows, cols]`` of a (B, T, H) tensor, through ``index_select``: the prompt's last state
    is picked once per response of its group, and the backward must add those gradients in a fixed
    order. Advanced indexing's CPU backward (``index_put_`` with accumulate) adds them with parallel
    atomic adds, whose order follows the threads' scheduling: two runs of the default job on a
    loaded machine differed in step 1's grad_norm (last bit), then in the samples.
    ``index_select``'s backward (``index_add_``) adds them in index order."""
    B, T, H = hidden.shape
    return hidden.reshape(B * T, H).index_select(0, rows * T + cols)


FLAT_MASK_PLACEHOLDER = torch.ones(1, 1, 1, 1, dtype=torch.bool)
_BYPASSES_SEGMENTS: set[type] = set()  # backbones whose attention does not go through transformers' "sdpa"
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "attention"}
# token mixers that are not attention (state-space, linear attention, convolution, recurrence), by class name:
# the net under layer_types, for hybrids whose config names none (Falcon-H1, Jamba, Zamba, Nemotron-H, ...)
RECURRENT_MIXER = re.compile(r"Mamba\w*(Mixer|Layer)$|Mixer$|DeltaNet$|LinearAttention$|ShortConv\w*$|"
                             r"LightningAttention$|RecurrentBlock$|Rglru$|RwkvSelfAttention$")
_WARNED: set[type] = set()  # model classes already told that they run the plain layout


def sliding_windows(config) -> tuple[int, ...]:
    """The sliding windows the model's layers use (empty: full attention everywhere)."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return ()
    return (int(window),)


def grouped_layout_problem(model) -> str | None:
    """Why the prompt-once layout cannot compute what ``model`` computes, or None when it can.

    The packing puts several sequences in one row and keeps them apart by the attention mask:
    a layer that mixes tokens outside attention (linear attention, state-space, convolution)
    would carry one group's state into the next; chunked attention counts chunks from each
    row's first token, which packing moves; an attention that is not transformers' SDPA
    (remote code) would not see the windows."""
    backbone = unwrap(model).base_model
    config = backbone.config
    types = set(getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None) or ())
    recurrent = sorted(types - ATTENTION_LAYER_TYPES) or sorted(
        {type(m).__name__ for m in backbone.modules() if RECURRENT_MIXER.search(type(m).__name__)})
    if recurrent:
        return f"its {', '.join(recurrent)} layers carry state along the row, which would mix the packed groups"
    if getattr(config, "attention_chunk_size", None):
        return "its chunked attention counts chunks from each row's first token, which the packing moves"
    if sliding_windows(config) and (not _uses_sdpa(backbone) or type(backbone) in _BYPASSES_SEGMENTS):
        return "its sliding windows need transformers' SDPA attention, which this model does not use"
    return None


def response_states(model, batch: dict, uids, share_prompt: bool, pad_id: int) -> ResponseStates:
    """Prompt-once layout when ``share_prompt`` and some rows share a ``uid``; when none do (one
    response a prompt: PPO, distillation), the same flat packing with groups of one row, which
    feeds no padding, where the model's attention is SDPA; else the plain layout. A micro-batch
    of short responses beside one long one pads the plain layout to twice its real tokens (16 rows
    of 48-token prompts and 6-19 response tokens beside one of 64: 1.9x faster packed, forward
    and backward of the built-in model).

    A model the prompt-once layout cannot express (``grouped_layout_problem``) runs the plain
    layout, and says so once per model class when it had a prompt to share."""
    if share_prompt and uids is not None:
        uids = prompt_groups(uids, batch)
        shared = len(set(uids)) < len(uids)
        if shared or _flat_packing_possible(model):
            problem = grouped_layout_problem(model)
            if problem is None:
                return response_states_packed(model, batch, uids, pad_id)
            cls = type(unwrap(model))
            if shared and cls not in _WARNED:
                _WARNED.add(cls)
                warnings.warn(f"{cls.__name__}: the training forward runs one row per sample, not the prompt-once "
                              f"layout (actor.share_prompt_forward), because {problem}", stacklevel=2)
    return response_states_plain(model, batch)


def _flat_packing_possible(model) -> bool:
    """Whether the packed layout would lay its groups back to back (else it pads one row a group)."""
    backbone = unwrap(model).base_model
    return PACK_FLAT and _uses_sdpa(backbone) and type(backbone) not in _BYPASSES_SEGMENTS


def scatter_responses(values: torch.Tensor, states: ResponseStates, shape) -> torch.Tensor:
    """Put per-token values back into the (B, R) response layout (zeros elsewhere)."""
    return values.new_zeros(shape).index_put((states.rows, states.cols), values)


def autocast(device: torch.device, dtype: str):
    """bfloat16 autocast when ``dtype`` is bfloat16; a no-op context for float32."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def forward_log_probs(model, batch: dict, uids, temperature: float, calculate_entropy: bool = False,
                      entropy_grad: bool = False, share_prompt: bool = True, pad_id: int = 0, dtype: str = "float32",
                      topk: int = 0, gather_ids: torch.Tensor | None = None, max_abs_logit: bool = False):
    """Log-probs (and entropy) of every response token, (B, R) each, zero at padding.

    ``batch`` holds ``input_ids``, ``attention_mask``, ``position_ids`` and ``responses``;
    ``uids`` (or None) names each row's group for the prompt-once layout. ``topk``, ``gather_ids``
    (B, R, k) or ``max_abs_logit`` add a third result (``token_log_probs``), each tensor (B, R, k)
    or, for ``max_abs_logits``, (B, R).
    """
    shape = batch["responses"].shape
    with autocast(batch["input_ids"].device, dtype):
        states = response_states(model, batch, uids, share_prompt, pad_id)
        ids = None if gather_ids is None else gather_ids[states.rows, states.cols]  # (N, k)
        lp, ent, *extra = token_log_probs(model, states.hidden, states.labels, temperature, calculate_entropy,
                                          entropy_grad, topk, ids, max_abs_logit)
        if lp.numel() == 0 and states.hidden.requires_grad:  # no response token at all (failed agent episodes):
            lp = lp + states.hidden.sum() * 0.0  # still a graph, so the backward runs (zero gradients, every collective)
    out = (scatter_responses(lp, states, shape), None if ent is None else scatter_responses(ent, states, shape))
    if not extra:
        return out
    return (*out, {name: scatter_responses(values, states, (*shape, *values.shape[1:]))
                   for name, values in extra[0].items()})
