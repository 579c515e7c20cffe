"""LoRA adapters on the policy (peft), as verl configures them: ``model.lora_rank`` (0: full
fine-tuning), ``model.lora_alpha`` and ``model.target_modules``.

With an adapter the actor trains only the adapter's parameters; the reference policy is the
same model with the adapter disabled (no second copy of the weights); the rollout engine
generates with the adapter applied. Departure from verl, which merges the adapter into the
rollout engine's weights: rlvr's engine shares the actor's weights, and merging into them
then unmerging would drift the frozen base weights by a rounding step per update (so a
resumed run would no longer equal the uninterrupted one). The lean decode step instead adds
the low-rank term itself, ``x @ A.T @ B.T * scaling``, exactly as peft's layers do
(``lora_delta``).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def apply_lora(model, rank: int, alpha: float, target_modules, task_type: str = "CAUSAL_LM",
               modules_to_save: list[str] | None = None):
    """``model`` wrapped in a peft LoRA adapter (dropout 0, so the rollout and the update see
    the same function); only the adapter's parameters (and ``modules_to_save``, trained whole,
    such as a critic's fresh value head) require gradients."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    if not isinstance(targets, str):
        check_targets(model, targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                        task_type=task_type, modules_to_save=modules_to_save)
    with warnings.catch_warnings():  # peft asks transformers a deprecated question; nothing for the user to do
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*is_gradient_checkpointing")
        return get_peft_model(model, config)


def check_targets(model, targets: list[str]) -> None:
    """Every name in ``targets`` matches a module (peft's rule: the module's name, or its last
    dotted parts). peft raises only when none matches, and then lists nothing to choose from; one
    name among others that matches nothing is dropped silently."""
    from rlvr.config import ConfigError

    names = [name for name, _ in model.named_modules()]
    unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"target_modules {unmatched} match no module of the model; its linear layers are {linear} "
                          "(set actor_rollout_ref.model.target_modules, or critic.model.target_modules, to some of "
                          "them, or to all-linear)")


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def unwrap(model):
    """The transformers model inside a peft wrapper (its layers carry the adapter), or ``model``."""
    return model.get_base_model() if is_peft(model) else model


def lora_delta(proj, x: torch.Tensor) -> torch.Tensor | None:
    """The active adapters' term of a peft LoRA linear layer for input ``x``, or None when
    ``proj`` has no adapter in use (not a LoRA layer, adapters disabled, or merged)."""
    if not hasattr(proj, "lora_A") or getattr(proj, "disable_adapters", False) or getattr(proj, "merged", False):
        return None
    delta = None
    for name in proj.active_adapters:
        if name in proj.lora_A:
            term = proj.lora_B[name](proj.lora_A[name](x)) * proj.scaling[name]
            delta = term if delta is None else delta + term
    return delta


def active_adapters(layer) -> list[str]:
    """The adapters of a peft LoRA layer that change its output now: active, not merged, and
    holding weights in this layer (a linear layer's in ``lora_A``, an embedding's in
    ``lora_embedding_A``: peft keeps the two apart)."""
    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return []
    held = set(layer.lora_A) | set(getattr(layer, "lora_embedding_A", {}))
    return [name for name in layer.active_adapters if name in held]


def merged_config(model):
    """``model.config`` for a copy of the model that holds its weights merged (vLLM's engine): an
    adapter on a tied input embedding or head unties them there. peft adapts the one layer alone and
    the other keeps the base weight, so a copy that ties the two would read the adapted weight as
    both."""
    config = copy.deepcopy(model.config)
    head = model.get_output_embeddings()
    adapted = getattr(model.get_input_embeddings(), "lora_embedding_A", None) or getattr(head, "lora_A", None)
    if adapted and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
    return config


def save_adapter(model, folder: Path) -> None:
    """The adapter (weights and config) in peft's format: ``PeftModel.from_pretrained(base, folder)``."""
    model.save_pretrained(folder, safe_serialization=True)


def load_adapter(model, folder: Path) -> None:
    """Adapter weights saved by ``save_adapter`` into ``model`` (same rank and targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(folder / ADAPTER_WEIGHTS)))
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"{folder}: adapter weights do not fit this model: {result.unexpected_keys[:5]}")


def merged_model(base_path: str, adapter_folder: Path):
    """A LoRA checkpoint's policy as a plain transformers model (``rlvr export``): the base model with
    the saved adapter merged in, computing what the policy computed in training. peft adapts a tied
    input embedding (or head) alone, the other keeping the base weight; merged into the one tensor
    both share, the adapted weight would serve as both. So the head gets a copy first, and the two
    are tied again only if the merge left them equal (an adapter on neither)."""
    from peft import PeftModel

    from rlvr.models.loader import load_model

    model = load_model(base_path)
    config = model.config.get_text_config()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        config.tie_word_embeddings = model.config.tie_word_embeddings = False
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    merged = PeftModel.from_pretrained(model, adapter_folder).merge_and_unload()
    head, embedding = merged.get_output_embeddings(), merged.get_input_embeddings()
    if tied and torch.equal(head.weight, embedding.weight):
        config.tie_word_embeddings = merged.config.tie_word_embeddings = True
        head.weight = embedding.weight
    return merged
