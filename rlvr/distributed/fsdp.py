"""FSDP2 for the actor and the reference (``actor.strategy=fsdp2``).

``shard`` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer, then to a
root unit around the whole model, with the mixed-precision policy of ``fsdp_config``.
The root is ``FSDPRoot``: its forward runs a given function on the model, so the
parameters outside the layers (embeddings, final norm, the head) are gathered for
everything the function does, including rlvr's chunked vocabulary projection, which
calls the backbone and the head separately.

Each rank's loss is its share of the global loss (normalised by the global token and
sequence totals), so the ranks' gradients must be summed; FSDP2 averages them (gloo has no
pre-multiplied sum to change that), so the actor scales its loss by the world size before
the backward: a step's gradient does not depend on the number of ranks.

The model is loaded once: every rank builds it with its parameters on the meta device
(``models.loader.empty_model``), shards it, and ``load_sharded`` gives each rank its shards
from one full state that only rank 0 holds (read from disk once), broadcast one tensor at
a time; the reference is sharded from the same state. No rank ever holds a second full copy.

The rollout engine decodes on unsharded weights (ranks decode different numbers of steps,
which collectives inside the sharded model would not survive), but only while a rollout
runs: ``EngineWeights`` gathers them from the shards one tensor at a time, in the engine's
dtype, when a rollout starts and frees their storage when it ends, so training holds the
shards alone. Checkpoints hold full, name-keyed states (``full_optimizer_state``), so a run
saved on some number of ranks loads on any other.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


class FSDPRoot(nn.Module):
    """The outermost sharded unit: ``root(fn, *args)`` runs ``fn(model, *args)`` with the root
    parameters gathered."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn, *args, **kwargs):
        return fn(self.module, *args, **kwargs)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the ``ModuleList`` named ``...layers`` (Llama, Qwen, Mistral, ...)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            return list(module)
    raise ValueError(f"{type(model).__name__} has no list of decoder layers (a ModuleList named 'layers', 'h' or "
                     "'blocks') for FSDP2 to shard one by one")


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def shard(model: nn.Module, device: torch.device, world_size: int, reshard_after_forward: bool = True,
          param_dtype: str = "float32", reduce_dtype: str = "float32") -> FSDPRoot:
    """Shard ``model`` over the ``world_size`` ranks of the process group; returns its root unit."""
    mesh = init_device_mesh(device.type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=_dtype(param_dtype), reduce_dtype=_dtype(reduce_dtype))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return fully_shard(FSDPRoot(model), mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def copy_full_weights(sharded: nn.Module, target: nn.Module) -> None:
    """Gather ``sharded``'s parameters one at a time into the plain model ``target`` (same names).
    A collective: every rank must call it."""
    into = dict(itertools.chain(target.named_parameters(), target.named_buffers()))
    for name, tensor in itertools.chain(sharded.named_parameters(), sharded.named_buffers()):
        into[name].copy_(full_tensor(tensor))


def load_sharded(root: nn.Module, model: nn.Module, device: torch.device, full_state: dict | None) -> None:
    """Give the sharded, still empty (meta) ``model`` its weights: rank 0 passes the full state
    (bare parameter names), the other ranks None; each tensor is broadcast in turn and each rank
    keeps its shard. Buffers (rotary frequencies, computed at construction) are kept. A collective."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    root.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    state = {ROOT_PREFIX + k: v for k, v in full_state.items()} if full_state is not None else {}
    set_model_state_dict(root, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                               strict=False))


def full_model_state(root: nn.Module | None, model: nn.Module, to_cpu: bool = True) -> dict[str, torch.Tensor] | None:
    """The whole model's weights by bare name, on the CPU (``to_cpu``) or where the model is:
    unsharded, every rank gathers and rank 0 gets them (the others None). Not on the CPU, they may
    be the model's own tensors (unsharded): a caller that keeps them clones them."""
    if root is None:
        return {k: v.detach().cpu() if to_cpu else v.detach() for k, v in model.state_dict().items()}
    state = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=to_cpu))
    # gathered, a tied weight (the head sharing the embedding) is a second tensor: name it once, as saving does
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    return {name: v for k, v in state.items() if (name := k.removeprefix(ROOT_PREFIX)) not in tied} or None


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for _, p in model.named_parameters()]  # a tied parameter once


class EngineWeights:
    """The rollout engine's unsharded weights, held only while a rollout runs.

    ``model`` is an empty (meta) model of the engine's dtype. ``load(sharded, version)`` gives it
    storage (the first time: ``to_empty``; later: its freed storage regrown) and gathers the
    sharded model's current weights into it one tensor at a time, cast to the engine's dtype,
    unless it still holds that weight version (consecutive rollouts with no update between:
    validation batches, DAPO's extra batches, ReMax's greedy pass); ``release()`` frees the
    storage again, keeping shapes, so the update runs beside the shards alone. A tied weight is
    one storage. ``load`` is a collective: every rank must call it (with the same version)."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.device = model, device
        self.allocated = False
        self.version: int | None = None  # the policy's weight version the storage holds; None: released
        self.loads = 0  # how many times the engine's weights were gathered

    @property
    def held_bytes(self) -> int:
        return sum(p.untyped_storage().nbytes() for p in unique_parameters(self.model) if p.device.type != "meta")

    def load(self, sharded: nn.Module, version: int) -> None:
        if self.version == version:
            return
        if not self.allocated:
            buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
            self.model.to_empty(device=self.device)
            self.model.tie_weights()
            with torch.no_grad():
                for name, b in self.model.named_buffers():
                    b.copy_(buffers[name])
            self.allocated = True
        else:
            for p in unique_parameters(self.model):
                p.untyped_storage().resize_(p.numel() * p.element_size())
        copy_full_weights(sharded, self.model)
        self.version = version
        self.loads += 1

    def release(self) -> None:
        if self.allocated:
            for p in unique_parameters(self.model):
                p.untyped_storage().resize_(0)
        self.version = None


def full_optimizer_state(root: nn.Module | None, model: nn.Module, optimizer) -> dict:
    """The optimizer state keyed by parameter name, whole (a collective under FSDP2; rank 0 gets it)."""
    return get_optimizer_state_dict(root if root is not None else model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(root: nn.Module | None, model: nn.Module, optimizer, weights: dict | None,
                    optimizer_state: dict | None) -> None:
    """Load name-keyed full weights (None: leave them) and optimizer state, each rank keeping its shard.
    Sharded, only rank 0 passes them (the others pass empty dicts) and each tensor is broadcast in
    turn: no other rank reads the checkpoint or holds it whole."""
    target = root if root is not None else model
    options = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=root is not None)
    if root is not None:
        weights = {ROOT_PREFIX + k: v for k, v in weights.items()} if weights is not None else None
        if optimizer_state:
            optimizer_state = rename_optimizer_state(optimizer_state, lambda name: ROOT_PREFIX + name)
    # strict=False lets a tied duplicate be absent, and then reports no missing names at all: callers check
    # the names first (models.loader.check_weight_names); an unexpected name is refused here too
    if weights is not None:
        loaded = set_model_state_dict(target, weights, options=options)
        if loaded.missing_keys or loaded.unexpected_keys:
            raise ValueError(f"the full weights do not fit the model: missing {sorted(loaded.missing_keys)[:5]}, "
                             f"unexpected {sorted(loaded.unexpected_keys)[:5]}")
    set_optimizer_state_dict(target, optimizer, optimizer_state or {}, options=options)


def load_checkpoint_state(root: nn.Module | None, model: nn.Module, optimizer, weights_folder: Path | None,
                          state_file: Path, rank: int, dp) -> dict:
    """A worker's resume: weights from ``weights_folder`` (None: leave them, as a LoRA adapter
    loads on its own) and the optimizer state from ``state_file``, whose other entries
    (scheduler, counters) are returned. Sharded, rank 0 alone reads the files and broadcasts
    them; every rank checks the stored names, from the files' headers."""
    from rlvr.models.checkpoint_names import from_checkpoint_names
    from rlvr.models.loader import check_weight_names, read_weights, stored_weight_names

    reads = root is None or rank == 0
    state = torch.load(state_file, weights_only=False) if reads else None
    if root is not None:  # the small entries to every rank; the optimizer state goes tensor by tensor
        small = dp.broadcast_object({k: v for k, v in state.items() if k != "optimizer"} if reads else None)
        state = {**small, "optimizer": state["optimizer"] if reads else {}}
    weights = None
    if weights_folder is not None:
        check_weight_names(model, stored_weight_names(weights_folder), weights_folder)
        # the stored tensors by name (a model built from them would initialise what they lack), under
        # the model's in-memory names: fused experts are stored per expert
        weights = from_checkpoint_names(model, read_weights(weights_folder)) if reads else {}
    if reads:  # a state from before name-keyed ones renamed where it is read: every rank then loads alike
        state["optimizer"] = name_keyed(state["optimizer"], optimizer, model)
    load_full_state(root, model, optimizer, weights, state["optimizer"])
    return {k: v for k, v in state.items() if k != "optimizer"}


def name_keyed(optimizer_state: dict, optimizer, model: nn.Module) -> dict:
    """``optimizer_state`` keyed by parameter name. Checkpoints from before name-keyed states hold
    ``optimizer.state_dict()``: each parameter by its place in the optimizer's groups, which
    ``optimizer`` (built the same way) resolves to the parameter and ``model`` to its bare name.
    Sharded, only rank 0 reads the state: had it alone taken another loading path, the other
    ranks would have waited in the broadcasts of ``load_full_state`` for ever."""
    order = [p for group in optimizer.param_groups for p in group["params"]]
    names = {id(p): name for name, p in model.named_parameters()}
    return rename_optimizer_state(optimizer_state, lambda key: names[id(order[key])] if isinstance(key, int) else key)


ROOT_PREFIX = "module."  # FSDPRoot's attribute: the root unit's parameter names start with it


def rename_optimizer_state(state: dict, rename) -> dict:
    """A full optimizer state with every parameter name passed through ``rename``."""
    return {**state, "state": {rename(k): v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [rename(p) for p in g["params"]]} for g in state["param_groups"]]}


def strip_root_prefix(state: dict) -> dict:
    """A full optimizer state of a root unit with its parameter names as the bare model's."""
    return rename_optimizer_state(state, lambda name: name.removeprefix(ROOT_PREFIX))


def move_optimizer_state(optimizer, device: torch.device | str) -> None:
    """Optimizer offload: its state tensors to ``device``."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
