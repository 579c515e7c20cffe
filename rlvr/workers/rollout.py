"""The rollout on devices of its own (``actor_rollout_ref.hybrid_engine=false``).

``RolloutWorker`` holds a full copy of the policy and the rollout engine and nothing else: no
optimizer, no reference. The trainer sends it the actor's full weights after every update
(``update_weights``; the hybrid worker's ``full_weights`` gathers them from the shards), so
it always samples from the policy the actor just became, as the hybrid engine does in place.
Its ranks are a data-parallel group of their own: each samples its share of the prompt groups.

With rollout servers (``rollout.mode=async``, ``drives_servers``) one such worker runs in the
trainer's process and its engine is ``ServerRollout``: its model is the copy on the CPU that each
weight version is loaded into and sent on from, to the replicas that generate, which start on the
run's device (``trainer.device``: a GPU run's replicas on GPUs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from rlvr.agents import with_agent_loops
from rlvr.config.loader import import_custom_modules
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import on_gpu, ray_uses_gpu
from rlvr.distributed.dispatch import Dispatch, register
from rlvr.distributed.weight_sync import WeightGroup, WeightReceiver
from rlvr.distributed.worker import Worker
from rlvr.models.loader import load_model, load_tokenizer
from rlvr.protocol import DataProto
from rlvr.rollout import build_rollout
from rlvr.workers.hybrid import resolve_device


def replica_device(config: RLVRConfig) -> torch.device:
    """Where the replicas this process starts run: ``trainer.device``, with ``auto`` a GPU when this
    machine or, on Ray, the cluster has one (the trainer may run in a Ray actor that sees no GPU,
    as ``ray_worker_groups`` reads it: ``ray_uses_gpu``)."""
    from rlvr.rollout.servers import on_ray

    return torch.device("cuda" if on_gpu(config) or (on_ray() and ray_uses_gpu(config)) else "cpu")


class RolloutWorker(Worker):
    def __init__(self, config: RLVRConfig, tokenizer=None, tool_setup=None):
        super().__init__()
        import_custom_modules(config.custom_modules)  # a Ray worker's process: what they register
        self.config, self.tokenizer, self.tool_setup = config, tokenizer, tool_setup
        # servers generate on devices of their own; this process only holds the version it sends them
        servers = config.actor_rollout_ref.rollout.mode == "async"
        self.device = torch.device("cpu") if servers else resolve_device(config.trainer.device)
        self.model = self.rollout = None
        self.version: int | None = None  # the policy version of the weights held (None: not told)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.actor_rollout_ref.model
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        self.model = load_model(model_cfg.path, "float32", self.device, model_cfg.trust_remote_code,
                                model_cfg.override_config).eval().requires_grad_(False)
        rollout, servers = self.config.actor_rollout_ref.rollout, self.config.actor_rollout_ref.rollout.mode == "async"
        run_dir = Path(self.config.trainer.default_local_dir).expanduser()
        # the engine's context is prompt + response, as the hybrid worker's (vLLM's max_model_len, the
        # servers'); the servers start on the run's device, not on this copy's CPU
        device = replica_device(self.config) if servers else self.device
        self.rollout = build_rollout(self.model, self.tokenizer, rollout, self.config.data.max_response_length,
                                     self.tool_setup, self.config.data.max_prompt_length, device=device,
                                     log_dir=run_dir / "servers" if servers else None,
                                     template_kwargs=self.config.data.apply_chat_template_kwargs,
                                     model_cfg=self.config.actor_rollout_ref.model)
        self.rollout = with_agent_loops(self.rollout, self.config, self.tokenizer, self.config.data.max_response_length)
        if servers:  # where the replicas are, their pids and logs
            run_dir.mkdir(parents=True, exist_ok=True)
            engine = getattr(self.rollout, "engine", self.rollout)  # under the multi-turn loop
            (run_dir / "servers.json").write_text(json.dumps(engine.describe(), indent=1))
        self.version = 0  # the weights it loaded are the initial policy's: servers are sent them as version 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        """The run is over: the rollout stops what it started (the servers of ``mode=async``)."""
        if self.rollout is not None:
            self.rollout.close()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def update_weights(self, weights: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Replace the copy's weights with the actor's (names as the Hugging Face model's).
        ``version``: the policy version they are (the number of steps whose update they hold),
        stamped on every sample generated with them (``policy_version``)."""
        self.version = version
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        tied = {name for name, _ in self.model.named_parameters(remove_duplicate=False)} - \
            {name for name, _ in self.model.named_parameters()}
        if unexpected or set(missing) - tied:
            raise ValueError(f"the actor's weights do not fit the rollout's model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def open_weight_channel(self, host: str, port: int, world_size: int, backend: str, meta: list,
                            bucket_bytes: int) -> None:
        """Start listening for the actor's broadcasts (returns at once; the thread joins the group)."""
        rank = 1 + self.rank  # the actor's rank 0 is the root
        self.receiver = WeightReceiver(lambda: WeightGroup(host, port, rank, world_size, backend), meta, bucket_bytes)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, version: int) -> None:
        """Hold ``version``: wait until all of it has arrived by broadcast, then load it. Run as a
        task of this worker, never during a generation."""
        self.update_weights(self.receiver.take(version), version)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        prompts.meta_info.update(row_offset=self.rank * len(prompts), total_rows=self.world_size * len(prompts))
        # the engine's bf16 / lean copies (vLLM: its own weights) follow the new weights; a version it
        # holds already is not copied again (None, a sender that gives no versions: always copied)
        self.rollout.sync_weights(self.version)
        try:
            out = self.rollout.generate_sequences(prompts)
        finally:
            self.rollout.free_cache()
        if self.version is not None:  # every token of a row comes from the weights held now
            out.non_tensor_batch["policy_version"] = np.full(len(out), self.version, dtype=np.int64)
        return out
