"""Weights under their checkpoint names: the names a model folder stores and vLLM's loaders read.

transformers 5 converts some families' weights as it loads them (its ``conversion_mapping``):
a mixture of experts' per-expert matrices (``mlp.experts.0.gate_proj.weight``, ...) become
fused 3-D tensors in memory (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``), and
``save_pretrained`` reverts the conversion. rlvr's checkpoints are written by
``save_pretrained``, so resuming compares and loads the stored tensors under the checkpoint
names, and the vLLM weight stream sends them too: transformers' own conversion, reverted to
save and stream, applied to load. A family without a conversion keeps its names.
"""

from __future__ import annotations

import copy

import torch


def to_checkpoint_names(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (in-memory names) as ``save_pretrained`` writes it: fused experts split per
    expert. Each in-memory tensor converts on its own, so a stream may pass one at a time."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, state)


def from_checkpoint_names(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (checkpoint names) as the model holds it in memory, converted the way
    ``from_pretrained`` converts a folder (per-expert matrices stacked and fused)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (PrefixChange, WeightConverter, WeightRenaming, dot_natural_key,
                                                 rename_source_key)

    transforms = [t for t in get_model_conversion_mapping(model) if not isinstance(t, PrefixChange)]
    if not transforms:
        return dict(state)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    targets: dict[str, WeightRenaming | WeightConverter] = {}
    for key, tensor in sorted(state.items(), key=lambda kv: dot_natural_key(kv[0])):  # experts 0, 1, ..., 10 in order
        renamed, pattern = rename_source_key(key, renamings, converters)
        if pattern is None:
            target = targets.setdefault(renamed, WeightRenaming(key, renamed))
            pattern = key
        else:
            target = targets.setdefault(renamed, copy.deepcopy(by_pattern[pattern]))  # one per target, as transformers
        target.add_tensor(renamed, key, pattern, tensor)
    converted = {}
    for first, target in targets.items():
        for name, value in target.convert(first, model=model, config=model.config).items():
            converted[name] = value[0] if isinstance(value, list) else value
    return converted


def checkpoint_names(model) -> set[str]:
    """The names ``save_pretrained`` stores for ``model``'s state (found on meta tensors: no
    data is touched, a sharded model's included)."""
    meta = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in model.state_dict().items()}
    return set(to_checkpoint_names(model, meta))
