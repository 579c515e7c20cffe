"""The memory plan: per-device bytes of a run, from the model's config.json alone.

``plan_memory(config, model_config)`` counts what rlvr's code holds on each device (one
data-parallel rank), phase by phase, and ``check_plan`` refuses a plan over the device's
capacity before anything loads, naming the setting to change. ``bench/memory.py`` measures
the same phases (per-rank peak resident memory on a 0.31B synthetic model at 1, 2 and 4
ranks) next to this plan's figures.

- ``strategy=fsdp2``: init holds, on rank 0, the fp32 state read once from disk beside the
  actor's and the reference's shards (the other ranks: their shards and one tensor in
  flight); a rollout gathers the unsharded engine weights in ``rollout.dtype`` and frees them
  when it ends; the update gathers the root unit (embedding, head) for its forward and one
  layer at a time, and their unsharded gradients in the backward.
- ``strategy=local``: the loaded model, its reference copy, and (``rollout.dtype=bfloat16``)
  the engine's own bf16 copy are all kept for the run; with a float32 rollout the engine
  shares the actor's weights.
- The fp32 parameters are the master weights (no separate master copy); gradients are fp32
  and freed after each optimizer step; AdamW keeps two fp32 moments (``optimizer_offload``
  moves them to the CPU while generation runs, ``param_offload`` the actor's, and
  ``ref.fsdp_config.param_offload`` the reference's shards, all under fsdp2 only).
- Decoding on a CPU, the lean step keeps a prepacked copy of the vocabulary projection.
- The KV cache holds the rows of one wave (rows per rank, or the whole groups that fit in
  ``rollout.max_num_seqs``) of (longest prompt + max_response_length) positions in the
  rollout dtype.
- The update's activations are first order: per token and layer about 8 hidden + 4
  intermediate values kept for the backward (one hidden value with gradient checkpointing,
  plus one layer recomputed), and the fp32 (tokens, V) log-softmax of every response token of
  the micro-batch, which ``forward.token_log_probs`` computes in chunks but autograd keeps.

Terms marked "full copy" do not shrink with more ranks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.config.schema import RLVRConfig
from rlvr.rollout.engine import group_waves
from rlvr.rollout.vllm_rollout import CPU_KV_CACHE_CAP, cpu_kv_cache_bytes
from rlvr.workers.forward import LOGIT_CHUNK_TOKENS

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# SmolLM2-135M-Instruct, the built-in model (its GGUF file is not read for a plan)
BUILTIN_CONFIG = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                  "tie_word_embeddings": True}


@dataclass
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    attention_bias: bool
    head_dim: int

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        try:
            h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
            return cls(hidden=h, layers=cfg["num_hidden_layers"], heads=heads,
                       kv_heads=cfg.get("num_key_value_heads") or heads, intermediate=cfg["intermediate_size"],
                       vocab=cfg["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", False)),
                       # Qwen2 has q/k/v biases without saying so in its config
                       attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                       head_dim=cfg.get("head_dim") or h // heads)
        except KeyError as err:
            raise ConfigError(f"the model's config.json has no {err.args[0]!r}; the memory plan needs hidden_size, "
                              "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size") from None

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.attention_bias else 0)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden  # + mlp + 2 norms

    def root_params(self) -> int:
        """Outside the decoder layers: embedding, final norm, head (when untied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()


def read_model_config(path: str) -> dict:
    """config.json of ``model.path``: ``builtin``, or a folder (config.json alone is enough)."""
    if path == "builtin":
        return dict(BUILTIN_CONFIG)
    local = Path(path).expanduser()
    if local.is_dir() and (local / "config.json").is_file():
        return json.loads((local / "config.json").read_text())
    raise ConfigError(f"the memory plan reads the model's config.json: {str(local)!r} is not a folder with one "
                      "(a folder with only config.json is enough, e.g. examples/model_configs/qwen2.5-7b)")


@dataclass
class Term:
    name: str
    bytes: float
    full_copy: bool  # does not shrink with more ranks
    note: str = ""


@dataclass
class MemoryPlan:
    world_size: int
    params: int
    rows_per_rank: int
    terms: dict[str, Term] = field(default_factory=dict)
    phases: dict[str, list[str]] = field(default_factory=dict)  # phase -> names of the terms it holds

    def phase_bytes(self, phase: str) -> float:
        return sum(self.terms[name].bytes for name in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> float:
        return self.phase_bytes(self.peak_phase)


def on_gpu(config: RLVRConfig) -> bool:
    import torch

    device = config.trainer.device
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def plan_memory(config: RLVRConfig, model_cfg: dict) -> MemoryPlan:
    """Bytes per device, by term and phase (init, generation, update), of the run ``config``."""
    shape = ModelShape.from_config(model_cfg)
    arr = config.actor_rollout_ref
    actor, fsdp_cfg = arr.actor, arr.actor.fsdp_config
    sharded = actor.strategy == "fsdp2"
    world = config.trainer.n_gpus_per_node * config.trainer.nnodes if sharded else 1
    use_ref = (actor.use_kl_loss or config.algorithm.use_kl_in_reward) and arr.model.lora_rank == 0
    P = shape.params()
    full32 = 4 * P
    shard32 = full32 / world
    act_dtype = "bfloat16" if "bfloat16" in (actor.dtype, fsdp_cfg.mixed_precision.param_dtype) else "float32"
    act_b = DTYPE_BYTES[act_dtype]
    roll_b = DTYPE_BYTES[arr.rollout.dtype]

    t: dict[str, Term] = {}
    t["weights"] = Term("actor weights (fp32, = master)", shard32, not sharded, "sharded" if sharded else "")
    t["master"] = Term("fp32 master copy", 0.0, False, "none: the parameters are kept in fp32")
    t["gradients"] = Term("gradients (fp32)", shard32, not sharded, "freed after each optimizer step")
    t["optimizer"] = Term("AdamW moments (2 x fp32)", 2 * shard32, not sharded)
    t["reference"] = Term("reference model (fp32)", shard32 if use_ref else 0.0, use_ref and not sharded,
                          "" if use_ref else "no KL term: none")
    if sharded:  # gathered from the shards when a rollout starts, freed when it ends
        t["engine_weights"] = Term(f"rollout weights ({arr.rollout.dtype}, unsharded)", roll_b * P, True,
                                   "only while generating")
        # rank 0 reads the model once, into host memory, and broadcasts it; the others hold one tensor at a time
        t["init_read"] = Term("full fp32 state read at load (rank 0)", full32, True,
                              "rank 0's host RAM, not the GPU's" if on_gpu(config) else "freed once sharded")
        # the update gathers the root unit (embedding, head) for the whole forward and one layer at a time.
        # In the backward each gets an unsharded fp32 gradient and FSDP2 copies it into its reduce-scatter
        # buffer; a tied embedding's gradient comes in two parts (the head's, the lookup's) and their sum
        root, layer = shape.root_params(), shape.layer_params()
        t["gathered"] = Term("gathered root + one layer, and their gradients", (root + layer) * act_b
                             + (root * (4 if shape.tied else 2) + layer * 2) * 4, True)
    else:
        copy = roll_b * P if arr.rollout.dtype != "float32" else 0.0
        t["engine_weights"] = Term(f"rollout weights ({arr.rollout.dtype})", copy, True,
                                   "a copy, kept" if copy else "shares the fp32 weights")
    lean_packed = (arr.rollout.lean_decode and not on_gpu(config)
                   and model_cfg.get("model_type") in ("llama", "mistral", "qwen2", "qwen3"))
    t["packed_head"] = Term("prepacked vocabulary projection (CPU decode)",
                            shape.vocab * shape.hidden * roll_b if lean_packed else 0.0, True,
                            "" if lean_packed else "none on this device")

    rows = config.data.train_batch_size * arr.rollout.n // world
    # the largest wave the engine decodes at once: whole groups of n rows, at most max_num_seqs
    waves = group_waves([r // arr.rollout.n for r in range(rows)], arr.rollout.max_num_seqs)
    rows_at_once = max(len(wave) for wave in waves)
    positions = config.data.max_prompt_length + config.data.max_response_length
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * roll_b  # keys and values, every layer
    t["kv_cache"] = Term("KV cache", kv_per_token * rows_at_once * positions, False,
                         f"{rows_at_once} rows x {positions} positions")

    vllm = arr.rollout.name == "vllm"
    if vllm:  # vLLM's own copy and a KV cache of max_num_seqs x max_model_len, kept unless it sleeps (GPU)
        kept = not (on_gpu(config) and arr.rollout.free_cache_engine)
        when = "kept between rollouts" if kept else "released while the engine sleeps"
        t["engine_weights"] = Term(f"vLLM's weights ({arr.rollout.dtype})", roll_b * P, True, when)
        t["packed_head"] = Term("prepacked vocabulary projection (CPU decode)", 0.0, True, "native engine only")
        max_len = arr.rollout.max_model_len or positions
        kv = cpu_kv_cache_bytes(kv_per_token, arr.rollout.max_num_seqs, max_len)
        t["kv_cache"] = Term("vLLM's KV cache", kv, False,
                             f"{arr.rollout.max_num_seqs} rows x {max_len} positions, at most "
                             f"{CPU_KV_CACHE_CAP / 2**30:g} GiB, {when}"
                             + ("; on a GPU vLLM takes gpu_memory_utilization of it instead" if on_gpu(config) else ""))

    micro = min(actor.ppo_micro_batch_size_per_gpu, rows)
    tokens = micro * positions  # plain layout, an upper bound (prompt sharing lowers it)
    layer_values = 8 * shape.hidden + 4 * shape.intermediate  # kept per token by one layer for its backward
    checkpointed = arr.model.enable_gradient_checkpointing  # only the layer inputs, plus one layer recomputed
    per_token_layer = shape.hidden if checkpointed else layer_values
    recompute = layer_values * tokens if checkpointed else 0
    response_tokens = micro * config.data.max_response_length
    logits = 4 * shape.vocab * (response_tokens + 2 * min(LOGIT_CHUNK_TOKENS, response_tokens))
    t["activations"] = Term("activations (micro-batch)", (per_token_layer * shape.layers * tokens + recompute) * act_b,
                            False, f"{micro} rows x {positions} tokens, {act_dtype}")
    t["logits"] = Term("log-softmax kept for backward (fp32)", logits, False,
                       f"{response_tokens} response tokens x {shape.vocab}")

    # the offloads act only under fsdp2, and only while generation runs (hybrid._offload)
    offloaded = {"weights": sharded and fsdp_cfg.param_offload,
                 "reference": sharded and arr.ref.fsdp_config.param_offload,
                 "optimizer": sharded and fsdp_cfg.optimizer_offload}  # AdamW state exists from the first update on
    generation = [n for n in ("weights", "master", "reference", "optimizer") if not offloaded.get(n)]
    generation += ["engine_weights", "packed_head", "kv_cache"]
    update = ["weights", "master", "reference", "gradients", "optimizer", "activations", "logits"]
    if sharded:  # on a GPU the read is in host memory: the device holds only the shards
        init, update = ["weights", "reference"] + ([] if on_gpu(config) else ["init_read"]), update + ["gathered"]
    else:  # the loaded model, its reference copy and the engine's own copy, all kept
        init, update = ["weights", "reference", "engine_weights"], update + ["engine_weights"]
    if vllm:  # the engine exists from the start; kept terms stay through the update
        init = [n for n in init if n != "engine_weights"] + ["engine_weights", "kv_cache"]
        update = [n for n in update if n != "engine_weights"] + (["engine_weights", "kv_cache"] if kept else [])
    return MemoryPlan(world, P, rows, t, {"init": init, "generation": generation, "update": update})


def device_capacity(config: RLVRConfig, override_gb: float | None) -> tuple[float, str]:
    """Bytes one rank may use, and where the figure comes from."""
    if override_gb:
        return override_gb * GB, "--device-memory-gb"
    import torch

    if on_gpu(config):
        return float(torch.cuda.get_device_properties(0).total_memory), torch.cuda.get_device_name(0)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ranks = config.trainer.n_gpus_per_node  # CPU ranks of a node share its RAM
    return ram / ranks, f"this machine's RAM / {ranks} rank(s)"


def advice(plan: MemoryPlan, phase: str, config: RLVRConfig) -> str:
    """The largest term of ``phase`` and the settings that shrink it."""
    arr = config.actor_rollout_ref
    name = max(plan.phases[phase], key=lambda n: plan.terms[n].bytes)
    term = plan.terms[name]
    if name == "kv_cache":
        fix = ("lower actor_rollout_ref.rollout.max_num_seqs (rows decoded at once), actor_rollout_ref.rollout.n or "
               "data.max_response_length" + (", or set actor_rollout_ref.rollout.dtype=bfloat16"
                                             if arr.rollout.dtype == "float32" else ""))
    elif name in ("activations", "logits"):
        fix = ("lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or data.max_response_length"
               + ("" if arr.model.enable_gradient_checkpointing
                  else ", or set actor_rollout_ref.model.enable_gradient_checkpointing=true"))
    elif name in ("init_read", "engine_weights", "packed_head", "gathered"):
        fix = ("it is unsharded, so more GPUs do not shrink it: "
               + ("actor_rollout_ref.rollout.dtype=bfloat16 halves it, " if name == "engine_weights"
                  and arr.rollout.dtype == "float32" else "")
               + ("actor_rollout_ref.rollout.dtype=float32 (the engine then shares the actor's weights), "
                  if name == "engine_weights" and arr.actor.strategy == "local" else "")
               + "a device with more memory, or a smaller model")
    else:
        fix = ("more GPUs (trainer.n_gpus_per_node / trainer.nnodes with actor_rollout_ref.actor.strategy=fsdp2), "
               "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload=true, or LoRA "
               "(actor_rollout_ref.model.lora_rank)")
    return f"its largest term is {term.name} ({term.bytes / GB:.2f} GB): {fix}"


def format_plan(plan: MemoryPlan, capacity: float, source: str) -> str:
    lines = [f"memory plan per device: {plan.params / 1e9:.3f}B parameters, world size {plan.world_size}, "
             f"{plan.rows_per_rank} rows per rank", ""]
    for term in plan.terms.values():
        mark = " [full copy per rank]" if term.full_copy and term.bytes else ""
        note = f"  ({term.note})" if term.note else ""
        lines.append(f"  {term.name:<40} {term.bytes / GB:9.2f} GB{mark}{note}")
    lines.append("")
    for phase in plan.phases:
        lines.append(f"  {phase:<12} {plan.phase_bytes(phase) / GB:9.2f} GB  = {' + '.join(plan.phases[phase])}")
    lines.append(f"peak {plan.peak / GB:.2f} GB in {plan.peak_phase}; capacity {capacity / GB:.2f} GB ({source})")
    return "\n".join(lines)


def check_plan(plan: MemoryPlan, capacity: float, config: RLVRConfig) -> None:
    """Refuse a plan whose peak exceeds ``capacity`` bytes, naming the setting to change."""
    if plan.peak > capacity:
        phase = plan.peak_phase
        raise ConfigError(f"the memory plan needs {plan.peak / GB:.2f} GB per device in {phase}, over the "
                          f"{capacity / GB:.2f} GB available; {advice(plan, phase, config)}")
