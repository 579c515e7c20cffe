"""The memory plan: per-device bytes of a run, from the model's config.json alone.

``plan_memory(config, model_config, device_memory_gb)`` counts what rlvr's code holds on each
device (one data-parallel rank), phase by phase (init, resume, generation, update, and the
critic's update), on a device of the given capacity (else this machine's GPU, or its RAM shared
by its CPU ranks); ``check_plan`` refuses a plan over that capacity before anything loads,
naming the setting to change. ``bench/memory.py`` measures init, generation and update (per-rank
peak resident memory on a 0.31B synthetic model at 1, 2 and 4 ranks) next to this plan's figures.

- The model: its parameter count (total, outside the layers, the largest layer, and a mixture of
  experts' active parameters) is ``sum(p.numel())`` of the model transformers builds from
  config.json on the meta device, so a key the file leaves out takes the family's default
  (Gemma's tied head) and every family's own layout counts (Gemma-4's per-layer embeddings);
  a family transformers does not know is counted by hand from the sizes. The per-token terms
  read the sizes: dense layers as config.json says, and mixtures of experts expert by expert
  (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4-MoE, DeepSeek-V2/V3: routed and shared experts, the router,
  dense first layers, DeepSeek's latent attention); another family with experts is refused. Keys
  and values per layer where the config's layers differ (Gemma-4's global_head_dim).
- An engine of its own (colocate_async, separate_async, ``hybrid_engine=false``): the hybrid
  worker's rollout mode, where the offloads happen, never runs; under colocate_async the rollout
  worker (its fp32 model, the engine's weights and KV cache, the versions sent to it) generates
  while the actor and the critic update; a rollout pool's devices are the phase ``rollout pool``.
- ``strategy=fsdp2``: init holds, on rank 0, the fp32 state read once from disk beside the
  actor's and the reference's shards (the other ranks: their shards and one tensor in
  flight); a rollout gathers the unsharded engine weights in ``rollout.dtype`` and frees them
  when it ends; the update gathers the root unit (embedding, head) for its forward and one
  layer at a time (every layer, kept until the backward, with ``reshard_after_forward=false``),
  and their unsharded gradients in the backward.
- ``strategy=local``: the loaded model, its reference copy, and (``rollout.dtype=bfloat16``)
  the engine's own bf16 copy are all kept for the run; with a float32 rollout the engine
  shares the actor's weights.
- The fp32 parameters are the master weights (no separate master copy); gradients are fp32
  and freed after each optimizer step; AdamW keeps two fp32 moments (``optimizer_offload``
  moves them to the CPU while generation runs, ``param_offload`` the actor's, and
  ``ref.fsdp_config.param_offload`` the reference's shards, all under fsdp2 only).
- Resume: rank 0 reads the fp32 weights and the whole AdamW state (12 bytes a parameter);
  files read on rank 0 (at init and at resume) are host RAM on a GPU, listed apart from the
  device's bytes.
- The native engine's KV cache holds the rows it runs at once (rows per rank, from
  ``data.gen_batch_size`` when set, at most ``rollout.max_num_seqs``)
  of (longest prompt + max_response_length) positions in the rollout dtype; decoding on a CPU,
  the lean step keeps a prepacked copy of every projection (the layers' and the vocabulary's)
  while it generates.
- vLLM on a GPU reserves ``gpu_memory_utilization`` (0.5 when unset) x the device's memory for
  its weights, KV cache and workspace while awake, from init on; with ``free_cache_engine`` it
  sleeps at level 2 between rollouts (weights and KV cache discarded), so the update holds none
  of it. vLLM on a CPU never sleeps; its KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB when set, else
  ``gpu_memory_utilization`` x the host's memory less what the process holds when vLLM starts,
  else rlvr's ``max_num_seqs`` x ``max_model_len`` capped at ``CPU_KV_CACHE_CAP``.
- The update's activations are first order: per token and layer about 8 hidden + 4 MLP-wide
  values (an MoE layer's: its active experts') kept for the backward (one hidden value with
  gradient checkpointing, plus one layer recomputed), and the fp32 (tokens, V) log-softmax of
  the micro-batch's response tokens, which ``forward.token_log_probs`` computes in chunks of
  ``LOGIT_CHUNK_TOKENS`` and, over one chunk, recomputes chunk by chunk in the backward (then
  only a chunk's values are alive). A micro-batch is ``ppo_micro_batch_size_per_gpu`` rows, or with
  ``use_dynamic_bsz`` up to ``ppo_max_token_len_per_gpu`` tokens (one longer row alone).
- A critic (``adv_estimator=gae``): the backbone with a one-output value head, sharded like the
  actor, with its own gradients, AdamW moments and update activations (no log-softmax); its
  weights and moments stay on the device in every phase after init.

Terms marked "full copy" do not shrink with more ranks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import on_gpu, teacher_entries
from rlvr.models.loader import check_weight_files, read_config_json
from rlvr.rollout.lean import LLAMA_FAMILY
from rlvr.rollout.vllm_rollout import CPU_KV_CACHE_CAP, EXPERT_KEYS, GPU_MEMORY_UTILIZATION, cpu_kv_cache_bytes
from rlvr.workers.forward import LOGIT_CHUNK_TOKENS

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# SmolLM2-135M-Instruct, the built-in model (its GGUF file is not read for a plan)
BUILTIN_CONFIG = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                  "tie_word_embeddings": True}


MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "glm4_moe")


@dataclass
class ModelShape:
    """The sizes of a decoder-only model that its bytes follow from, read from its config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int  # a dense layer's MLP width
    vocab: int
    tied: bool
    attention_bias: bool
    head_dim: int
    qk_norm: int = 0  # RMSNorm weights on queries and keys per layer (Qwen3: one head's each; OLMoE: all heads')
    sparse_layers: int = 0  # layers whose MLP is a mixture of experts; the others are dense
    experts: int = 0  # routed experts of a sparse layer
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # the always-on shared expert(s) of a sparse layer, their total width
    shared_gate: bool = False  # Qwen2-MoE gates its shared expert with a (hidden -> 1) projection
    mla: dict | None = None  # DeepSeek's multi-head latent attention: q_lora_rank, kv_lora_rank and head dims
    family: str = ""  # config.json's model_type
    counted: "ParamCount | None" = None  # the model transformers builds from the config, counted (None: unknown)
    layer_kv: list[tuple[int, int]] | None = None  # (kv heads, head dim) layer by layer, where they vary (Gemma-4)

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        try:
            h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
            family = cfg.get("model_type")
            head_dim = cfg.get("head_dim") or h // heads
            shape = cls(hidden=h, layers=cfg["num_hidden_layers"], heads=heads,
                        kv_heads=cfg.get("num_key_value_heads") or heads, intermediate=cfg["intermediate_size"],
                        vocab=cfg["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", family_tied(family))),
                        # Qwen2 has q/k/v biases without saying so in its config; Qwen2-MoE names them qkv_bias
                        attention_bias=bool(cfg.get("qkv_bias", True) if family == "qwen2_moe"
                                            else cfg.get("attention_bias", family == "qwen2")),
                        head_dim=head_dim,
                        qk_norm={"qwen3": 2 * head_dim, "qwen3_moe": 2 * head_dim,
                                 "olmoe": (heads + (cfg.get("num_key_value_heads") or heads)) * head_dim
                                 }.get(family, 0), family=family or "")
        except KeyError as err:
            raise ConfigError(f"the model's config.json has no {err.args[0]!r}; the memory plan needs hidden_size, "
                              "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size") from None
        experts = next((cfg[key] for key in EXPERT_KEYS if cfg.get(key)), 0)
        if experts or cfg.get("kv_lora_rank"):
            if family not in MOE_FAMILIES:
                raise ConfigError(f"the memory plan cannot count model_type {family!r}: its config.json has experts or "
                                  "latent attention whose layout the plan does not know, and reading intermediate_size "
                                  "as one dense MLP would undercount it many times over; it counts "
                                  f"{', '.join(MOE_FAMILIES)}")
            shape._read_experts(cfg, family, experts)
        shape.counted = count_parameters(cfg)
        shape.layer_kv = layer_kv_shapes(cfg)
        return shape

    def _read_experts(self, cfg: dict, family: str, experts: int) -> None:
        """Experts, shared experts and which layers are sparse, as transformers builds each family."""
        self.experts, self.experts_per_token = experts, cfg["num_experts_per_tok"]
        # OLMoE's and Mixtral's experts are intermediate_size wide (every layer is sparse)
        self.expert_intermediate = cfg.get("moe_intermediate_size") or self.intermediate
        if family in ("qwen2_moe", "qwen3_moe"):  # sparse where (i + 1) % decoder_sparse_step == 0
            step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
            self.sparse_layers = sum(1 for i in range(self.layers) if i not in dense and (i + 1) % step == 0)
            self.shared_intermediate = cfg.get("shared_expert_intermediate_size") or 0
            self.shared_gate = family == "qwen2_moe"
        elif family in ("deepseek_v2", "deepseek_v3", "glm4_moe"):  # the first first_k_dense_replace layers are dense
            self.sparse_layers = self.layers - cfg.get("first_k_dense_replace", 0)
            self.shared_intermediate = cfg.get("n_shared_experts", 0) * self.expert_intermediate
            if cfg.get("kv_lora_rank"):  # DeepSeek's latent attention (GLM-4-MoE's attention is plain)
                self.mla = {k: cfg.get(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                                    "qk_nope_head_dim", "v_head_dim")}
        else:
            self.sparse_layers = self.layers

    def attention_params(self) -> int:
        if self.mla:
            m = self.mla
            qk = self.heads * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"])
            # queries through a low-rank projection and its norm (or one projection), keys and values through
            # the kv_lora_rank latent (+ the shared rope key) and its norm, then the output projection
            q = (self.hidden * m["q_lora_rank"] + m["q_lora_rank"] + m["q_lora_rank"] * qk
                 if m["q_lora_rank"] else self.hidden * qk)
            kv = (self.hidden * (m["kv_lora_rank"] + m["qk_rope_head_dim"]) + m["kv_lora_rank"]
                  + m["kv_lora_rank"] * self.heads * (m["qk_nope_head_dim"] + m["v_head_dim"]))
            return q + kv + self.heads * m["v_head_dim"] * self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.attention_bias else 0
        return self.hidden * (q + 2 * kv) + q * self.hidden + bias + self.qk_norm

    def mlp_params(self, sparse: bool) -> int:
        """A dense gated MLP (gate, up, down), or the routed experts, the shared ones and the router."""
        if not sparse:
            return 3 * self.hidden * self.intermediate
        return (3 * self.hidden * (self.experts * self.expert_intermediate + self.shared_intermediate)
                + self.hidden * self.experts + (self.hidden if self.shared_gate else 0))

    def layer_params(self, sparse: bool = False) -> int:
        return self.attention_params() + self.mlp_params(sparse) + 2 * self.hidden  # + 2 norms

    def largest_layer(self) -> int:
        """The most parameters one decoder layer has (the unit FSDP2 gathers)."""
        if self.counted:
            return self.counted.largest_layer
        return self.layer_params(self.sparse_layers > 0)

    def root_params(self) -> int:
        """Outside the decoder layers: embedding, final norm, head (when untied), and any other
        model-wide weight (Gemma-4's per-layer embeddings)."""
        if self.counted:
            return self.counted.root
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        """sum(p.numel()) of the model: transformers' own model counted where it knows the family, else
        the count by hand from the config's sizes."""
        if self.counted:
            return self.counted.total
        dense = self.layers - self.sparse_layers
        return dense * self.layer_params() + self.sparse_layers * self.layer_params(True) + self.root_params()

    def active_params(self) -> int:
        """Parameters one token runs through: the total less the routed experts it is not sent to."""
        if self.counted:
            return self.counted.active
        idle = self.sparse_layers * 3 * self.hidden * self.expert_intermediate * (self.experts - self.experts_per_token)
        return self.params() - idle

    def critic_params(self) -> int:
        """The value model: this backbone without the vocabulary head, with a (hidden -> 1) head and its bias."""
        return self.params() - (0 if self.tied else self.vocab * self.hidden) + self.hidden + 1

    def kv_values_per_token(self, vllm: bool, tensor_parallel_size: int = 1) -> int:
        """Cached values of one token over every layer, on one of ``tensor_parallel_size`` ranks of a
        vLLM engine (each holds max(1, kv_heads // size) of the heads). DeepSeek's latent attention:
        vLLM caches the kv_lora_rank latent and the rope key, whole on every rank; transformers (the
        native engine) caches full keys and values."""
        if self.mla:
            m = self.mla
            if vllm:
                return self.layers * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
            return self.layers * self.heads * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"] + m["v_head_dim"])
        if self.layer_kv:
            return sum(2 * max(1, heads // tensor_parallel_size) * dim for heads, dim in self.layer_kv)
        return 2 * self.layers * max(1, self.kv_heads // tensor_parallel_size) * self.head_dim  # keys and values

    def mlp_values(self, sparse: bool) -> int:
        """MLP width one token runs through in a layer: a sparse layer runs experts_per_token routed
        experts and the shared ones."""
        return self.experts_per_token * self.expert_intermediate + self.shared_intermediate if sparse \
            else self.intermediate

    def layer_values(self) -> int:
        """Values one token keeps for the backward over all layers: about 8 hidden + 4 MLP-wide ones a layer."""
        dense = self.layers - self.sparse_layers
        return (8 * self.hidden * self.layers + 4 * (dense * self.mlp_values(False)
                                                     + self.sparse_layers * self.mlp_values(True)))

    def largest_layer_values(self) -> int:
        return 8 * self.hidden + 4 * max(self.mlp_values(self.sparse_layers > 0),
                                         self.mlp_values(False) if self.sparse_layers < self.layers else 0)


def family_tied(family: str | None) -> bool:
    """Whether the family's head is tied when config.json says nothing: transformers' config class
    default (Gemma's are tied, Llama's not), which is what loading the folder gives."""
    config_class = _config_class(family)
    return bool(config_class().tie_word_embeddings) if config_class else False


def _config_class(family: str | None):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[family] if family in CONFIG_MAPPING else None


@dataclass
class ParamCount:
    """The parameters of the model transformers builds from a config.json, counted on the meta device."""

    total: int
    root: int  # outside the decoder layers
    largest_layer: int
    active: int  # less the routed experts a token is not sent to


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.")


def layer_kv_shapes(cfg: dict) -> list[tuple[int, int]] | None:
    """(kv heads, head dim) of each layer where transformers' config class has per-layer attributes
    (Gemma-4: global_head_dim on its full-attention layers), else None (one shape for all)."""
    config_class = _config_class(cfg.get("model_type"))
    if config_class is None:
        return None
    config = config_class(**{k: v for k, v in cfg.items() if k != "model_type"})
    per_layer = getattr(config, "per_layer_config", None)
    if per_layer is None:
        return None
    shapes = []
    for i in range(config.num_hidden_layers):
        layer = per_layer[i]
        heads = getattr(layer, "num_key_value_heads", None) or layer.num_attention_heads
        shapes.append((heads, getattr(layer, "head_dim", None) or layer.hidden_size // layer.num_attention_heads))
    return shapes if len(set(shapes)) > 1 else None


def count_parameters(cfg: dict) -> ParamCount | None:
    """Build the model of ``cfg`` on the meta device (no memory, well under a second for a 671B
    config) and count it, so every family's own layout is counted: Gemma's four norms a layer and
    Gemma-4's per-layer embeddings included. None where transformers does not know the family."""
    config_class = _config_class(cfg.get("model_type"))
    if config_class is None:
        return None
    import torch
    from transformers import AutoModelForCausalLM

    config = config_class(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    experts = next((cfg[key] for key in EXPERT_KEYS if cfg.get(key)), 0)
    per_token = cfg.get("num_experts_per_tok") or 0
    total = root = idle = 0
    layers: dict[int, int] = {}
    for name, p in model.named_parameters():
        n = p.numel()
        total += n
        layer = _LAYER.search(name)
        if layer is None:
            root += n
        else:
            layers[int(layer.group(1))] = layers.get(int(layer.group(1)), 0) + n
        if experts and _EXPERT.search(name):  # routed experts, fused (experts, ...) or one module each
            idle += n * (experts - per_token) // experts
    return ParamCount(total, root, max(layers.values(), default=0), total - idle)


def read_model_config(path: str) -> dict:
    """config.json of ``model.path``: ``builtin``, or a folder (config.json alone is enough). A
    damaged config.json or weight file is refused here, before a run would load the folder."""
    if path == "builtin":
        return dict(BUILTIN_CONFIG)
    local = Path(path).expanduser()
    if local.is_dir() and (local / "config.json").is_file():
        config = read_config_json(local)
        check_weight_files(local)  # headers only; a folder with config.json alone has none
        return config
    raise ConfigError(f"the memory plan reads the model's config.json: {str(local)!r} is not a folder with one "
                      "(a folder with only config.json is enough, e.g. examples/model_configs/qwen2.5-7b)")


@dataclass
class Term:
    name: str
    bytes: float
    full_copy: bool  # does not shrink with more ranks
    note: str = ""
    host: bool = False  # in rank 0's host RAM, not on its GPU (files are read into host memory)


@dataclass
class MemoryPlan:
    world_size: int
    params: int
    active_params: int  # a mixture of experts' parameters one token runs through (= params when dense)
    rows_per_rank: int  # rows one rank generates per generation batch
    capacity: float  # bytes one rank may use
    capacity_source: str
    terms: dict[str, Term] = field(default_factory=dict)
    phases: dict[str, list[str]] = field(default_factory=dict)  # phase -> names of the terms it holds
    kv_floor: float = 0.0  # vLLM refuses to start with a KV cache smaller than one row of max_model_len

    def phase_bytes(self, phase: str) -> float:
        """What ``phase`` holds on the device (host-RAM terms apart)."""
        return sum(self.terms[name].bytes for name in self.phases[phase] if not self.terms[name].host)

    def host_bytes(self, phase: str) -> float:
        """What ``phase`` holds in rank 0's host RAM beside the device."""
        return sum(self.terms[name].bytes for name in self.phases[phase] if self.terms[name].host)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> float:
        return self.phase_bytes(self.peak_phase)


@dataclass
class Run:
    """What every term of the plan reads: the config, the model's shape and where it runs."""

    config: RLVRConfig
    shape: ModelShape
    gpu: bool
    capacity: float

    @property
    def arr(self):
        return self.config.actor_rollout_ref

    @property
    def sharded(self) -> bool:
        return self.arr.actor.strategy == "fsdp2"

    @property
    def world(self) -> int:
        return self.config.trainer.n_gpus_per_node * self.config.trainer.nnodes if self.sharded else 1

    @property
    def act_dtype(self) -> str:
        actor = self.arr.actor
        return "bfloat16" if "bfloat16" in (actor.dtype, actor.fsdp_config.mixed_precision.param_dtype) else "float32"

    @property
    def roll_b(self) -> int:
        return DTYPE_BYTES[self.arr.rollout.dtype]

    @property
    def positions(self) -> int:
        return self.config.data.max_prompt_length + self.config.data.max_response_length

    @property
    def vllm(self) -> bool:
        return self.arr.rollout.name == "vllm"

    @property
    def vllm_sleeps(self) -> bool:
        """vLLM's sleep mode exists only on a GPU (its CPU worker ignores sleep)."""
        return self.vllm and self.gpu and self.arr.rollout.free_cache_engine

    def rows(self, prompts: int) -> int:
        return prompts * self.arr.rollout.n // self.world

    def gen_rows(self, prompts: int) -> int:
        """Rows one engine generates: the actor rank's, or a pool worker's share."""
        return prompts * self.arr.rollout.n // (self.arr.rollout.n_gpus_per_node if self.pool else self.world)

    @property
    def ahead(self) -> int:
        """Batches generated ahead of the update (colocate_async and separate_async; 0: sync)."""
        v1 = self.config.trainer.v1
        return v1.colocate_async.num_warmup_batches if v1.trainer_mode != "sync" else 0

    @property
    def pool(self) -> bool:
        """``hybrid_engine=false``: the engine runs on a rollout pool's devices, none of it on the actor's."""
        return not self.arr.hybrid_engine and not self.servers

    @property
    def servers(self) -> bool:
        """``rollout.mode=async``: rollout servers generate; no engine on the actor's device."""
        return self.arr.rollout.mode == "async"

    @property
    def own_engine(self) -> bool:
        """The engine is a ``RolloutWorker`` with a model of its own (async or a pool), not the hybrid
        worker's: the hybrid worker's rollout_mode, where the offloads happen, never runs. colocate_async
        builds one at any num_warmup_batches, 0 included."""
        colocate_async = self.config.trainer.v1.trainer_mode == "colocate_async"
        return (bool(self.ahead) or self.pool or colocate_async) and not self.servers


def plan_memory(config: RLVRConfig, model_cfg: dict, device_memory_gb: float | None = None) -> MemoryPlan:
    """Bytes per device, by term and phase (init, resume, generation, update, critic update), of the
    run ``config`` on a device of ``device_memory_gb`` (None: this machine's device)."""
    capacity, source = device_capacity(config, device_memory_gb)
    run = Run(config, ModelShape.from_config(model_cfg), on_gpu(config), capacity)
    critic = critic_shape(config, model_cfg) if config.algorithm.adv_estimator == "gae" else None
    t: dict[str, Term] = {}
    state_terms(run, t)
    read_terms(run, t, critic)
    if run.arr.rollout.mode == "async":
        kv_floor = 0.0
        server_terms(run, t)
    elif run.vllm:
        kv_floor = vllm_terms(run, t)
    else:
        kv_floor = 0.0
        native_engine_terms(run, t)
    if run.own_engine:
        own_engine_terms(run, t)
    update_terms(run, t)
    if critic is not None:
        critic_terms(run, t, critic)
    gen_prompts = config.data.gen_batch_size or config.data.train_batch_size
    return MemoryPlan(run.world, run.shape.params(), run.shape.active_params(), run.gen_rows(gen_prompts), capacity,
                      source, t, phases(run, t), kv_floor)


def state_terms(run: Run, t: dict[str, Term]) -> None:
    """The actor's fp32 weights (the master copy), gradients, AdamW moments and the reference."""
    arr, sharded = run.arr, run.sharded
    use_ref = (arr.actor.use_kl_loss or run.config.algorithm.use_kl_in_reward) and arr.model.lora_rank == 0
    shard32 = 4 * run.shape.params() / run.world
    t["weights"] = Term("actor weights (fp32, = master)", shard32, not sharded, "sharded" if sharded else "")
    t["master"] = Term("fp32 master copy", 0.0, False, "none: the parameters are kept in fp32")
    t["gradients"] = Term("gradients (fp32)", shard32, not sharded, "freed after each optimizer step")
    t["optimizer"] = Term("AdamW moments (2 x fp32)", 2 * shard32, not sharded)
    t["reference"] = Term("reference model (fp32)", shard32 if use_ref else 0.0, use_ref and not sharded,
                          "" if use_ref else "no KL term: none")
    distillation = run.config.distillation
    entries = {k: e for k, e in teacher_entries(distillation).items()
               if not e.inference.external_server_addresses} if distillation.enabled else {}
    if entries:  # frozen like the reference, beside it (rlvr.workers.teacher); a served one holds nothing here
        params = sum(run.shape.params() if e.model_path == arr.model.path
                     else ModelShape.from_config(read_model_config(e.model_path)).params() for e in entries.values())
        t["teachers"] = Term(f"distillation teacher{'s' if len(entries) > 1 else ''} (fp32)", 4 * params / run.world,
                             not sharded, f"{len(entries)} frozen, {params / 1e9:.3f}B parameters"
                             + (", sharded" if sharded else ""))


def read_terms(run: Run, t: dict[str, Term], critic: ModelShape | None) -> None:
    """What rank 0 reads from files: the fp32 model at a sharded init (then broadcast shard by shard),
    and at resume the fp32 weights with the whole AdamW state (``fsdp.load_checkpoint_state``; a
    critic's are read after the actor's are freed). On a GPU that is host RAM."""
    P = max(run.shape.params(), critic.critic_params() if critic else 0)
    where = "read into host memory" if run.gpu else "freed once loaded"
    if run.sharded:
        t["init_read"] = Term("full fp32 state read at load (rank 0)", 4 * P, True, where, host=run.gpu)
    if run.config.trainer.resume_mode != "disable":
        t["resume_read"] = Term("weights + AdamW state read at resume (rank 0)", 12 * P, True,
                                f"fp32 weights and 2 moments, {where}", host=run.gpu)


def native_engine_terms(run: Run, t: dict[str, Term]) -> None:
    """The native engine: its weights (gathered under fsdp2, a kept copy or shared under local), the
    CPU decode's prepacked projections, and a KV cache of one wave of whole groups."""
    arr, shape, P = run.arr, run.shape, run.shape.params()
    if run.sharded:  # gathered from the shards when a rollout starts, freed when it ends
        t["engine_weights"] = Term(f"rollout weights ({arr.rollout.dtype}, unsharded)", run.roll_b * P, True,
                                   "only while generating")
    else:
        copy = run.roll_b * P if arr.rollout.dtype != "float32" else 0.0
        t["engine_weights"] = Term(f"rollout weights ({arr.rollout.dtype})", copy, True,
                                   "a copy, kept" if copy else "shares the fp32 weights")
    lean_packed = arr.rollout.lean_decode and not run.gpu and shape.family in LLAMA_FAMILY
    attention = shape.attention_params() - shape.qk_norm  # the 4 projections (with their biases)
    packed = (shape.layers * (attention + shape.mlp_params(False)) + shape.vocab * shape.hidden) * run.roll_b
    t["packed_weights"] = Term("prepacked projections (CPU decode)", packed if lean_packed else 0.0, True,
                               "only while generating" if lean_packed else "none on this device")
    rows = run.gen_rows(run.config.data.gen_batch_size or run.config.data.train_batch_size)
    # the most rows the engine core runs at once: max_num_seqs (a row that ends frees its slot for a waiting one)
    rows_at_once = min(rows, arr.rollout.max_num_seqs)
    kv = shape.kv_values_per_token(vllm=False) * run.roll_b * rows_at_once * run.positions
    t["kv_cache"] = Term("KV cache", kv, False, f"{rows_at_once} rows x {run.positions} positions")


def server_terms(run: Run, t: dict[str, Term]) -> None:
    """``rollout.mode=async``: no engine in the training process. The ``rlvr serve`` replicas rlvr
    starts on this machine each hold the model in the rollout dtype, the CPU decode's packed
    projections and the KV cache of its share of the rows, for the whole run; external servers
    hold their own memory elsewhere."""
    rollout = run.arr.rollout
    if rollout.external_server_addresses:
        t["rollout_servers"] = Term("rollout servers", 0.0, True, f"{len(rollout.external_server_addresses)} "
                                    "external: their memory is their machines', not counted")
        return
    one: dict[str, Term] = {}
    native_engine_terms(run, one)  # one engine's weights and packed projections
    replicas = rollout.n_gpus_per_node
    rows = run.gen_rows(run.config.data.gen_batch_size or run.config.data.train_batch_size)
    share = min(-(-rows // replicas), rollout.max_num_seqs)
    kv = run.shape.kv_values_per_token(vllm=False) * run.roll_b * share * run.positions
    weights = run.roll_b * run.shape.params() + one["packed_weights"].bytes
    t["rollout_servers"] = Term(f"{replicas} rlvr serve replica{'s' if replicas > 1 else ''} (weights + KV cache each)",
                                replicas * (weights + kv), True,
                                f"{share} rows x {run.positions} positions each, kept for the whole run; "
                                "each process's Python and torch (about 0.5 GB) not counted")
    staging_terms(run, t)


def staging_terms(run: Run, t: dict[str, Term]) -> None:
    """Servers driven by a ``RolloutWorker`` in the trainer's process (``drives_servers``: the
    trainer.v1 modes, hybrid_engine=false): its fp32 model, which each version is loaded into and
    sent on from, and the versions sent and not yet loaded (k ahead, one for a pool's sync), all in
    host memory: on a GPU none of it is on the device."""
    from rlvr.config.validate import drives_servers

    if not drives_servers(run.config):
        return
    P, k = run.shape.params(), run.ahead
    copies = 1 + max(1, k)
    where = "host memory, not the GPU's" if run.gpu else "kept"
    t["server_staging"] = Term(f"the servers' driver: its model and {max(1, k)} version(s) sent (fp32)",
                               0.0 if run.gpu else copies * 4 * P, True, where)


def own_engine_terms(run: Run, t: dict[str, Term]) -> None:
    """An engine with a model of its own (``RolloutWorker``: the policy in fp32, plus the native
    engine's copy in its dtype, or vLLM's weights streamed from it), kept: beside the actor under
    colocate_async, generating while the actor updates, or on a rollout pool's devices
    (``hybrid_engine=false``). Each weight version sent is a full fp32 copy until the engine loads
    it: colocate_async's ``CopyWeights`` on the actor's device, k = num_warmup_batches of them when
    the engine is k batches behind its queue, the most it can be (one at k = 0: the version sent
    waits for the engine's next load); a pool's receiver stages each broadcast version whole (one at
    least, k ahead under separate_async)."""
    P, k = run.shape.params(), run.ahead
    where = "on the rollout pool's devices" if run.pool else "colocate_async"
    if run.vllm:  # vLLM's own weights are counted already; the worker's fp32 model they are streamed from is not
        t["rollout_model"] = Term("rollout worker's model (fp32)", 4 * P, True, f"vLLM's weights stream from it, kept "
                                  f"({where})")
    else:
        cast = run.roll_b * P if run.arr.rollout.dtype != "float32" else 0.0
        t["engine_weights"] = Term(f"rollout engine's own model (fp32{' + ' + run.arr.rollout.dtype if cast else ''})",
                                   4 * P + cast, True, f"its own copy, kept ({where})")
    versions = max(1, k)  # k = 0 too: the version sent waits, one full copy, until the engine loads it
    t["pending_weights"] = Term("weight versions sent, not yet loaded (fp32)", versions * 4 * P, True,
                                f"at most {versions} (num_warmup_batches = {k}), each freed once the engine loads it")


def vllm_terms(run: Run, t: dict[str, Term]) -> float:
    """vLLM's weights and KV cache; returns the KV cache vLLM needs to start (one max_model_len row).

    On a GPU vLLM reserves gpu_memory_utilization x the device's memory for its weights, KV cache
    and workspace while awake; with free_cache_engine it sleeps between rollouts at level 2 (weights
    and KV cache discarded: the device keeps ~nothing of it; level 1 would keep the weights in host
    RAM). vLLM's CPU worker never sleeps, and sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB)
    when set, else from gpu_memory_utilization of the host's memory (its NUMA node's, where it has
    several) less what the process already holds (``cpu_worker.determine_available_memory``), else
    rlvr's CPU_KV_CACHE_CAP sizing."""
    arr, P, tp = run.arr, run.shape.params(), run.arr.rollout.tensor_model_parallel_size
    weights = run.roll_b * P / tp  # an engine over tp ranks: each holds 1/tp of every layer (norms, a few kB, whole)
    max_len = arr.rollout.max_model_len or run.positions
    per_token = run.shape.kv_values_per_token(vllm=True, tensor_parallel_size=tp) * run.roll_b
    kept = "released while it sleeps (level 2)" if run.vllm_sleeps else "kept between rollouts"
    t["engine_weights"] = Term(f"vLLM's weights ({arr.rollout.dtype})" + (f", 1/{tp} of them (TP={tp})" if tp > 1 else ""),
                               weights, True, kept)
    utilization = arr.rollout.gpu_memory_utilization
    if run.gpu:
        reserved = (utilization or GPU_MEMORY_UTILIZATION) * run.capacity
        t["kv_cache"] = Term("vLLM's KV cache and workspace", reserved - weights, True,
                             f"the rest of its reservation, {utilization or GPU_MEMORY_UTILIZATION:g} x "
                             f"{run.capacity / GB:.2f} GB = {reserved / GB:.2f} GB, {kept}")
    elif os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        space = int(os.environ["VLLM_CPU_KVCACHE_SPACE"])
        t["kv_cache"] = Term("vLLM's KV cache", space * 2**30, False, f"VLLM_CPU_KVCACHE_SPACE={space} GiB, kept")
    elif utilization is not None:  # the whole process, at the engine's start, is utilization x the host's memory
        host = run.capacity * run.config.trainer.n_gpus_per_node
        held = weights + t["weights"].bytes + t["reference"].bytes
        t["kv_cache"] = Term("vLLM's KV cache", utilization * host - held, False,
                             f"{utilization:g} x {host / GB:.2f} GB of host memory less the {held / GB:.2f} GB "
                             "the process holds when vLLM starts, kept")
    else:
        kv = cpu_kv_cache_bytes(per_token, arr.rollout.max_num_seqs, max_len)
        t["kv_cache"] = Term("vLLM's KV cache", kv, False,
                             f"{arr.rollout.max_num_seqs} rows x {max_len} positions, at most "
                             f"{CPU_KV_CACHE_CAP / 2**30:g} GiB, kept")
    return per_token * max_len


def micro_batch_tokens(run: Run) -> tuple[int, int, str]:
    """Tokens and response tokens of the largest update micro-batch, and how it is formed: by rows,
    or with use_dynamic_bsz by a token budget that a single longer row exceeds alone."""
    actor, data = run.arr.actor, run.config.data
    if actor.use_dynamic_bsz:
        budget = actor.ppo_max_token_len_per_gpu
        return (max(budget, run.positions), max(budget, data.max_response_length),
                f"up to {max(budget, run.positions)} tokens (ppo_max_token_len_per_gpu)")
    micro = min(actor.ppo_micro_batch_size_per_gpu, run.rows(data.train_batch_size))
    return micro * run.positions, micro * data.max_response_length, f"{micro} rows x {run.positions} tokens"


def activation_bytes(shape: ModelShape, tokens: int, checkpointed: bool, dtype_bytes: int) -> float:
    """Values kept for the backward: every layer's (or, checkpointed, each layer's input and one layer
    recomputed)."""
    if checkpointed:
        return (shape.hidden * shape.layers + shape.largest_layer_values()) * tokens * dtype_bytes
    return shape.layer_values() * tokens * dtype_bytes


def gathered_bytes(root: int, layer: int, every_layer: int | None, tied: bool, act_b: int) -> float:
    """FSDP2's unsharded parameters during the update and the gradients in flight. The root unit
    (embedding, head) is gathered for the whole forward and one layer at a time, or, without
    reshard_after_forward, every layer stays gathered (``every_layer``: their parameters). In the
    backward each unit gets an unsharded fp32 gradient that FSDP2 copies into its reduce-scatter
    buffer; a tied embedding's gradient comes in two parts (the head's, the lookup's) and their sum."""
    params = every_layer + root if every_layer is not None else root + layer
    return params * act_b + (root * (4 if tied else 2) + layer * 2) * 4


def logit_bytes(vocab: int, response_tokens: int) -> float:
    """fp32 vocabulary-wide values of the update: one chunk's logits, log-softmax and their gradient
    alive at once, plus, when the micro-batch fits in one chunk, its log-softmax kept for the backward
    (over one chunk ``forward.token_log_probs`` recomputes each chunk in the backward instead)."""
    chunk = min(LOGIT_CHUNK_TOKENS, response_tokens)
    kept = response_tokens if response_tokens <= LOGIT_CHUNK_TOKENS else 0
    return 4 * vocab * (kept + 2 * chunk)


def update_terms(run: Run, t: dict[str, Term]) -> None:
    """The actor update's activations, its fp32 log-softmax and (fsdp2) what FSDP2 gathers."""
    shape, arr = run.shape, run.arr
    act_b = DTYPE_BYTES[run.act_dtype]
    tokens, response_tokens, how = micro_batch_tokens(run)
    t["activations"] = Term("activations (micro-batch)",
                            activation_bytes(shape, tokens, arr.model.enable_gradient_checkpointing, act_b),
                            False, f"{how}, {run.act_dtype}")
    t["logits"] = Term("log-softmax kept for backward (fp32)", logit_bytes(shape.vocab, response_tokens), False,
                       f"{response_tokens} response tokens x {shape.vocab}"
                       + ("; over one chunk, recomputed per chunk in the backward"
                          if response_tokens > LOGIT_CHUNK_TOKENS else ""))
    if run.sharded:
        every = None if arr.actor.fsdp_config.reshard_after_forward else shape.params() - shape.root_params()
        t["gathered"] = Term("gathered root + one layer, and their gradients" if every is None else
                             "every layer gathered, and gradients in flight",
                             gathered_bytes(shape.root_params(), shape.largest_layer(), every, shape.tied, act_b),
                             True, "" if every is None else "reshard_after_forward=false")


def critic_shape(config: RLVRConfig, model_cfg: dict) -> ModelShape:
    path = config.critic.model.path
    same = path == config.actor_rollout_ref.model.path
    return ModelShape.from_config(model_cfg if same else read_model_config(path))


def critic_terms(run: Run, t: dict[str, Term], shape: ModelShape) -> None:
    """The critic (``adv_estimator=gae``): the backbone with a one-output value head, sharded like
    the actor, its fp32 weights, gradients and AdamW moments, and its update's activations (no
    vocabulary log-softmax: one value per token)."""
    critic = run.config.critic
    Pc, sharded = shape.critic_params(), run.sharded
    shard32 = 4 * Pc / run.world
    t["critic_weights"] = Term("critic weights (fp32)", shard32, not sharded, f"{Pc / 1e9:.3f}B parameters")
    t["critic_gradients"] = Term("critic gradients (fp32)", shard32, not sharded, "freed after each optimizer step")
    t["critic_optimizer"] = Term("critic AdamW moments (2 x fp32)", 2 * shard32, not sharded)
    dtype = run.arr.actor.fsdp_config.mixed_precision.param_dtype if sharded else "float32"
    micro = min(critic.ppo_micro_batch_size_per_gpu, run.rows(run.config.data.train_batch_size))
    t["critic_activations"] = Term("critic activations (micro-batch)",
                                   activation_bytes(shape, micro * run.positions,
                                                    critic.model.enable_gradient_checkpointing, DTYPE_BYTES[dtype]),
                                   False, f"{micro} rows x {run.positions} tokens, {dtype}")
    if sharded:  # the critic always reshards after forward; its root has no head besides the value head
        root = shape.vocab * shape.hidden + 2 * shape.hidden + 1
        t["critic_gathered"] = Term("critic's gathered root + one layer, and their gradients",
                                    gathered_bytes(root, shape.largest_layer(), None, False, DTYPE_BYTES[dtype]), True)


ENGINE_TERMS = ("engine_weights", "rollout_model", "packed_weights", "kv_cache", "pending_weights")


def phases(run: Run, t: dict[str, Term]) -> dict[str, list[str]]:
    """Which terms each phase holds (names of terms the run has none of are dropped). A rollout
    pool's devices are a phase of their own, ``rollout pool``, beside the actor's."""
    arr = run.arr
    # the offloads act only under fsdp2, and only in the hybrid worker's rollout_mode (hybrid._offload),
    # which an engine of its own (async, a pool) never runs
    offload = run.sharded and not run.own_engine
    offloaded = {"weights": offload and arr.actor.fsdp_config.param_offload,
                 "reference": offload and arr.ref.fsdp_config.param_offload,
                 "optimizer": offload and arr.actor.fsdp_config.optimizer_offload}
    engine_kept, engine_init, overlap = engine_residency(run)
    critic = ["critic_weights", "critic_optimizer"]  # never offloaded
    init = ["weights", "reference", "teachers", "init_read"] + engine_init + ["critic_weights"]
    named = {"init": init}
    if "resume_read" in t:  # after init (a sleeping vLLM asleep by then), the optimizer state filled from the file
        named["resume"] = ([n for n in init if n not in ("init_read", *engine_init)] + engine_kept
                           + ["optimizer", "critic_optimizer", "resume_read"])
    named["generation"] = ([n for n in ("weights", "master", "reference", "teachers", "optimizer") if not offloaded.get(n)]
                           + ([] if run.pool else list(ENGINE_TERMS)) + critic)
    named["update"] = (["weights", "master", "reference", "teachers", "gradients", "optimizer", "activations", "logits",
                        "gathered"] + engine_kept + overlap + critic)
    if "critic_weights" in t:  # its own update: the actor's gradients are freed by then
        named["critic update"] = (["weights", "master", "reference", "teachers", "optimizer"] + engine_kept + overlap + critic
                                  + ["critic_gradients", "critic_activations", "critic_gathered"])
    if run.pool:  # a pool device: its model and engine, generating, while a version is received
        named["rollout pool"] = list(ENGINE_TERMS)
    for names in named.values():  # local rollout servers (and their driver) live beside the trainer throughout
        names += ["rollout_servers", "server_staging"]
    return {phase: [n for n in names if n in t] for phase, names in named.items()}


def engine_residency(run: Run) -> tuple[list[str], list[str], list[str]]:
    """The engine's terms on the actor's device: those kept between rollouts, those at init, and
    those an update overlaps (async: the engine generates while the actor and the critic update,
    so they hold its whole working set). A pool's engine is on devices of its own, servers' on
    theirs: none."""
    if run.pool or run.servers:
        return [], [], []
    if run.vllm:  # vLLM awake between rollouts unless it sleeps; started (awake) at init
        kept, init = ([] if run.vllm_sleeps else ["engine_weights", "kv_cache"]), ["engine_weights", "kv_cache"]
    else:  # local's kept copy, or the engine's own model under async
        kept = [] if run.sharded and not run.ahead else ["engine_weights"]
        init = list(kept)
    if run.ahead:  # the rollout worker's fp32 model (vLLM's source) is kept from init on
        kept, init = kept + ["rollout_model"], init + ["rollout_model"]
    overlap = [n for n in ENGINE_TERMS if n not in kept] if run.ahead else []
    return kept, init, overlap


def device_capacity(config: RLVRConfig, override_gb: float | None) -> tuple[float, str]:
    """Bytes one rank may use, and where the figure comes from."""
    if override_gb:
        return override_gb * GB, "--device-memory-gb"
    import torch

    if on_gpu(config):
        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda, but this machine has no CUDA device to read the capacity from: "
                              "give it as --device-memory-gb (e.g. 80)")
        return float(torch.cuda.get_device_properties(0).total_memory), torch.cuda.get_device_name(0)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ranks = config.trainer.n_gpus_per_node  # CPU ranks of a node share its RAM
    return ram / ranks, f"this machine's RAM / {ranks} rank(s)"


def advice(plan: MemoryPlan, phase: str, config: RLVRConfig) -> str:
    """The largest device term of ``phase`` and the settings that shrink it."""
    name = max((n for n in plan.phases[phase] if not plan.terms[n].host), key=lambda n: plan.terms[n].bytes)
    term = plan.terms[name]
    return f"its largest term is {term.name} ({term.bytes / GB:.2f} GB): {term_fix(name, config)}"


def term_fix(name: str, config: RLVRConfig) -> str:
    """The settings that shrink the term ``name``."""
    arr = config.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    if name == "kv_cache" and rollout.name == "vllm":
        return ("lower actor_rollout_ref.rollout.gpu_memory_utilization (vLLM takes that fraction of the memory"
                + ("" if rollout.free_cache_engine else "; free_cache_engine=true lets it sleep during the update")
                + ")" + (", or unset VLLM_CPU_KVCACHE_SPACE" if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else ""))
    if name == "kv_cache":
        return ("lower actor_rollout_ref.rollout.max_num_seqs (rows decoded at once), actor_rollout_ref.rollout.n or "
                "data.max_response_length" + (", or set actor_rollout_ref.rollout.dtype=bfloat16"
                                              if rollout.dtype == "float32" else ""))
    if name in ("activations", "logits"):
        size = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu" if actor.use_dynamic_bsz
                else "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
        return (f"lower {size} or data.max_response_length"
                + ("" if arr.model.enable_gradient_checkpointing
                   else ", or set actor_rollout_ref.model.enable_gradient_checkpointing=true"))
    if name == "critic_activations":
        return ("lower critic.ppo_micro_batch_size_per_gpu or data.max_response_length"
                + ("" if config.critic.model.enable_gradient_checkpointing
                   else ", or set critic.model.enable_gradient_checkpointing=true"))
    if name == "gathered" and not actor.fsdp_config.reshard_after_forward:
        return ("set actor_rollout_ref.actor.fsdp_config.reshard_after_forward=true (then one layer at a time is "
                "gathered)")
    if name == "pending_weights":
        return ("lower trainer.v1.colocate_async.num_warmup_batches (each batch ahead holds one more fp32 version "
                "until the engine loads it)")
    if name == "rollout_servers":
        return ("fewer replicas (actor_rollout_ref.rollout.n_gpus_per_node), fewer rows each "
                "(actor_rollout_ref.rollout.max_num_seqs), or servers on other machines "
                "(actor_rollout_ref.rollout.external_server_addresses)")
    if name == "rollout_model":
        return ("it is the rollout worker's own fp32 copy of the policy: trainer.v1.trainer_mode=sync with the "
                "hybrid engine streams vLLM's weights from the actor's instead, or a device with more memory")
    if name in ("init_read", "resume_read", "engine_weights", "packed_weights", "gathered", "critic_gathered"):
        return ("it is unsharded, so more GPUs do not shrink it: "
                + ("actor_rollout_ref.rollout.dtype=bfloat16 halves it, " if name == "engine_weights"
                   and rollout.dtype == "float32" else "")
                + ("actor_rollout_ref.rollout.dtype=float32 (the engine then shares the actor's weights), "
                   if name == "engine_weights" and actor.strategy == "local" and rollout.name != "vllm" else "")
                + "a device with more memory, or a smaller model")
    if name.startswith("critic_"):
        return ("more GPUs (trainer.n_gpus_per_node / trainer.nnodes with actor_rollout_ref.actor.strategy=fsdp2: the "
                "critic is sharded like the actor), or a smaller value model (critic.model.path)")
    return ("more GPUs (trainer.n_gpus_per_node / trainer.nnodes with actor_rollout_ref.actor.strategy=fsdp2), "
            "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload=true, or LoRA "
            "(actor_rollout_ref.model.lora_rank)")


def format_plan(plan: MemoryPlan) -> str:
    active = f" ({plan.active_params / 1e9:.3f}B active)" if plan.active_params != plan.params else ""
    lines = [f"memory plan per device: {plan.params / 1e9:.3f}B parameters{active}, world size {plan.world_size}, "
             f"{plan.rows_per_rank} rows per rank", ""]
    for term in plan.terms.values():
        mark = " [rank 0's host RAM]" if term.host else " [full copy per rank]" if term.full_copy and term.bytes else ""
        note = f"  ({term.note})" if term.note else ""
        lines.append(f"  {term.name:<48} {term.bytes / GB:9.2f} GB{mark}{note}")
    lines.append("")
    for phase in plan.phases:
        device = [n for n in plan.phases[phase] if not plan.terms[n].host]
        host = [n for n in plan.phases[phase] if plan.terms[n].host]
        line = f"  {phase:<14} {plan.phase_bytes(phase) / GB:9.2f} GB  = {' + '.join(device)}"
        if host:
            line += f"; rank 0's host RAM {plan.host_bytes(phase) / GB:.2f} GB ({' + '.join(host)})"
        lines.append(line)
    lines.append(f"peak {plan.peak / GB:.2f} GB in {plan.peak_phase}; capacity {plan.capacity / GB:.2f} GB "
                 f"({plan.capacity_source})")
    return "\n".join(lines)


def check_plan(plan: MemoryPlan, config: RLVRConfig) -> None:
    """Refuse a plan whose peak exceeds its device's capacity, or whose vLLM engine would refuse to
    start (a KV cache short of one max_model_len row), naming the setting to change."""
    kv = plan.terms.get("kv_cache")  # none in the training process with rollout servers
    if kv is not None and kv.bytes < plan.kv_floor:
        weights = plan.terms["engine_weights"].bytes
        raise ConfigError(f"vLLM would refuse to start: beside its weights ({weights / GB:.2f} GB) its KV cache gets "
                          f"{kv.bytes / GB:.2f} GB ({kv.note}), less than the {plan.kv_floor / GB:.3f} GB of one row "
                          "of max_model_len; raise "
                          "actor_rollout_ref.rollout.gpu_memory_utilization or lower "
                          "actor_rollout_ref.rollout.max_model_len")
    if plan.peak > plan.capacity:
        phase = plan.peak_phase
        raise ConfigError(f"the memory plan needs {plan.peak / GB:.2f} GB per device in {phase}, over the "
                          f"{plan.capacity / GB:.2f} GB available; {advice(plan, phase, config)}")
