"""The prompt-once forward equals the plain padded forward (and both equal a full forward)."""

import numpy as np
import pytest
import torch

from rlvr.models import load_model
from rlvr.workers.forward import forward_log_probs, group_rows, pack_groups, prompt_groups, segment_mask


def test_segment_mask_by_hand():
    # prompt of 2 (seg 0), response 1 of 2 tokens, response 2 of 1 token, one pad
    seg = torch.tensor([[0, 0, 1, 1, 2, -1]])
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],  # prompt token 0: itself
        [1, 1, 0, 0, 0, 0],  # prompt token 1: causal prompt
        [1, 1, 1, 0, 0, 0],  # response 1 token 0: prompt + itself
        [1, 1, 1, 1, 0, 0],  # response 1 token 1: prompt + response 1
        [1, 1, 0, 0, 1, 0],  # response 2 token 0: prompt + itself, not response 1
        [0, 0, 0, 0, 0, 1],  # padding: itself only (no fully masked row)
    ], dtype=torch.bool)
    assert torch.equal(segment_mask(seg)[0, 0], expected)


def test_pack_groups_layout():
    prompts = torch.tensor([[0, 5, 6], [0, 5, 6]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    responses = torch.tensor([[7, 8], [9, 0]])
    packed = pack_groups(prompts, prompt_mask, responses, torch.tensor([2, 1]), [[0, 1]], pad_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # positions restart after the prompt
    # 7 is predicted by the prompt's last token (pos 1), 8 by 7 (pos 2), 9 by the prompt's last token again
    assert packed.gather_pos.tolist() == [1, 2, 1]
    assert packed.labels.tolist() == [7, 8, 9]
    assert list(zip(packed.out_row.tolist(), packed.out_col.tolist())) == [(0, 0), (0, 1), (1, 0)]


def test_pack_groups_flat_layout():
    """Flat: the groups' rows back to back in one row, no padding; each group keeps its own mask."""
    prompts = torch.tensor([[0, 5, 6], [0, 5, 6], [3, 4, 2]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    responses = torch.tensor([[7, 8], [9, 0], [1, 0]])
    packed = pack_groups(prompts, prompt_mask, responses, torch.tensor([2, 1, 1]), [[0, 1], [2]], pad_id=0, flat=True)
    # group 0: [5, 6 | 7, 8 | 9] (5 tokens), group 1: [3, 4, 2 | 1] (4 tokens); nothing padded to 5
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 3, 4, 2, 1]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2, 3]]
    # predictors: 7 <- 6 (pos 1), 8 <- 7 (2), 9 <- 6 (1); group 1 starts at 5: 1 <- 2 (5 + 2)
    assert packed.gather_pos.tolist() == [1, 2, 1, 7] and packed.gather_row.tolist() == [0, 0, 0, 0]
    assert packed.attention_mask is None and packed.segments.lengths == [5, 4]
    assert torch.equal(packed.segments.masks[0], segment_mask(torch.tensor([[0, 0, 1, 1, 2]])))
    assert torch.equal(packed.segments.masks[1], segment_mask(torch.tensor([[0, 0, 0, 1]])))


def test_flat_packing_feeds_only_real_tokens(batch, tiny_model_dir):
    """The prompt-once forward feeds the model the groups' real tokens in one row: prompt + its
    responses per group (7 + 3 + 5 and 2 + 7 + 1 response tokens), where a padded row per group would
    feed 2 x the longer group. Its log-probs are the padded layout's (each group attends only to itself)."""
    from rlvr.workers import forward

    model = load_model(tiny_model_dir)
    b, uids = batch.batch, batch.non_tensor_batch["uid"]
    P = b["input_ids"].shape[1] - b["responses"].shape[1]
    p0, p1 = int(b["attention_mask"][0, :P].sum()), int(b["attention_mask"][3, :P].sum())
    assert p0 + 15 != p1 + 10  # the groups differ in length: padding would show
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    with torch.no_grad():
        flat, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=True)
    hook.remove()
    assert shapes == [(1, p0 + 15 + p1 + 10)]
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(forward, "_uses_sdpa", lambda model: False)  # the padded layout, as for other attentions
        padded, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=True)
    assert (flat - padded).abs().max() < 1e-5 and flat.abs().sum() > 0


def test_one_response_a_prompt_is_packed_without_padding(batch, tiny_model_dir):
    """Rows that share no prompt (PPO's and distillation's n=1) go back to back in one row too: the
    six rows' prompts and their 7 + 3 + 5 + 2 + 7 + 1 response tokens, where the plain layout feeds
    each row its prompt plus the longest response (6 x 7 = 42 response positions). The log-probs are
    the plain layout's."""
    model = load_model(tiny_model_dir)
    b = batch.batch
    uids = [f"row{i}" for i in range(len(b["responses"]))]
    P = b["input_ids"].shape[1] - b["responses"].shape[1]
    prompts = int(b["attention_mask"][:, :P].sum())
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    with torch.no_grad():
        packed, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=True)
        hook.remove()
        plain, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=False)
    assert shapes == [(1, prompts + 25)]
    assert (packed - plain).abs().max() < 1e-5 and packed.abs().sum() > 0


def test_a_model_that_bypasses_segment_attention_gets_the_padded_layout(batch, tiny_model_dir, monkeypatch):
    """A model whose attention does not go through transformers' "sdpa" entry (remote code) never
    reads the spans and would attend across the whole flat row: its output is discarded, the padded
    layout used, and the model's class remembered."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlvr.workers import forward

    model = load_model(tiny_model_dir)
    b, uids = batch.batch, batch.non_tensor_batch["uid"]
    with torch.no_grad():
        expected, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=False)
    forward._register_segment_attention()
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", sdpa_attention_forward)  # ignores segments
    monkeypatch.setattr(forward, "_BYPASSES_SEGMENTS", set())
    with torch.no_grad():
        got, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=True)
    assert (got - expected).abs().max() < 1e-5
    assert forward._BYPASSES_SEGMENTS == {type(model.model)}


def test_group_rows_keeps_first_appearance_order():
    assert group_rows(["b", "a", "b", "a"]) == [[0, 2], [1, 3]]


def _full_forward_log_probs(model, b):
    R = b["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits[:, -R - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]


def _log_probs_and_grad(model, b, uids, share):
    model.zero_grad()
    lp, ent = forward_log_probs(model, b, uids, temperature=0.7, calculate_entropy=True, entropy_grad=True,
                                share_prompt=share)
    (lp.sum() + 0.1 * ent.sum()).backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return lp.detach(), ent.detach(), grad


@pytest.mark.parametrize("which", ["tiny", "builtin"])
def test_prompt_once_equals_plain(which, batch, tiny_model_dir, builtin_dir):
    model = load_model(tiny_model_dir if which == "tiny" else builtin_dir).train()
    b, uids = batch.batch, batch.non_tensor_batch["uid"]
    plain_lp, plain_ent, plain_grad = _log_probs_and_grad(model, b, uids, share=False)
    packed_lp, packed_ent, packed_grad = _log_probs_and_grad(model, b, uids, share=True)
    assert (plain_lp - packed_lp).abs().max() < 1e-4
    assert (plain_ent - packed_ent).abs().max() < 1e-4
    assert plain_grad.abs().max() > 0
    assert ((plain_grad - packed_grad).norm() / plain_grad.norm()) < 1e-4
    # and both equal a full forward with full logits (temperature 1 here)
    full = _full_forward_log_probs(model, b)
    lp1, _ = forward_log_probs(model, b, uids, 1.0, share_prompt=True)
    assert (full - lp1.detach()).abs().max() < 1e-4
    assert torch.all(lp1[b["response_mask"] == 0] == 0)


@pytest.mark.parametrize("share", [False, True])
def test_max_abs_logit_is_the_largest_logit_of_the_full_forward(batch, tiny_model_dir, share):
    """``max_abs_logit``: each response token's largest |logit| over the vocabulary, as
    ``model(ids).logits`` has it, before the temperature (the freshness probe's scale), 0 at padding."""
    model = load_model(tiny_model_dir).eval()
    b, uids = batch.batch, batch.non_tensor_batch["uid"]
    R = b["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits[:, -R - 1:-1]  # (B, R, V)
        lp, _, extra = forward_log_probs(model, b, uids, 0.7, share_prompt=share, max_abs_logit=True)
    expected = logits.float().abs().amax(-1) * b["response_mask"]  # (B, R)
    assert set(extra) == {"max_abs_logits"} and extra["max_abs_logits"].shape == lp.shape
    assert torch.allclose(extra["max_abs_logits"], expected, atol=1e-4) and expected.max() > 0


def test_rows_of_one_uid_with_other_prompts_get_their_own_prompt(batch, tiny_model_dir):
    """One uid over rows whose prompts differ (an agent's first call that is not the dataset's
    prompt; an episode's samples after a rewritten context): the packing takes a group's prompt from
    its first row, so each prompt gets a group of its own and the log-probs equal the plain
    layout's (packed behind the first prompt, rows 3-5 are scored in the wrong context: 0.05 nats
    off with the tiny random model)."""
    model = load_model(tiny_model_dir)
    one_uid = np.array(["g"] * len(batch), dtype=object)
    plain, _ = forward_log_probs(model, batch.batch, one_uid, 1.0, share_prompt=False)
    packed, _ = forward_log_probs(model, batch.batch, one_uid, 1.0, share_prompt=True)
    assert (plain - packed).abs().max() < 1e-4
    assert prompt_groups(one_uid, batch.batch)[:4] == ["g", "g", "g", ("g", tuple(
        batch.batch["input_ids"][3, :-7][batch.batch["attention_mask"][3, :-7].bool()].tolist()))]


def test_trims_global_padding(batch, tiny_model_dir):
    """Extra left padding on prompts and right padding on responses changes nothing."""
    model = load_model(tiny_model_dir)
    b = batch.batch
    pad = 4
    wide = {k: torch.cat([torch.zeros(len(batch), pad, dtype=v.dtype), v[:, :-7], v[:, -7:],
                          torch.zeros(len(batch), pad, dtype=v.dtype)], 1)
            for k, v in b.items() if k in ("input_ids", "attention_mask", "position_ids")}
    wide["responses"] = torch.cat([b["responses"], torch.zeros(len(batch), pad, dtype=torch.long)], 1)
    with torch.no_grad():
        narrow_lp, _ = forward_log_probs(model, b, None, 1.0, share_prompt=False)
        wide_lp, _ = forward_log_probs(model, wide, None, 1.0, share_prompt=False)
    assert torch.allclose(wide_lp[:, :7], narrow_lp, atol=1e-5)
    assert torch.all(wide_lp[:, 7:] == 0)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_log_probs_recompute_keeps_one_chunk_and_equal_gradients(tiny_model_dir, monkeypatch, entropy_grad):
    """With more than one chunk and a backward to come, each chunk's logits are recomputed in the
    backward: the same log-probs, entropies and gradients (hidden states and head weight) as keeping
    them, while autograd holds no (n, V) tensor. Kept, 10 tokens x 49152 x 4 bytes = 1.97 MB per
    fp32 (n, V) tensor (the log-softmax and its exp, among others)."""
    from rlvr.workers import forward

    monkeypatch.setattr(forward, "LOGIT_CHUNK_TOKENS", 4)  # 10 tokens: chunks of 4, 4, 2
    model = load_model(str(tiny_model_dir))
    head, V = model.get_output_embeddings(), model.config.vocab_size
    hidden = torch.randn(10, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(1))

    def run(recompute: bool):
        model.zero_grad()
        h = hidden.clone().requires_grad_(True)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if recompute:
                lp, ent = forward.token_log_probs(model, h, labels, 0.7, True, entropy_grad)
            else:  # the same chunks, kept
                parts = [forward._chunk_log_probs(model, h[s:s + 4], labels[s:s + 4], 0.7, True, entropy_grad)
                         for s in range(0, 10, 4)]
                lp, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        (lp.sum() + (0.1 * ent.sum() if entropy_grad else 0)).backward()
        return lp.detach(), ent.detach(), h.grad, head.weight.grad.clone(), max(saved)

    lp_r, ent_r, gh_r, gw_r, biggest_r = run(True)
    lp_k, ent_k, gh_k, gw_k, biggest_k = run(False)
    assert torch.equal(lp_r, lp_k) and torch.equal(ent_r, ent_k)
    assert torch.allclose(gh_r, gh_k, rtol=1e-6, atol=1e-8) and torch.allclose(gw_r, gw_k, rtol=1e-6, atol=1e-8)
    assert biggest_k >= 4 * V * 4  # kept: a chunk's (4, V) fp32 log-softmax at least
    assert biggest_r < 4 * V  # recomputed: nothing of vocabulary width is held


def test_additive_mask_is_built_where_the_boolean_mask_lies():
    """Attention other than SDPA (eager) takes an additive mask: 0 where a key is visible, the
    dtype's minimum where not. It was built on the CPU whatever the mask's device, and the padded
    layout failed on CUDA (found by bench/gpu.py --parts parity on a lent H100); the meta device
    stands in for CUDA here."""
    from types import SimpleNamespace

    from rlvr.workers.forward import _attention_mask_for

    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    mask = torch.tensor([[True, False], [True, True]]).view(1, 1, 2, 2)
    additive = _attention_mask_for(eager, mask, torch.float32)
    assert additive[0, 0].tolist() == [[0.0, torch.finfo(torch.float32).min], [0.0, 0.0]]
    assert _attention_mask_for(eager, mask.to("meta"), torch.float32).device.type == "meta"
