"""The typed config schema: every key rlvr reads, with its default and meaning.

Key names follow verl's ``ppo_trainer.yaml`` so a verl GRPO config carries over. Defaults
live here and only here; ``grpo.yaml`` is a recipe that overrides some of them. Cross-field
checks (batch-size divisibility and friends) are in ``validate.py``.

Batch-size units follow verl: ``data.train_batch_size`` and ``actor.ppo_mini_batch_size``
count *prompts*; ``*_micro_batch_size_per_gpu`` counts *responses* (rows) per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

BUILTIN_MODEL = "builtin"


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=lambda: ["~/data/arithmetic/train.parquet"])
    """Parquet or JSONL files in verl's row format (see ``rlvr prepare``)."""
    val_files: list[str] = field(default_factory=lambda: ["~/data/arithmetic/test.parquet"])
    """Held-out files for validation."""
    prompt_key: str = "prompt"
    """Column holding the chat messages (a list of {role, content})."""
    reward_fn_key: str = "data_source"
    """Column that selects the reward function."""
    max_prompt_length: int = 256
    """Prompts longer than this (in tokens, chat template applied) are filtered or truncated."""
    max_response_length: int = 256
    """Most tokens a response may have."""
    train_batch_size: int = 8
    """Prompts per training step (each sampled ``rollout.n`` times)."""
    val_batch_size: Optional[int] = None
    """Prompts per validation batch; None means the whole validation set at once."""
    return_raw_chat: bool = False
    """Also return the un-templated messages as ``raw_prompt`` (multi-turn rollout needs them)."""
    gen_batch_size: Optional[int] = None
    """Prompts per generation batch under DAPO dynamic sampling (``algorithm.filter_groups``);
    None means train_batch_size. Only dynamic sampling may make it differ from train_batch_size."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (reproducibly, from ``seed``)."""
    seed: int = 1
    """Seed of the training sampler."""
    filter_overlong_prompts: bool = True
    """Drop rows whose templated prompt is longer than ``max_prompt_length`` (counted, reported)."""
    truncation: str = "error"
    """What to do with an over-long prompt that was not filtered: left | right | middle | error."""
    apply_chat_template: bool = True
    """Apply the tokenizer's chat template; False joins the message contents as plain text."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Variables for the chat template, as verl passes them (``{enable_thinking: false}`` for Qwen3):
    every render of the run's prompts and tool turns gets them. Each must be a variable the
    template reads (refused at load otherwise: a misspelled one would change nothing)."""


@dataclass
class ModelConfig:
    path: str = BUILTIN_MODEL
    """A local Hugging Face folder, a .gguf file, or ``builtin`` (SmolLM2-135M-Instruct)."""
    tokenizer_path: Optional[str] = None
    """Tokenizer location when it differs from ``path``."""
    trust_remote_code: bool = False
    """Allow custom modelling code from the model folder."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Values that replace entries of the model's config.json (e.g. attention dropout)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    lora_rank: int = 0
    """LoRA rank (peft); 0 trains every weight. With LoRA only the adapter trains and the
    reference policy is the same model with the adapter disabled."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: the update is B @ A * lora_alpha / lora_rank."""
    target_modules: Any = "all-linear"
    """Modules that get an adapter: all-linear (every linear layer but the vocabulary
    projection) or a list of module names (e.g. [q_proj, v_proj])."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = -1
    """Warmup steps; -1 derives them from ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup as a fraction of the total training steps."""
    warmup_style: str = "constant"
    """Schedule after warmup: constant | cosine."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of ``lr``."""


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
    """Name in the policy-loss registry (vanilla, gspo, cispo, gpg, geo_mean, sapo)."""
    tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""


@dataclass
class MixedPrecisionConfig:
    param_dtype: str = "auto"
    """dtype the sharded parameters are gathered in for forward and backward; the fp32 master
    weights and optimizer state stay fp32. auto: bfloat16 on GPUs (verl's default), float32 on
    CPUs (where bf16 matmuls are slower)."""
    reduce_dtype: str = "float32"
    """dtype gradients are reduced across ranks in."""


@dataclass
class FSDPConfig:
    """FSDP2 (``strategy=fsdp2``): each decoder layer, then the root, is a sharded unit."""

    param_offload: bool = False
    """Move the sharded parameters (and gradients) to the CPU while the model is not in use
    (GPU only: on a CPU device there is nothing to offload)."""
    optimizer_offload: bool = False
    """Move the optimizer state to the CPU between updates (GPU only)."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (ZeRO-3); False keeps them until
    the backward (ZeRO-2: more memory, one all-gather less)."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class ActorConfig:
    strategy: str = "auto"
    """local (one process, one device) | fsdp2 (sharded over the data-parallel ranks) | fsdp (verl's
    name and default for sharding: taken as fsdp2) | auto (local on one device, fsdp2 on more, as a
    verl script that sets no strategy shards). Resolved at load; the saved config says which."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (times ``rollout.n`` responses)."""
    ppo_micro_batch_size_per_gpu: int = 8
    """Responses per forward/backward on one device (gradient accumulation below the mini-batch)."""
    use_dynamic_bsz: bool = False
    """Form micro-batches by a token budget instead of a row count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of a micro-batch when ``use_dynamic_bsz``."""
    ppo_epochs: int = 1
    """Passes over each step's data."""
    shuffle: bool = True
    """Shuffle rows between mini-batches."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    max_consecutive_skipped_steps: int = 3
    """An optimizer step whose gradient norm is not finite (NaN/inf loss) is skipped; this many
    skipped in a row stop the run with an error instead of training on nothing."""
    clip_ratio: float = 0.2
    """PPO clip range epsilon."""
    clip_ratio_low: Optional[float] = None
    """Lower clip range (DAPO clip-higher); None uses ``clip_ratio``."""
    clip_ratio_high: Optional[float] = None
    """Upper clip range; None uses ``clip_ratio``."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant for negative advantages (must be > 1)."""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef`` x KL(actor || reference) to the loss (GRPO's choice)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: kl/k1, abs, mse/k2, low_var_kl/k3, and the straight-through k1+, k3+."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dtype: str = "auto"
    """Training precision: float32, or bfloat16 autocast (fp32 master weights either way). auto:
    bfloat16 on GPUs, as verl computes; float32 on CPUs, where bf16 matmuls are slower (this
    project's CPU: ~60 vs ~310 GFLOP/s)."""
    share_prompt_forward: bool = True
    """Compute each group's shared prompt once in the forward pass, and pack the rows without
    padding (exact; saves compute). False: one padded row per sample."""
    recompute_old_log_prob: bool = False
    """False: when a step's data gets exactly one optimizer step (ppo_epochs = 1 and
    ppo_mini_batch_size = train_batch_size) and nothing reads old_log_probs before the update
    (no KL in reward, no rollout IS), pi_old is the current policy, so old_log_probs are taken
    (detached) from the update's own forward instead of a separate pass, as TRL does with
    num_iterations = 1. True: always a separate pass, as verl does."""

    def get(self, key: str, default: Any = None) -> Any:
        """verl's access to its config in a policy loss (``config.get("clip_ratio_c", 3.0)``), so a loss
        copied from verl reads this config unchanged."""
        return getattr(self, key, default)


@dataclass
class RefFSDPConfig:
    param_offload: bool = False
    """Move the reference's shards to the CPU between its forward passes (GPU only)."""
    reshard_after_forward: bool = True


@dataclass
class RefConfig:
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    """The reference is sharded like the actor when ``actor.strategy=fsdp2``."""
    log_prob_micro_batch_size_per_gpu: int = 16
    """Rows per forward pass when computing reference log-probs (and the distillation teachers')."""


@dataclass
class ValKwargs:
    n: int = 1
    """Samples per validation prompt."""
    do_sample: bool = False
    """False: greedy decoding (temperature, top_p and top_k are then not used)."""
    temperature: float = 0.0
    """Sampling temperature when do_sample (must then be > 0)."""
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class GatewayConfig:
    """The ``openai_agent`` loop (``rlvr/agents/gateway.py``): the user's agent, through an
    OpenAI-compatible endpoint on the loopback, trained on the tokens it was sampled."""
    function: Optional[str] = None
    """``file.py:name`` or ``module:name`` of ``async def agent(base_url, api_key, row) -> reward | None``."""
    command: Optional[str] = None
    """A shell command run per episode: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set, the row (JSON)
    on stdin, the reward on its stdout's last line (``None``: the reward function scores it)."""
    timeout: float = 300.0
    """Seconds an episode may take; past it the agent is stopped and the episode fails."""
    max_calls: int = 32
    """Model calls an episode may make; one more fails it."""
    tool_call_parser: str = "hermes"
    """How tool calls are read from the model's text in chat responses (``rlvr serve``'s parsers)."""


@dataclass
class AgentConfig:
    """verl's ``rollout.agent`` keys: which agent loop runs each row (``rlvr/agents``)."""
    default_agent_loop: str = "single_turn_agent"
    """The loop of rows without an ``agent_name`` column value: single_turn_agent (one generation:
    the batch rollout), tool_agent (the multi-turn tool loop, ``multi_turn.enable``) or a loop
    registered with ``rlvr.agents.register`` or listed in ``agent_loop_config_path``."""
    agent_loop_config_path: Optional[str] = None
    """A YAML list of ``{name, _target_: module.Class}``: agent loops to register (verl's format)."""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)


@dataclass
class MultiTurnConfig:
    enable: bool = False
    """Run the multi-turn tool-calling loop (needs tool_config_path and data.return_raw_chat=true)."""
    tool_config_path: Optional[str] = None
    """Tools YAML in verl's format: ``tools: [{class_name, config: {type: native}, tool_schema}]``."""
    format: str = "hermes"
    """Tool-call format the model writes: hermes (``<tool_call>{json}</tool_call>``) or tag
    (``<calculator>12 * 34</calculator>``, for small models)."""
    max_assistant_turns: Optional[int] = None
    """Most assistant turns per trajectory; None: until the response budget is spent."""
    max_user_turns: Optional[int] = None
    """Most turns answered to the model per trajectory, tool results and interaction answers together
    (verl's count); None: no limit of its own."""
    interaction_config_path: Optional[str] = None
    """verl's interactions YAML (``interaction: [{name, class_name, config}]``): a user or environment
    that answers each assistant turn without a tool call, with a score per turn, for the rows whose
    ``extra_info.interaction_kwargs`` names it (``rlvr/tools/interaction.py``)."""
    schedule: str = "request"
    """request: each trajectory moves on as soon as its own tool answers, its next turn joining
    the engine's running rows at the next decode step (the native engine; others move turn by
    turn); turn: every trajectory's turn is generated together, then every turn's tool calls run,
    then the next turn (bitwise reproducible whatever the tools' latency). The agent loops'
    schedule too (``rlvr/agents/rollout.py``: per request, or rounds). rlvr's key."""
    max_parallel_calls: int = 1
    """Calls run per assistant turn; only 1 is accepted: generation stops at the first call's
    closing tag, so a sampled turn holds one call (verl's key, kept so its configs load)."""
    max_tool_response_length: int = 256
    """Characters of a tool's answer shown to the model."""
    tool_response_truncate_side: str = "middle"
    """Which part of a long tool answer is kept, as verl's tool loop reads it: left (the start),
    right (the end) or middle (both ends)."""
    tool_timeout_s: float = 30.0
    """Seconds a tool call may take before the model is told it timed out (counted from when
    the call starts: the wait for a slot of a tool that caps its calls at once is not counted)."""
    enable_tokenization_sanity_check: bool = True
    """Count trajectories whose tokens differ from the chat template applied to the final
    conversation (multi_turn/tokenization_mismatch; a metric, never a failure)."""


@dataclass
class CheckpointEngineConfig:
    """verl's checkpoint engine: the weight transfer from the actor to rollout workers of their
    own (``rlvr/distributed/weight_sync.py``). An engine in the actor's process needs none."""
    backend: str = "naive"
    """naive: the device's collective for a rollout pool (gloo on CPU, nccl on CUDA), in place
    where the engine shares the actor's process; gloo or nccl: that collective."""
    update_weights_bucket_megabytes: int = 2048
    """Tensors are broadcast packed into buckets of this size (a larger tensor alone)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """verl's options of other backends: none apply to gloo or nccl (refused unless empty)."""
    custom_backend_module: Optional[str] = None
    """verl's plug-in backends: refused unless null."""


@dataclass
class RolloutServerConfig:
    """Rollout servers (``rollout.mode=async``): verl's ``rollout.server`` keys with verl's meaning,
    and how the weights reach the servers. With ``mode=sync`` only ``timeout`` and
    ``max_start_wait_time`` are read (by served distillation teachers); the others are refused
    unless left at their defaults."""
    timeout: float = 600.0
    """Seconds one request may take; past it the request is aborted there and sent again (verl's
    default is 60 s; a CPU replica decoding a full validation batch takes longer)."""
    max_attempts: int = 3
    """Tries per request across replicas; a replica that refuses connections leaves the rotation."""
    retry_delay: float = 2.0
    """Seconds before a failed request is sent again."""
    max_connections: int = 1000
    """Connections the client keeps open to all servers together."""
    max_start_wait_time: float = 300.0
    """Seconds a server may take to answer ``/health`` (a replica rlvr starts, or an external one
    before step 1)."""
    weight_sync: str = "auto"
    """distributed: a gloo broadcast from the trainer to the servers (SGLang's
    ``/init_weights_update_group`` + ``/update_weights_from_distributed``); disk: a safetensors
    folder the trainer writes, which each server loads (SGLang's ``/update_weights_from_disk``,
    vLLM's ``reload_weights``); auto: disk for the replicas rlvr starts (this machine's files:
    twice as fast as the broadcast here) and for vllm (vLLM's weight-transfer engine is NCCL,
    GPU-only), distributed for external native and sglang servers."""
    weights_dir: Optional[str] = None
    """Where the disk route writes the weights (None: the system's temporary folder)."""
    api_key: Optional[str] = None
    """Sent to every server as ``Authorization: Bearer KEY``: for external servers started with
    ``--api-key`` (rlvr serve, vllm serve, SGLang). Replicas rlvr starts on another node of a Ray
    cluster get a key of the run's own instead (a server reachable from other machines needs one)."""


@dataclass
class RolloutConfig:
    name: str = "native"
    """Rollout engine: native (rlvr's engine over any transformers causal LM, sharing the actor's
    weights) or vllm (vLLM in each training process, its weights streamed from the actor before
    each rollout; the engine of GPU users). With ``mode=async`` it names the servers' protocol:
    native (``rlvr serve`` replicas rlvr starts), vllm (``vllm serve`` replicas) or sglang
    (SGLang's HTTP protocol, servers at ``external_server_addresses``)."""
    mode: str = "sync"
    """sync: the engine runs in the training process; async: rollout replicas are HTTP servers,
    driven request by request (``rlvr/rollout/servers.py``)."""
    external_server_addresses: list[str] = field(default_factory=list)
    """``host:port`` of servers rlvr did not start (mode=async): checked before step 1, never
    stopped. Empty: rlvr starts ``n_gpus_per_node`` local replicas of ``name``'s server. The keys
    that only build a replica's command (dtype, max_num_seqs, max_num_batched_tokens,
    max_model_len, lean_decode and vLLM's engine keys) are refused beside it."""
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)
    n: int = 4
    """Responses sampled per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (> 0). With vllm at least 0.01: vLLM raises a
    temperature in (0, 0.01) to 0.01, so a lower one is refused at load."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 or 0: off (servers are sent -1); else the number of likeliest tokens kept. Below -1 is
    refused at load."""
    min_p: float = 0.0
    do_sample: bool = True
    dtype: str = "auto"
    """Precision of generation: float32 | bfloat16. auto: bfloat16 on GPUs (verl's), float32 on
    CPUs, where the engine then shares the actor's fp32 weights (no copy)."""
    lean_decode: bool = True
    """Decode steps of Llama-family models run rlvr's lean step (same arithmetic, fewer ops, a
    prepacked vocabulary projection); false keeps the transformers forward for every step. Read by
    the native engine only (in process, and the rlvr serve replicas rlvr starts): false is refused
    with other engines and with external servers."""
    log_prob_micro_batch_size_per_gpu: int = 16
    """Rows per forward pass when computing the actor's old log-probs."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings besides the tokenizer's end tokens."""
    seed: int = 0
    """Base seed of sampling (each step derives its own)."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    """How the actor's weights reach a rollout pool of its own (hybrid_engine=false)."""
    max_num_seqs: int = 1024
    """Rows that decode at once (verl's and vLLM's name). A rank with more rows keeps the rest
    waiting: a row that ends frees its slot for the next (continuous batching; a prompt group
    waits until its rows fit, to share one prefill). This bounds the KV cache to this many rows;
    each row's tokens are the same as in one batch (its uniforms are its own)."""
    max_num_batched_tokens: Optional[int] = None
    """Tokens one engine step may process (vLLM's meaning: prefill chunks and one decode token per
    running row). None: vLLM's default; no bound for the native engine in training, 1024 in the
    ``rlvr serve`` replicas a run starts (as ``rlvr serve``'s own default)."""
    max_model_len: Optional[int] = None
    """The longest prompt + response the engine serves (vLLM's meaning: vLLM sizes its KV cache by
    it; the native engine core refuses a request whose prompt + max_new_tokens passes it). None:
    data.max_prompt_length + data.max_response_length (vLLM), no bound but the model's (native)."""
    gpu_memory_utilization: Optional[float] = None
    """vllm (in process, or the vllm serve replicas rlvr starts): the fraction of the device's memory
    the engine may take (weights + KV cache). None: 0.5 on a GPU (verl's default); on a CPU the KV
    cache is sized instead: max_num_seqs rows x max_model_len tokens, at most 1 GiB (more rows wait
    in vLLM's queue). The native engine allocates the cache of the rows it runs and refuses this
    key."""
    enforce_eager: bool = True
    """vllm: run the model eagerly (no torch.compile / CUDA graphs). On this CPU an eager engine
    starts in seconds instead of a minute; on a GPU, false captures CUDA graphs."""
    enable_prefix_caching: bool = True
    """vllm: rows that share a prompt (a GRPO group) reuse its prefill from vLLM's prefix cache, in
    whole KV blocks only: 128 tokens a block on a CPU (vLLM's CPU block size), so there prompts
    shorter than 128 tokens (the default job's arithmetic prompts, 47-49 tokens) share nothing;
    16 a block on a GPU."""
    tensor_model_parallel_size: int = 1
    """vllm: ranks one engine spans (verl's hybrid engine: vLLM's external launcher in each of k
    consecutive ranks, the group's first rank driving the rollout; docs/vllm.md). 1: each training
    rank runs its own in-process engine. vllm and sglang replicas of a pool of their own: GPUs each."""
    free_cache_engine: bool = True
    """vllm on a GPU: the engine sleeps between rollouts (vLLM's sleep mode: weights and KV cache
    released for training, weights streamed back before the next rollout). vLLM's CPU build has
    no sleep mode: there its KV cache stays allocated. The native engine always frees its cache;
    vllm serve replicas (mode=async) keep their memory: false is refused for both."""
    n_gpus_per_node: int = 1
    """Devices of the rollout's own pool when ``actor_rollout_ref.hybrid_engine=false`` (one
    rollout worker each, on one node, beside the actor's ``trainer.n_gpus_per_node``); with
    ``mode=async``, the ``rlvr serve`` replicas rlvr starts (one per device, as verl's)."""


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Actor, reference and rollout share each device and one copy of the weights. false: the
    rollout runs in workers of its own (``rollout.n_gpus_per_node`` devices, on Ray) with their
    own copy, which the actor's new weights replace after every update."""
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class CriticConfig:
    """The value model of PPO (used only with ``algorithm.adv_estimator=gae``)."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="${actor_rollout_ref.model.path}"))
    """Backbone of the value model (default: the policy's); a one-output value head is added."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: Optional[int] = None
    """Prompts per critic optimizer step; None: actor.ppo_mini_batch_size (verl's default, which
    verl's PPO scripts rely on). Resolved at load."""
    ppo_micro_batch_size_per_gpu: int = 8
    ppo_epochs: Optional[int] = None
    """Passes over each step's data; None: actor.ppo_epochs (verl's default). Resolved at load."""
    cliprange_value: float = 0.5
    """Clip range of the value loss."""
    grad_clip: float = 1.0


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """Python file that defines the reward function (checked at load: it exists, parses and defines ``name``)."""
    name: str = "compute_score"
    """Function name inside ``path``; called as verl calls it, by keyword: ``name(data_source=...,
    solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the function (verl's ``custom_reward_function.reward_kwargs``)."""


@dataclass
class RewardFunctionEntry:
    name: str = ""
    """A built-in scorer name (arithmetic, countdown, gsm8k, math, format, ...)."""
    weight: float = 1.0


@dataclass
class RewardModelConfig:
    enable: bool = False
    """Score with a sequence-classification model from ``path`` (verl's ``reward_model.enable``): each
    sample's score is then the model's, as verl's reward managers return it; the rule scorer still runs,
    its values (``acc``, extras) logged, not trained on."""
    path: Optional[str] = None
    """A local folder of a ``*ForSequenceClassification`` model with a ``score`` head (Llama, Qwen2, ...)."""
    micro_batch_size_per_gpu: int = 8
    """Conversations per forward pass of the reward model (>= 1)."""
    weight: float = 1.0
    """rlvr's: the model's score is multiplied by this (1.0: verl's score)."""
    add_rule_scores: bool = False
    """rlvr's: true scores rule score + weight x the model's score (and the overlong penalty, when on);
    false (verl's) trains on weight x the model's score alone."""


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping: a linear penalty over the last ``len`` tokens before
    ``data.max_response_length``, reaching -``penalty_factor`` at the limit."""

    enable: bool = False
    len: int = 16
    """Tokens before max_response_length where the penalty starts."""
    penalty_factor: float = 1.0
    """The penalty at max_response_length."""


@dataclass
class RewardConfig:
    functions: list[RewardFunctionEntry] = field(default_factory=list)
    """Weighted reward functions; empty means one scorer chosen by each row's data_source."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    num_workers: int = 0
    """Processes that score in parallel (>= 0); 0 scores in the trainer process."""
    timeout_s: Optional[float] = 10.0
    """Per-sample scoring time limit in seconds (> 0); null means no limit, inline and in the pool."""
    on_error: str = "score"
    """A scorer that raises or times out: score (give failure_score, count it) | raise."""
    on_invalid: str = "drop"
    """A scorer that returns NaN, inf or None: drop (count it; its group is left out of the
    update, never given a score) | raise."""
    failure_score: float = 0.0
    """The score of a sample whose function raised or timed out (trained on; within ±1.8e19, as scores)."""
    max_failed_fraction: float = 0.99
    """The run stops with the first failure when more than this fraction of a batch's samples
    failed to score (a step where every reward failed would train on failure scores only);
    1.0 never stops."""
    launch_reward_fn_async: bool = False
    """Score while the log-prob passes run."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    val_functions: list[RewardFunctionEntry] = field(default_factory=list)
    """Weighted functions that score validation (e.g. correctness alone, for an accuracy);
    empty means the training functions. Validation never gets the overlong penalty."""


@dataclass
class KLControlConfig:
    type: str = "fixed"
    """fixed | adaptive."""
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: groups whose responses all score the same carry no GRPO signal."""

    enable: bool = False
    """Drop such groups and generate further batches (of data.gen_batch_size prompts) until
    data.train_batch_size groups remain; the surplus of the last batch is left out."""
    metric: str = "acc"
    """What must vary within a group: acc (the scorer's reported acc, else its score), score (the
    scorer's score before overlong shaping) or seq_reward (the sequence's token_level_scores)."""
    max_num_gen_batches: int = 10
    """Generation batches one step may use before the run stops with an error; <= 0: no limit."""


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction``: correct for pi_rollout != pi_old (another numeric
    path, or older weights in async training)."""
    rollout_is: Optional[str] = None
    """Importance weights pi_old / pi_rollout in the policy loss: null (none), token, sequence,
    or geometric (rlvr's: exp of the mean log ratio per sequence)."""
    rollout_is_threshold: Any = 2.0
    """A number truncates the weights there (TIS); "lower_upper" ("0.5_2.0") zeroes the
    weights outside (IcePop)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (per token, or per sequence)."""
    rollout_rs: Optional[str] = None
    """Rejection: comma-separated token_k{1,2,3}, seq_sum_k{1,2,3}, seq_mean_k{1,2,3},
    seq_max_k{2,3}; a token or sequence past its threshold leaves the loss."""
    rollout_rs_threshold: Any = None
    """One value shared by every rollout_rs option, or one per option (comma-separated); k1
    options take "lower_upper" ratios (or an upper ratio, lower = 1 / upper)."""
    bypass_mode: bool = False
    """pi_old is the rollout's log-probs (no old-log-prob pass); weights and rejection then
    compare the policy being trained with the rollout's."""
    loss_type: str = "ppo_clip"
    """With bypass_mode: ppo_clip (the policy loss, its ratio against pi_rollout) or reinforce
    (-A * w * log pi)."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    """Advantage estimator: gae, grpo, grpo_passk, rloo, opo, reinforce_plus_plus, remax, ..."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group std (GRPO); False gives Dr.GRPO."""
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the token rewards (PPO-style) instead of a KL loss."""
    kl_penalty: str = "kl"
    """KL estimator used in the reward."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights, rejection and bypass for samples pi_old did not generate
    (``rlvr/algos/rollout_correction.py``); rlvr's older ``algorithm.rollout_is*`` keys map here."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class ColocateAsyncConfig:
    num_warmup_batches: int = 1
    """How many batches the rollout generates ahead of the update: batch g is generated by the
    weights after update max(0, g - 1 - num_warmup_batches). 1 is one-step-off (batch g+1 is
    generated while update g runs, by the weights before it; step 1 is on-policy); 0 is the
    synchronous trainer, through the async machinery."""


@dataclass
class OffPolicySamplerConfig:
    max_off_policy_threshold: int = 8
    """The most weight versions a trained sample may span: span = training step - dispatch step + 1
    (a synchronous sample spans 1, one-step-off 2), as verl's ``trainer.v1.sampler``."""
    max_off_policy_strategy: str = "drop"
    """drop | wait: what verl does with a group past the threshold. rlvr's schedule is fixed (the
    version that generates a batch is a function of its step), so no group ever passes it: a
    threshold below num_warmup_batches + 1 is refused at load instead."""


@dataclass
class TrainerV1Config:
    """verl's ``trainer.v1`` trainer modes, on rlvr's one mechanism (``rlvr.trainer.rollout_ahead``)."""
    trainer_mode: str = "sync"
    """sync | colocate_async | separate_async. sync: each step generates its own batch with the
    weights it updates (the hybrid engine). colocate_async: a rollout engine with its own copy
    of the weights in the trainer's process generates ``colocate_async.num_warmup_batches``
    batches ahead, in a thread, while the actor updates. separate_async: the same schedule on a
    rollout worker group of its own (``actor_rollout_ref.hybrid_engine=false``, Ray)."""
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)
    sampler: OffPolicySamplerConfig = field(default_factory=OffPolicySamplerConfig)


@dataclass
class TrainerConfig:
    project_name: str = "rlvr"
    experiment_name: str = "arithmetic_grpo"
    total_epochs: int = 30
    """Passes over the training set (verl's default); the run ends at the first of this and
    ``total_training_steps``."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps, or after ``total_epochs`` epochs if that comes first (as in
    verl); None: ``total_epochs`` epochs."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Tracking backends: console, jsonl, tensorboard, wandb."""
    save_freq: int = -1
    """Save a checkpoint every this many steps and at the last step (-1: never; Ctrl-C still saves)."""
    test_freq: int = -1
    """Validate every this many steps and at the last step (-1: never, as in verl)."""
    val_before_train: bool = True
    resume_mode: str = "auto"
    """auto | disable | a checkpoint path."""
    default_local_dir: str = "runs/${trainer.project_name}/${trainer.experiment_name}"
    """The run directory: config, metrics, rollout dumps, checkpoints, plots."""
    max_actor_ckpt_to_keep: Optional[int] = None
    rollout_data_dir: Optional[str] = "${trainer.default_local_dir}/rollouts"
    """Dump prompts, responses, scores and advantages per step as JSONL here (null: no dumps)."""
    nnodes: int = 1
    n_gpus_per_node: int = 1
    """Devices per node (on a CPU machine: 1)."""
    device: str = "auto"
    """auto (cuda when available, else cpu) | cpu | cuda."""
    seed: int = 1
    freshness_check_freq: int = 10
    """At steps 1, 2 and every this many steps, the rollout engine's greedy tokens for the training
    data's first prompts must be the actor's own greedy tokens, else the run stops: an engine
    holding stale weights (verl #7495). Every step the engine's log-probs of its samples must stay
    near the actor's (trainer/guards.py, EngineParity). -1: none of these checks."""
    v1: TrainerV1Config = field(default_factory=TrainerV1Config)
    """Async training: generation ahead of the update (verl's trainer modes)."""


@dataclass
class RayInitConfig:
    address: Optional[str] = None
    """An existing Ray cluster (``auto``, or ``ray://host:10001``); None starts a local Ray on
    127.0.0.1 for the run."""
    num_cpus: Optional[int] = None
    """CPUs of the local Ray (None: all of this machine's)."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray's runtime environment for the run (``env_vars``, ``working_dir``, ``pip``, ...), passed to
    ``ray.init`` as verl passes it; every worker inherits it (their own ``env_vars`` added)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Other keyword arguments of ``ray.init`` (``num_gpus``, ``namespace``, ``object_store_memory``, ...):
    verl's ``ray_kwargs.ray_init.<name>`` keys land here at load and reach ``ray.init`` unchanged."""


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)


@dataclass
class DistillationLossConfig:
    """verl's ``distillation.distillation_loss``: the per-token term of on-policy distillation
    (``rlvr/algos/distillation.py``)."""
    loss_mode: str = "k3"
    """How each sampled token's gap to the teacher becomes a loss: an estimator of the reverse KL
    from the two log-probs of the sampled token (k1 = kl, abs, k2 = mse, k3 = low_var_kl), or
    forward_kl_topk (the forward KL over the teacher's ``topk`` most likely tokens)."""
    topk: Optional[int] = 32
    """Teacher tokens per position that forward_kl_topk sums over (and the top-k share metric)."""
    use_task_rewards: bool = True
    """Add the distillation term to the task's policy loss (GRPO on the reward); False trains on the
    distillation term alone."""
    distillation_loss_coef: float = 1.0
    """Weight of the distillation term beside the task loss (1 when ``use_task_rewards`` is False)."""
    loss_max_clamp: Optional[float] = None
    """Clamp each token's distillation loss to [-c, c] (None: no clamp)."""
    log_prob_min_clamp: Optional[float] = None
    """forward_kl_topk: clamp the student's and the teacher's top-k log-probs from below (None: none)."""
    use_policy_gradient: bool = False
    """True: the negated per-token loss is a per-token advantage in a PPO clipped update (verl's PG
    OPD; k1 then rewards log teacher - log student); False: the loss is differentiated directly."""
    policy_loss_mode: str = "vanilla"
    """The PPO loss of ``use_policy_gradient`` (verl implements vanilla only, as does rlvr)."""
    clip_ratio: float = 0.2
    """``use_policy_gradient``: the clip range where clip_ratio_low/high are unset."""
    clip_ratio_low: Optional[float] = None
    """None: clip_ratio (verl's YAML sets 0.2 here, where its clip_ratio alone then changes nothing)."""
    clip_ratio_high: Optional[float] = None


@dataclass
class TeacherInferenceConfig:
    """verl's ``teacher_models.<name>.inference`` (a rollout config): rlvr reads where the teacher is
    served; the rest of verl's server settings load with a notice."""
    external_server_addresses: list[str] = field(default_factory=list)
    """``host:port`` of servers already holding the teacher; empty: the teacher is a frozen model
    in the actor's workers."""
    name: str = "sglang"
    """The servers' protocol: sglang (SGLang's ``/generate`` prompt log-probs; ``rlvr serve`` speaks
    it) or vllm (``vllm serve``'s ``/v1/completions`` with ``prompt_logprobs``)."""
    api_key: Optional[str] = None
    """Sent as ``Authorization: Bearer KEY`` to servers started with ``--api-key``."""


@dataclass
class TeacherModelConfig:
    """One teacher of ``distillation.teacher_models``."""
    key: Optional[str] = None
    """The value of the row's ``distillation.teacher_key`` column that routes the row to this teacher
    (several teachers); one teacher takes every row."""
    model_path: Optional[str] = None
    """The teacher: a Hugging Face folder, a .gguf file, ``builtin``, or a run's checkpoint. Its
    tokenizer must be the student's (cross-tokenizer distillation is not supported)."""
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)
    """Where the teacher runs (verl: a rollout config for the teacher's servers)."""


@dataclass
class DistillationConfig:
    """On-policy distillation (verl's ``distillation``): a frozen teacher scores every token the
    student sampled; the student minimises a per-token divergence to it, alone or beside the task
    reward (docs/distillation.md)."""
    enabled: bool = False
    teacher_key: str = "data_source"
    """The row column that routes each row to a teacher's ``key`` when there are several."""
    teacher_models: dict[str, TeacherModelConfig] = field(default_factory=lambda: {"teacher_model": TeacherModelConfig()})
    """The teachers by name; verl's single-teacher entry is ``teacher_model``."""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)


@dataclass
class RLVRConfig:
    custom_modules: list[str] = field(default_factory=list)
    """Python files (or importable module names) imported before the config is validated, so
    the advantage estimators, policy losses and reward functions they register can be named
    (``@register_adv_est("mine")`` then ``algorithm.adv_estimator=mine``)."""
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """Ray, used when the run has more than one device (n_gpus_per_node x nnodes > 1) or
    ``ray_init.address`` is set."""
