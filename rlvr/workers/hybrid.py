"""The hybrid worker: actor, reference and rollout engine on one device.

``ActorRolloutRefWorker`` exposes the worker methods the trainer calls (through a worker
group): ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``,
``update_actor``, ``save_checkpoint``, ``load_checkpoint``. Each takes and returns a
``DataProto``. Generation runs between ``rollout_mode()`` (weights synced into the engine,
eval mode) and ``trainer_mode()`` (generation caches freed, train mode), as verl's hybrid
engine does around vLLM. The engine is whichever ``rollout.name`` registers: the native one
shares the actor's tensors; vLLM (in this process) gets them streamed, tagged with the
worker's weight version, which every update and checkpoint load bumps. An engine that decodes
on the worker's own gathered weights (native, sharded) leaves rollout mode only when the actor
next computes: consecutive rollouts with no update between gather once and move no state.

The reference policy is a frozen copy of the initial weights, built only when a KL term
uses it (``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``). With LoRA
(``model.lora_rank > 0``) it is no copy: the same model with its adapter disabled.

With ``actor.strategy=fsdp2`` the worker is one data-parallel rank (``Worker``: rank and
world size from the environment a worker group sets; one process is world size 1): actor
and reference are built empty and sharded with FSDP2, their weights read once on rank 0
(``rlvr.distributed.fsdp``); the rollout engine decodes this rank's prompt groups on
unsharded weights (in ``rollout.dtype``) that ``rollout_mode()`` gathers from the shards
and ``trainer_mode()`` frees; and ``fsdp_config.param_offload`` / ``optimizer_offload`` move
the shards and the optimizer state to the CPU while generation runs. A checkpoint is the
same Hugging Face folder and name-keyed optimizer state as one process writes, so runs
resume on any number of ranks.
"""

from __future__ import annotations

import copy
import resource
from pathlib import Path

import torch

from rlvr.config import ConfigError
from rlvr.config.loader import import_custom_modules
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import drives_servers
from rlvr.agents import with_agent_loops
from rlvr.models.loader import empty_model, load_model, load_tokenizer
from rlvr.models.lora import apply_lora, load_adapter, save_adapter, unwrap
from rlvr.distributed import fsdp
from rlvr.distributed.dispatch import Dispatch, register
from rlvr.distributed.weight_sync import WeightGroup, WeightSender, weight_meta, weight_tensors
from rlvr.distributed.worker import Worker, free_port
from rlvr.protocol import DataProto
from rlvr.rollout import build_rollout, streams_weights
from rlvr.rollout.engine import trim_heap
from rlvr.workers.actor import Actor, build_optimizer
from rlvr.workers.teacher import ServedTeacher, Teachers, check_teacher_tokenizers, teacher_entries


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():  # torch's own words: 'Torch not compiled with CUDA'
        raise ConfigError(f"trainer.device={name}, but torch sees no CUDA device here (no GPU, or a CPU-only torch "
                          f"build: {torch.__version__}); use trainer.device=cpu, or auto to take a GPU when there is one")
    return device


def needs_reference(config: RLVRConfig) -> bool:
    return config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward


class ActorRolloutRefWorker(Worker):
    """Holds the policy (with its optimizer), the optional frozen reference and the rollout engine."""

    def __init__(self, config: RLVRConfig, total_training_steps: int, tokenizer=None, tool_setup=None):
        super().__init__()
        import_custom_modules(config.custom_modules)  # a Ray worker's process: the policy losses they register
        self.config = config
        self.tool_setup = tool_setup  # multi-turn: the tools and chat format (else read from the config)
        self.total_training_steps = total_training_steps
        self.device = resolve_device(config.trainer.device)
        self.tokenizer = tokenizer
        self.actor = self.ref = self.rollout = self.teachers = None
        self.sharded = config.actor_rollout_ref.actor.strategy == "fsdp2"
        self.engine_weights = None  # fsdp2: the engine's unsharded weights, from a rollout until the actor computes
        self.weights_version = 0  # bumped whenever the policy's weights change: an engine never runs on older ones
        self.in_rollout_mode = False  # between rollout_mode() and trainer_mode()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        arr = self.config.actor_rollout_ref
        model_cfg = arr.model
        torch.manual_seed(self.config.trainer.seed)
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        root = ref_root = ref_model = None
        if self.sharded:
            model, ref_model, root, ref_root = self._load_sharded()
        else:
            model = load_model(model_cfg.path, "float32", self.device, model_cfg.trust_remote_code,
                               model_cfg.override_config)
            if model_cfg.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if self.lora:
                model = apply_lora(model, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules)
            if needs_reference(self.config) and not self.lora:  # with LoRA: the actor with its adapter disabled
                ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # one device holds both anyway
        optimizer, scheduler = build_optimizer(model, arr.actor.optim, self.total_training_steps)
        pad_id = self.tokenizer.pad_token_id
        max_len = self.config.data.max_response_length
        dp = self.data_parallel()
        self.actor = Actor(model, arr.actor, self.config.algorithm, optimizer, scheduler, pad_id, max_len,
                           seed=self.config.trainer.seed, root=root, dp=dp, distillation=self.config.distillation)
        if ref_model is not None:
            self.ref = Actor(ref_model, arr.actor, self.config.algorithm, pad_id=pad_id, max_response_length=max_len,
                             root=ref_root, dp=dp)
        if self.config.distillation.enabled:
            self.teachers = Teachers({key: teacher if isinstance(teacher, ServedTeacher) else
                                      Actor(teacher, arr.actor, self.config.algorithm, pad_id=pad_id,
                                            max_response_length=max_len, root=teacher_root, dp=dp)
                                      for key, (teacher, teacher_root) in self._load_teachers().items()},
                                     self.config.distillation)
        # else the rollout lives in RolloutWorkers of its own (workers/rollout.py): on devices of their
        # own (hybrid_engine=false), or beside this worker, generating ahead (trainer.v1.trainer_mode);
        # with rollout servers (mode=async) that is the trainer's driver of them
        if arr.hybrid_engine and self.config.trainer.v1.trainer_mode == "sync" and not drives_servers(self.config):
            # sharded: an engine that decodes on a module gets unsharded weights only while a rollout runs
            if self.sharded and not streams_weights(arr.rollout):
                self.engine_weights = fsdp.EngineWeights(
                    empty_model(model_cfg.path, arr.rollout.dtype, model_cfg.trust_remote_code,
                                model_cfg.override_config).requires_grad_(False), self.device)
                engine_model = self.engine_weights.model
            else:  # an engine that streams the weights reads the actor itself (gathering shards one at a time)
                engine_model = unwrap(model)
            self.rollout = with_agent_loops(self._build_rollout(engine_model), self.config, self.tokenizer,
                                            self.config.data.max_response_length)

    def _build_rollout(self, engine_model):
        """The engine, started with the actor's offloaded state off the device (as verl does):
        vLLM on a GPU takes its whole reservation when it starts, before it can sleep."""
        if self.sharded:
            self._offload(True)
            self._return_cached_memory()
        try:
            servers = self.config.actor_rollout_ref.rollout.mode == "async"  # their logs in the run folder
            return build_rollout(engine_model, self.tokenizer, self.config.actor_rollout_ref.rollout,
                                 self.config.data.max_response_length, self.tool_setup,
                                 self.config.data.max_prompt_length, self.device,
                                 Path(self.config.trainer.default_local_dir).expanduser() / "servers" if servers else None,
                                 self.config.data.apply_chat_template_kwargs, self.config.actor_rollout_ref.model)
        finally:
            if self.sharded:
                self._offload(False)

    def _load_sharded(self):
        """Actor and reference built empty on every rank, sharded, then given their weights from
        one read on rank 0 (``fsdp.load_sharded``): no rank holds a second full copy."""
        arr = self.config.actor_rollout_ref
        model_cfg = arr.model
        self.init_process_group(self.device)
        path, remote, override = model_cfg.path, model_cfg.trust_remote_code, model_cfg.override_config
        model = empty_model(path, "float32", remote, override)
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        root = self._shard(model, arr.actor.fsdp_config.reshard_after_forward)
        ref_model = ref_root = None
        if needs_reference(self.config):
            ref_model = empty_model(path, "float32", remote, override).requires_grad_(False)
            ref_root = self._shard(ref_model, arr.ref.fsdp_config.reshard_after_forward)
        # one read, on rank 0 (a new head, as the critic's, is initialised there once)
        full_state = load_model(path, "float32", "cpu", remote, override).state_dict() if self.rank == 0 else None
        fsdp.load_sharded(root, model, self.device, full_state)
        if ref_model is not None:
            fsdp.load_sharded(ref_root, ref_model, self.device, full_state)
        return model, ref_model, root, ref_root

    def _load_teachers(self) -> dict[str, tuple]:
        """Each distillation teacher, frozen, built as the reference is: on the actor's device, or
        (FSDP2) sharded over the same ranks with its weights read once on rank 0. Key -> (model, root)."""
        remote = self.config.actor_rollout_ref.model.trust_remote_code
        check_teacher_tokenizers(self.config.distillation, self.tokenizer, lambda path: load_tokenizer(path, remote))
        teachers = {}
        server = self.config.actor_rollout_ref.rollout.server
        for key, entry in teacher_entries(self.config.distillation).items():
            if entry.inference.external_server_addresses:  # served: nothing on this device
                teachers[key] = (ServedTeacher(entry, server.timeout, server.max_start_wait_time), None)
                continue
            if not self.sharded:
                teachers[key] = (load_model(entry.model_path, "float32", self.device, remote).requires_grad_(False), None)
                continue
            model = empty_model(entry.model_path, "float32", remote).requires_grad_(False)
            root = self._shard(model, self.config.actor_rollout_ref.ref.fsdp_config.reshard_after_forward)
            state = load_model(entry.model_path, "float32", "cpu", remote).state_dict() if self.rank == 0 else None
            fsdp.load_sharded(root, model, self.device, state)
            teachers[key] = (model, root)
        return teachers

    def _shard(self, model, reshard_after_forward: bool):
        """FSDP2 over this group's ranks; the reference computes in the actor's precision."""
        mp = self.config.actor_rollout_ref.actor.fsdp_config.mixed_precision
        return fsdp.shard(model, self.device, self.world_size, reshard_after_forward, mp.param_dtype, mp.reduce_dtype)

    @property
    def lora(self) -> bool:
        return self.config.actor_rollout_ref.model.lora_rank > 0

    @property
    def model(self):
        return self.actor.model

    # ------------------------------------------------------------------ modes
    def rollout_mode(self) -> None:
        """Before generation, in verl's order, so that the device never holds the actor's state
        and the engine's whole reservation together: the engine's weights wake (vLLM on a GPU:
        its weights' memory only), the actor's current weights go into them (sharded: gathered
        from the shards), the shards and the optimizer state go to the CPU when offload is on,
        the memory they leave goes back to the device, and only then does the KV cache wake.
        Entered again before ``trainer_mode`` (consecutive rollouts), it gathers nothing at an
        unchanged weight version and moves no state."""
        self.model.eval()
        self.rollout.wake_up(["weights"])
        if self.engine_weights is not None:  # nothing gathered when they hold this version already
            self.engine_weights.load(self.model, self.weights_version)
        self.rollout.sync_weights(self.weights_version)  # vllm: streamed from the (sharded) actor
        if self.sharded and not self.in_rollout_mode:
            self._offload(True)
        self.in_rollout_mode = True
        self._return_cached_memory()
        self.rollout.wake_up(["kv_cache"])

    def trainer_mode(self) -> None:
        """After generation, the reverse: the engine's caches are freed (vLLM on a GPU sleeps,
        weights and KV cache; sharded: the gathered weights are freed) before the shards and the
        optimizer state come back."""
        self.rollout.free_cache()
        if self.sharded:
            if self.engine_weights is not None:
                self.engine_weights.release()
            self._offload(False)
            trim_heap()  # the freed weights back to the OS, not kept in the heap beside the update
        self.model.train()
        self.in_rollout_mode = False

    def _leave_rollout_mode(self) -> None:
        """Before the actor computes (log-probs, update, checkpoint): its state back, if a
        rollout left the worker in rollout mode."""
        if self.in_rollout_mode:
            self.trainer_mode()

    def _offload(self, to_cpu: bool) -> None:
        cfg = self.config.actor_rollout_ref
        device = "cpu" if to_cpu else self.device
        if cfg.actor.fsdp_config.param_offload:
            self.actor.root.to(device)
        if cfg.actor.fsdp_config.optimizer_offload:
            fsdp.move_optimizer_state(self.actor.optimizer, device)
        if cfg.ref.fsdp_config.param_offload and self.ref is not None:
            self.ref.root.to(device)

    def _return_cached_memory(self) -> None:
        """What the offloaded tensors leave stays in torch's caching allocator, which vLLM's own
        allocator (``CuMemAllocator``) cannot take from: it goes back to the device before the
        KV cache wakes into it."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ worker methods
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        """The run is over: the rollout stops what it started (servers of ``mode=async``)."""
        if self.rollout is not None:
            self.rollout.close()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_weights(self, to_cpu: bool = True) -> dict[str, torch.Tensor] | None:
        """The policy's full weights, for rollout workers of their own (rank 0 answers; sharded,
        every rank takes part in gathering them): on the CPU, or (``to_cpu=False``, for an engine in
        this process) on the actor's device, which a GPU's weights then never leave."""
        self._leave_rollout_mode()
        state = fsdp.full_model_state(self.actor.root, self.model, to_cpu)
        return state if self.rank == 0 else None

    # the broadcast to a rollout pool of its own (rlvr.distributed.weight_sync)
    def weight_channel_address(self) -> tuple[str, int]:
        """Where the broadcast group meets: this rank's rendezvous host, a free port on it."""
        return self.master_addr, free_port(self.master_addr)

    def weight_meta(self) -> list:
        return weight_meta(self.model)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def open_weight_channel(self, host: str, port: int, world_size: int, backend: str, meta: list,
                            bucket_bytes: int) -> None:
        """Rank 0 joins the broadcast group as its root (completing the rendezvous the rollout
        workers wait in); every rank keeps a sender, for the gathers."""
        group = WeightGroup(host, port, 0, world_size, backend) if self.rank == 0 else None
        self.weight_sender = WeightSender(group, meta, bucket_bytes)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, version: int) -> None:
        """Broadcast the current weights as ``version``: each tensor gathered from the shards in
        turn (every rank), rank 0 sending them a bucket at a time."""
        self._leave_rollout_mode()
        with torch.no_grad():
            self.weight_sender.send(version, ((name, fsdp.full_tensor(t.detach()))
                                              for name, t in weight_tensors(self.model)))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if self.rollout is None:
            raise RuntimeError("this worker has no rollout engine (hybrid_engine=false): generate with the "
                               "rollout worker group")
        # this rank's rows are a contiguous part of the batch: sample them as one process would
        prompts.meta_info.update(row_offset=self.rank * len(prompts), total_rows=self.world_size * len(prompts))
        self.rollout_mode()
        try:  # an engine over several ranks (vLLM, tensor parallel) generates its group's rows together
            return self.rollout.generate_in_group(prompts)
        finally:
            self._end_rollout()

    def _end_rollout(self) -> None:
        """Generation caches are freed at once. The worker's own gathered weights (and the
        offloaded state) stay as they are until the actor next computes, so that the next
        rollout at this weight version gathers nothing; the memory held meanwhile is that of a
        rollout without its KV cache. An engine that streams the weights (vLLM) returns to
        trainer mode at once: its next sync reads the actor's shards on the device, and its
        sleep has discarded the weights it held anyway."""
        if self.engine_weights is None:
            self.trainer_mode()
        else:
            self.rollout.free_cache()

    def _log_prob_meta(self, data: DataProto, micro_batch_size: int) -> None:
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        data.meta_info["micro_batch_size"] = micro_batch_size

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` of the responses under the current policy; with
        ``meta_info["max_abs_logit"]`` also ``max_abs_logits`` (B, R), each token's largest |logit|
        (the freshness probe's tolerance scales with it)."""
        self._leave_rollout_mode()
        self._log_prob_meta(data, self.config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)
        peaks = bool(data.meta_info.get("max_abs_logit", False))
        log_probs, entropy, *more = self.actor.compute_log_prob(data, calculate_entropy=True, extra=peaks,
                                                                 max_abs_logit=peaks)
        return DataProto.from_dict({"old_log_probs": log_probs, "entropys": entropy, **(more[0] if more else {})})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` under the frozen initial policy (with LoRA: the adapter disabled)."""
        self._leave_rollout_mode()
        if self.ref is None and not (self.lora and needs_reference(self.config)):
            raise RuntimeError("no reference policy: it is built only when actor.use_kl_loss or "
                               "algorithm.use_kl_in_reward is set")
        self._log_prob_meta(data, self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)
        if self.ref is not None:
            log_probs, _ = self.ref.compute_log_prob(data)
        else:
            with self.model.disable_adapter():
                log_probs, _ = self.actor.compute_log_prob(data)
        return DataProto.from_dict({"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The distillation teachers' ``teacher_log_prob`` of the responses (and, for a top-k loss,
        ``teacher_topk_log_probs`` / ``teacher_topk_ids``; ``rlvr.workers.teacher``)."""
        self._leave_rollout_mode()
        if self.teachers is None:
            raise RuntimeError("no distillation teacher: set distillation.enabled=true and "
                               "distillation.teacher_models.teacher_model.model_path")
        self._log_prob_meta(data, self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)
        return self.teachers.compute(data, self.world_size)

    @register(dispatch_mode=Dispatch.DP_MINI_BATCH_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        self._leave_rollout_mode()
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        computed_old = "old_log_probs" not in data.batch
        metrics = self.actor.update_policy(data)
        self.weights_version += 1
        if self.sharded:  # the activations' memory back to the OS before the engine's weights are gathered.
            trim_heap()  # One device keeps it mapped: faulting it in again would cost each step time
        metrics["perf/cpu_max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # this process
        if self.device.type == "cuda":
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        out = DataProto.from_dict({"old_log_probs": data.batch["old_log_probs"]}) if computed_old else DataProto()
        out.meta_info["metrics"] = metrics
        return out

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder: str | Path) -> None:
        """The policy as a Hugging Face folder (``actor/``; with LoRA the adapter in peft's format,
        which ``rlvr export`` merges into the base model) plus optimizer and scheduler state, the
        optimizer's keyed by parameter name. Sharded: every rank gathers, rank 0 writes."""
        self._leave_rollout_mode()
        folder = Path(folder)
        optimizer_state = fsdp.full_optimizer_state(self.actor.root, self.model, self.actor.optimizer)
        weights = None
        if self.sharded:
            optimizer_state = fsdp.strip_root_prefix(optimizer_state) if self.rank == 0 else None  # rank 0 holds it
            weights = fsdp.full_model_state(self.actor.root, self.model)  # gathered; rank 0 holds it
        if self.rank == 0:
            if self.lora:
                save_adapter(self.model, folder / "actor")
            else:
                self.model.save_pretrained(folder / "actor", state_dict=weights, safe_serialization=True)
            self.tokenizer.save_pretrained(folder / "actor")
            torch.save({"optimizer": optimizer_state, "scheduler": self.actor.scheduler.state_dict(),
                        "updates": self.actor.updates, "skipped_in_a_row": self.actor.skipped_in_a_row},
                       folder / "actor_state.pt")
        self.data_parallel().barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, folder: str | Path) -> None:
        """Policy weights, optimizer and scheduler from ``save_checkpoint`` (written by any number of
        ranks); the reference stays the initial model."""
        self._leave_rollout_mode()
        folder = Path(folder)
        if self.lora:
            load_adapter(self.model, folder / "actor")
        state = fsdp.load_checkpoint_state(self.actor.root, self.model, self.actor.optimizer,
                                           None if self.lora else folder / "actor", folder / "actor_state.pt",
                                           self.rank, self.data_parallel())
        self.weights_version += 1
        self.actor.scheduler.load_state_dict(state["scheduler"])
        self.actor.updates = state["updates"]
        self.actor.skipped_in_a_row = state.get("skipped_in_a_row", 0)
