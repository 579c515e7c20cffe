"""The critic (PPO with GAE): a value model and its clipped value-loss update.

The value model is the policy architecture with a one-output token-classification head
(``AutoModelForTokenClassification``, ``num_labels=1``, as verl builds it; the head starts
untrained). The value of response token t is read at the position that predicts it (the
state before the token), through the same prompt-once/plain forward as the actor.

On several data-parallel ranks the critic is sharded like the actor (``strategy=fsdp2``, the
actor's strategy): built empty on every rank, its weights read once on rank 0 and broadcast
shard by shard, each decoder layer and a root unit sharded with FSDP2. Each rank takes its
share of every mini-batch, as the actor does; its loss is scaled by the world size, so the
averaged gradient FSDP2 reduce-scatters is the sum of the ranks' shares and the step is the
one-process step. Ranks run equal numbers of forward passes (zero-weight ones where a rank
has fewer micro-batches), since each pass gathers the shards.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rlvr.algos.losses import agg_loss, count_seqs
from rlvr.algos.utils import masked_mean
from rlvr.config.schema import CriticConfig
from rlvr.config.schema import MixedPrecisionConfig
from rlvr.distributed import fsdp
from rlvr.models.loader import DTYPES, ModelLoadError, check_family, check_weight_files, empty_model, model_folder
from rlvr.distributed.dispatch import Dispatch, register
from rlvr.protocol import DataProto, loss_mask
from rlvr.distributed.worker import Worker
from rlvr.models.lora import apply_lora, load_adapter, save_adapter
from rlvr.workers.actor import (FORWARD_KEYS, build_optimizer, clip_and_step, group_units, micro_batches,
                                packing_units, shuffled_mini_batches)
from rlvr.workers.forward import response_states, scatter_responses
from rlvr.workers.hybrid import resolve_device


def load_value_model(path: str, device: torch.device, trust_remote_code: bool = False,
                     override_config: dict | None = None):
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    folder = model_folder(path)
    check_family(folder)
    check_weight_files(folder)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the value head is new by design: no "newly initialized" report
    try:
        model = AutoModelForTokenClassification.from_pretrained(
            folder, num_labels=1, dtype=DTYPES["float32"], attn_implementation="sdpa",
            trust_remote_code=trust_remote_code, **(override_config or {}))
    except ValueError as err:
        raise ModelLoadError(f"critic.model.path={path!r} cannot be loaded as a value model: {err}") from None
    finally:
        hf_logging.set_verbosity(level)
    return model.to(device)


def value_loss(vpreds, values, returns, response_mask, cliprange_value: float, loss_agg_mode: str, **totals):
    """0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2), aggregated; returns (loss, clipfrac)."""
    clipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    losses1, losses2 = (vpreds - returns).square(), (clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(losses1, losses2), response_mask, loss_agg_mode, **totals)
    return loss, masked_mean(torch.gt(losses2, losses1).float(), response_mask)


class CriticWorker(Worker):
    """compute_values / update_critic over one value model on one device."""

    def __init__(self, config: CriticConfig, total_training_steps: int, pad_id: int, device: str = "auto",
                 seed: int = 1, loss_agg_mode: str = "token-mean", strategy: str = "local",
                 mixed_precision: MixedPrecisionConfig | None = None, share_prompt: bool = True,
                 shuffle: bool = True):
        super().__init__()
        self.config, self.total_training_steps = config, total_training_steps
        self.share_prompt = share_prompt  # actor.share_prompt_forward: the critic's forward is laid out as the actor's
        self.shuffle = shuffle  # actor.shuffle: the critic's mini-batches follow it (verl's critic.shuffle)
        self.pad_id, self.device, self.seed = pad_id, resolve_device(device), seed
        self.loss_agg_mode = loss_agg_mode
        self.sharded = strategy == "fsdp2"
        self.mixed_precision = mixed_precision or MixedPrecisionConfig(param_dtype="float32")
        self.model = self.root = self.optimizer = self.scheduler = None
        self.updates = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.model
        args = (model_cfg.path, self.device, model_cfg.trust_remote_code, model_cfg.override_config)
        if self.sharded:
            self.init_process_group(self.device)
            self.model = empty_model(model_cfg.path, "float32", model_cfg.trust_remote_code,
                                     {**(model_cfg.override_config or {}), "num_labels": 1},
                                     model_class=token_classification())
        else:
            self.model = load_value_model(*args)
        if model_cfg.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.lora:  # the backbone gets an adapter; the value head starts untrained, so it trains whole
            self.model = apply_lora(self.model, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules,
                                    task_type="TOKEN_CLS", modules_to_save=["score"])
        if self.sharded:
            mp = self.mixed_precision
            self.root = fsdp.shard(self.model, self.device, self.world_size, True, mp.param_dtype, mp.reduce_dtype)
            # one read, on rank 0, which also initialises the new value head once
            full_state = load_value_model(model_cfg.path, torch.device("cpu"), *args[2:]).state_dict() \
                if self.rank == 0 else None
            fsdp.load_sharded(self.root, self.model, self.device, full_state)
        self.optimizer, self.scheduler = build_optimizer(self.model, self.config.optim, self.total_training_steps)
        if self.world_size > 1:
            self.init_process_group(self.device)
        self.dp = self.data_parallel()

    @property
    def lora(self) -> bool:
        return self.config.model.lora_rank > 0

    def _values(self, data: DataProto, rows: list[int]) -> torch.Tensor:
        idx = torch.tensor(rows)
        batch = {k: data.batch[k][idx].to(self.device) for k in FORWARD_KEYS}
        uids = data.non_tensor_batch.get("uid")
        uids = None if uids is None else uids[rows]
        if self.root is not None:  # through the sharded root, which gathers the embeddings and the value head
            return self.root(_response_values, batch, uids, self.pad_id, self.share_prompt)
        return _response_values(self.model, batch, uids, self.pad_id, self.share_prompt)

    def _micro_batches(self, data: DataProto, rows: list[int]) -> list[list[int]]:
        micro = self.config.ppo_micro_batch_size_per_gpu
        units, tokens = packing_units(data, data.non_tensor_batch.get("uid"), rows, micro, None)
        return micro_batches(units, tokens, micro, None)

    @torch.no_grad()
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        data.require(*FORWARD_KEYS, "response_mask", stage="compute_values")
        self.model.eval()
        values = torch.zeros(data.batch["responses"].shape)
        micros = self._micro_batches(data, list(range(len(data))))
        padding = self.dp.max(len(micros)) - len(micros)  # forwards that only keep the ranks in step
        for i, rows in enumerate(micros + micros[:1] * padding):
            out = self._values(data, rows)
            if i < len(micros):
                values[torch.tensor(rows)] = out.cpu()
        return DataProto.from_dict({"values": values * data.batch["response_mask"]})

    @register(dispatch_mode=Dispatch.DP_MINI_BATCH_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        data.require(*FORWARD_KEYS, "response_mask", "values", "returns", stage="update_critic")
        self.model.train()
        metrics = defaultdict(list)
        for epoch in range(self.config.ppo_epochs):
            seed = [self.seed, self.updates, epoch] if self.shuffle else None
            for mini_rows in shuffled_mini_batches(data.non_tensor_batch.get("uid"), len(data),
                                                   self.config.ppo_mini_batch_size, seed):
                self._optimizer_step(data, mini_rows, metrics)
        self.updates += 1
        metrics["critic/lr"].append(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        return DataProto(meta_info={"metrics": {k: float(np.mean(v)) for k, v in metrics.items()}})

    def _optimizer_step(self, data: DataProto, mini_rows: list[int], metrics) -> None:
        mask = loss_mask(data).float()  # dropped groups: 0
        totals = {"num_tokens": mask[torch.tensor(mini_rows)].sum().clamp(min=1), "num_seqs": count_seqs(mask[torch.tensor(mini_rows)])}
        self.optimizer.zero_grad(set_to_none=True)
        vf_loss_total, clipfrac, vpred_sum = 0.0, 0.0, 0.0
        mine = self.dp.share(group_units(data.non_tensor_batch.get("uid"), mini_rows))  # this rank's groups
        micros = self._micro_batches(data, mine)
        padding = self.dp.max(len(micros)) - len(micros)  # agreed before any pass: the collectives pair up
        scale = self.dp.world_size if self.root is not None else 1  # FSDP2 averages; the shares must add up
        for i, rows in enumerate(micros + micros[:1] * padding):
            idx = torch.tensor(rows)
            vpreds = self._values(data, rows)
            loss, frac = value_loss(vpreds, data.batch["values"][idx].to(self.device),
                                    data.batch["returns"][idx].to(self.device), mask[idx].to(self.device),
                                    self.config.cliprange_value, self.loss_agg_mode, **totals)
            if i >= len(micros):  # a zero-weight pass: keeps step with ranks that have more micro-batches
                (loss * 0.0).backward()
                continue
            (loss * scale).backward()
            share = float(mask[idx].sum() / totals["num_tokens"])
            vf_loss_total += float(loss.detach())
            clipfrac += float(frac) * share
            vpred_sum += float((vpreds.detach().cpu() * mask[idx]).sum())
        vf_loss_total, clipfrac, vpred_sum = self.dp.sum([vf_loss_total, clipfrac, vpred_sum])
        grad_norm, _ = clip_and_step(self.model, self.optimizer, self.config.grad_clip)
        metrics["critic/vf_loss"].append(vf_loss_total)
        metrics["critic/vf_clipfrac"].append(clipfrac)
        metrics["critic/vpred_mean"].append(vpred_sum / float(totals["num_tokens"]))
        metrics["critic/grad_norm"].append(grad_norm)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder) -> None:
        """``critic/`` (a Hugging Face folder, or the adapter) and ``critic_state.pt``, the optimizer
        state whole and keyed by parameter name. Sharded: every rank gathers, rank 0 writes."""
        folder = Path(folder)
        optimizer_state = fsdp.full_optimizer_state(self.root, self.model, self.optimizer)
        weights = None
        if self.root is not None:
            optimizer_state = fsdp.strip_root_prefix(optimizer_state) if self.rank == 0 else None
            weights = fsdp.full_model_state(self.root, self.model)
        if self.rank == 0:
            if self.lora:
                save_adapter(self.model, folder / "critic")
            else:
                self.model.save_pretrained(folder / "critic", state_dict=weights, safe_serialization=True)
            torch.save({"optimizer": optimizer_state, "scheduler": self.scheduler.state_dict(),
                        "updates": self.updates}, folder / "critic_state.pt")
        self.dp.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, folder) -> None:
        """From ``save_checkpoint``, written by any number of ranks. Sharded, rank 0 alone reads the
        tensors and broadcasts them; every rank checks the stored names."""
        folder = Path(folder)
        if self.lora:
            load_adapter(self.model, folder / "critic")
        state = fsdp.load_checkpoint_state(self.root, self.model, self.optimizer,
                                           None if self.lora else folder / "critic", folder / "critic_state.pt",
                                           self.rank, self.dp)
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = state["updates"]


def _response_values(model, batch: dict, uids, pad_id: int, share_prompt: bool = True) -> torch.Tensor:
    """(B, R) values of the response tokens, each read at the position that predicts it."""
    states = response_states(model, batch, uids, share_prompt, pad_id)
    values = model.score(states.hidden).squeeze(-1).float()  # (N,)
    return scatter_responses(values, states, batch["responses"].shape)


def token_classification():
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification
