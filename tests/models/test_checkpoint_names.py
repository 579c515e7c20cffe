"""Mixtures of experts under transformers 5: experts fused in memory, stored per expert. Resume
and the vLLM weight stream use the stored (checkpoint) names; the conversion is transformers'
own, so the expected names here are the ones ``save_pretrained`` writes."""

import pytest
import torch

from rlvr.models.checkpoint_names import checkpoint_names, from_checkpoint_names, to_checkpoint_names
from rlvr.models.loader import check_weight_names, load_tokenizer, read_weights, stored_weight_names
from rlvr.models.tiny import make_tiny_moe

# what each family stores for layer 0's experts block: 4 experts x (gate, up, down), plus the router
STORED = {"qwen3_moe": ("model.layers.0.mlp.", ("gate_proj", "up_proj", "down_proj")),
          "mixtral": ("model.layers.0.block_sparse_moe.", ("w1", "w3", "w2"))}  # Mixtral's own checkpoint names


@pytest.fixture(scope="module")
def tokenizer(builtin_dir):
    return load_tokenizer(builtin_dir)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_saved_experts_are_checked_and_loaded_under_their_stored_names(tmp_path, tokenizer, family):
    model = make_tiny_moe(tokenizer, family)
    in_memory = model.state_dict()
    assert in_memory["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)  # (experts, 2 x 32, hidden)
    model.save_pretrained(tmp_path)
    stored = stored_weight_names(tmp_path)
    block, matrices = STORED[family]
    assert {f"{block}experts.{e}.{m}.weight" for e in range(4) for m in matrices} | {f"{block}gate.weight"} == \
        {n for n in stored if n.startswith(block)}
    assert set(stored) == checkpoint_names(model)
    check_weight_names(model, stored, tmp_path)  # refused before: 'missing' the fused names, 'unexpected' the rest
    loaded = from_checkpoint_names(model, read_weights(tmp_path))
    assert loaded.keys() == in_memory.keys()
    assert all(torch.equal(loaded[k], in_memory[k]) for k in in_memory)


def test_one_fused_tensor_streams_as_its_experts_matrices(tokenizer):
    """The vLLM stream converts one in-memory tensor at a time: gate_up_proj (experts, 2 I, H) is
    each expert's gate (first I rows) and up (last I rows) projection."""
    model = make_tiny_moe(tokenizer)
    fused = model.model.layers[1].mlp.experts.gate_up_proj
    sent = to_checkpoint_names(model, {"model.layers.1.mlp.experts.gate_up_proj": fused})
    assert len(sent) == 8
    assert torch.equal(sent["model.layers.1.mlp.experts.2.gate_proj.weight"], fused[2, :32])
    assert torch.equal(sent["model.layers.1.mlp.experts.2.up_proj.weight"], fused[2, 32:])
