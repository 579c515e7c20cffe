"""verl's config keys that are not rlvr schema keys: what each one means to rlvr.

Every key of verl's generated trainer config (``verl/trainer/config/_generated_ppo_trainer.yaml``;
its key list is test data, ``tests/config/verl_generated_keys.txt``) is one of:

- a schema key rlvr reads (``rlvr/config/schema.py``);
- ``VERL_ALIASES``: verl's spelling of a key rlvr reads, moved onto rlvr's key at load (verl's
  ``reward_model.enable`` is rlvr's ``reward.reward_model.enable``);
- ``VERL_NO_EFFECT``: a key with no effect in rlvr's design, accepted with one notice, as long as
  its value asks for nothing rlvr would not do; a value that would need the feature is refused
  with the reason and the value to use;
- ``VERL_RENAMED``: refused with the rlvr key to use instead;
- ``VERL_READ_AT_LOAD``: read with verl's meaning where it depends on other keys (verl's global
  micro-batch sizes, divided by the devices; ``trainer.resume_from_path``), once every layer is merged;
- ``VERL_MEGATRON`` and ``VERL_MULTIMODAL``: refused, each group with its one reason (verl's
  Megatron-LM backend; image and video inputs), whatever the value.

Keys are dotted; a ``*`` in a ``VERL_NO_EFFECT`` key matches any part of a key (``*._target_``:
Hydra's instantiation targets in every section). An exact key wins over a pattern; a section's
entry covers its sub-keys. ``ray_kwargs.ray_init.*`` is not here: rlvr passes it to ``ray.init``.
"""

from __future__ import annotations

_FSDP = "activation offload is not implemented; actor_rollout_ref.model.enable_gradient_checkpointing saves activations"
_EAGER = "rlvr's training forward runs eagerly (no torch.compile)"
_CHUNKED = "the vocabulary projection already runs only where a response token is predicted, in chunks"
_PROFILER = "rlvr has no profiler hooks (verl profiles only the steps listed in global_profiler.steps)"
_SP = ("sequence parallelism (Ulysses) is not implemented: each device holds whole sequences; bound a "
       "micro-batch's tokens with actor_rollout_ref.actor.use_dynamic_bsz and ppo_max_token_len_per_gpu")
_CRITIC_FSDP = ("the critic is sharded like the actor (actor.strategy, its mixed precision) and never offloaded; "
                "its own FSDP settings are not read")
_VERL_COPY = "verl's copy of another key, filled in by verl itself; rlvr reads the original"
_RM_SERVER = ("rlvr scores with the reward model as a transformers sequence classifier in the trainer "
              "(reward.reward_model); verl's reward-model server and worker settings do not apply")
TEXT_ONLY = "rlvr trains text models: no image or video inputs reach the model or the rollout engine"
_ONE_MANAGER = ("rlvr has one reward manager: the scorer of each row's data_source (or reward.functions, "
                "reward.custom_reward_function), plus DAPO's reward.overlong_buffer when enabled")

# verl key (or section) -> (why it has no effect in rlvr, the values that are harmless or None for any)
_TEACHER_POOL = ("rlvr's distillation teachers are frozen models on the actor's devices (sharded like the reference "
                 "under fsdp2), or servers at teacher_models.<name>.inference.external_server_addresses; verl's pool "
                 "and server settings for them do not apply")

VERL_NO_EFFECT: dict[str, tuple[str, tuple | None]] = {
    # on-policy distillation: verl's teacher pool and servers
    "distillation.n_gpus_per_node": (_TEACHER_POOL, None),
    "distillation.nnodes": (_TEACHER_POOL, None),
    "distillation.teacher_models.*.num_replicas": (_TEACHER_POOL, None),
    "distillation.teacher_models.*.inference.*": (_TEACHER_POOL, None),
    "distillation.distillation_loss.use_chunked_topk": (
        "rlvr's vocabulary projection always runs in chunks of the response tokens", None),
    "distillation.distillation_loss.chunked_topk_chunk_size": (
        "rlvr's vocabulary projection always runs in chunks of the response tokens", None),
    # Hydra and verl's config plumbing
    "*._target_": ("Hydra's instantiation target of verl's config classes", None),
    "*.rollout_n": (_VERL_COPY + " (actor_rollout_ref.rollout.n)", None),
    "*.profiler": (_PROFILER, None),
    "global_profiler.steps": (_PROFILER, (None, [])),
    "global_profiler.*": (_PROFILER, None),
    # model
    "actor_rollout_ref.model.use_remove_padding": (
        "rlvr trims each micro-batch to its own longest sequence and packs each group around one prompt "
        "(actor.share_prompt_forward), with no separate padding-removal switch", None),
    "actor_rollout_ref.model.use_fused_kernels": (_CHUNKED, None),
    "actor_rollout_ref.model.fused_kernel_options": (_CHUNKED, None),
    "actor_rollout_ref.model.use_liger": ("rlvr uses the transformers modelling code as is", None),
    "actor_rollout_ref.model.enable_activation_offload": (_FSDP, (False,)),
    "*.use_shm": ("models and data are read from their folders (no shared-memory copy)", None),
    "actor_rollout_ref.model.hf_config_path": ("the model's config.json is read from model.path", (None,)),
    "actor_rollout_ref.model.custom_chat_template": (
        "the tokenizer's own chat template is applied; give a tokenizer folder with the template you want as "
        "actor_rollout_ref.model.tokenizer_path", (None,)),
    "*.external_lib": ("list the module in custom_modules: rlvr imports it in every process", (None,)),
    "actor_rollout_ref.model.exclude_modules": ("LoRA adapts actor_rollout_ref.model.target_modules; name the "
                                                "modules to adapt there", (None,)),
    "actor_rollout_ref.model.lora_adapter_path": ("starting from a saved LoRA adapter is not implemented; merge it "
                                                  "into the model (rlvr export) and train that", (None,)),
    "*.tiled_mlp.enabled": ("tiled MLP is not implemented", (False,)),
    "*.tiled_mlp.num_shards": ("tiled MLP is not implemented", None),
    "actor_rollout_ref.model.mtp.enable": ("multi-token prediction is not implemented", (False,)),
    "actor_rollout_ref.model.mtp.*": ("multi-token prediction is not implemented", None),
    "actor_rollout_ref.rollout.mtp": ("multi-token prediction is not implemented", None),
    "actor_rollout_ref.nccl_timeout": ("torch's default collective timeout applies", None),
    # optimizer
    "*.optim.optimizer": ("rlvr's optimizer is torch's AdamW", ("AdamW", "adamw")),
    "*.optim.optimizer_impl": ("rlvr's optimizer is torch's AdamW", ("torch.optim",)),
    "*.optim.total_training_steps": ("the schedule spans the run (trainer.total_training_steps, or the epochs)", None),
    "actor_rollout_ref.actor.optim.clip_grad": ("the actor's gradient norm is clipped at "
                                                "actor_rollout_ref.actor.grad_clip; set that", (1.0,)),
    "critic.optim.clip_grad": ("the critic's gradient norm is clipped at critic.grad_clip; set that", (1.0,)),
    "*.optim.num_cycles": ("rlvr's cosine schedule decays over half a cycle, to min_lr_ratio", (0.5,)),
    "*.optim.override_optimizer_config": ("rlvr builds AdamW from optim.lr, weight_decay and betas", (None, {})),
    # FSDP engine
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": ("FSDP2 shards each decoder layer, then the root", None),
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": ("FSDP2 shards each decoder layer, then the root", None),
    "*.fsdp_config.fsdp_size": (
        "rlvr shards over all data-parallel ranks (verl's fsdp_size shards within groups of that many and "
        "replicates across them): the same update, with at most verl's memory per device", None),
    "*.fsdp_config.forward_prefetch": ("FSDP2 prefetches the next layer by default", None),
    "*.fsdp_config.offload_policy": (
        "offload is between phases (fsdp_config.param_offload, optimizer_offload), not inside a step", (False,)),
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": ("the reference has no optimizer", None),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": (
        "buffers (rotary frequencies, norms' statistics) stay float32, verl's default buffer_dtype: rlvr loads "
        "the model in float32 and FSDP2's mixed precision casts parameters only", ("fp32", "float32", "32", 32)),
    "*.fsdp_config.model_dtype": ("master weights are float32", ("fp32", "float32")),
    "*.fsdp_config.use_orig_params": ("FSDP2 shards the original parameters (no flat parameters)", None),
    "*.fsdp_config.seed": ("every random stream is seeded from trainer.seed", None),
    "*.fsdp_config.full_determinism": ("rlvr has no switch to torch's deterministic algorithms", (False,)),
    "*.fsdp_config.ulysses_sequence_parallel_size": (_SP, (1,)),
    "*.fsdp_config.entropy_from_logits_with_chunking": (_CHUNKED, None),
    "*.fsdp_config.use_torch_compile": (_EAGER, None),
    "*.fsdp_config.entropy_checkpointing": (_CHUNKED, None),
    "*.fsdp_config.forward_only": ("verl sets it per role; the reference only ever runs forward", None),
    "*.fsdp_config.strategy": ("every model is sharded as actor_rollout_ref.actor.strategy says", ("fsdp", "fsdp2")),
    "*.fsdp_config.dtype": ("compute precision is actor_rollout_ref.actor.dtype (auto: bfloat16 on GPUs, "
                            "verl's); set that", ("bfloat16", "bf16")),
    # the critic's engine config: critic.model.fsdp_config, and critic.fsdp in verl's newer layout
    "critic.model.fsdp_config.param_offload": (_CRITIC_FSDP, (False,)),
    "critic.model.fsdp_config.optimizer_offload": (_CRITIC_FSDP, (False,)),
    "critic.model.fsdp_config.*": (_CRITIC_FSDP, None),
    "critic.fsdp.param_offload": (_CRITIC_FSDP, (False,)),
    "critic.fsdp.optimizer_offload": (_CRITIC_FSDP, (False,)),
    "critic.fsdp.*": (_CRITIC_FSDP, None),
    # actor
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": (_SP, (1,)),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (_SP, (1,)),
    "critic.ulysses_sequence_parallel_size": (_SP, (1,)),
    "actor_rollout_ref.actor.checkpoint": ("a checkpoint always holds the model, optimizer, scheduler and RNG", None),
    "critic.checkpoint": ("a checkpoint always holds the model, optimizer, scheduler and RNG", None),
    "*.use_torch_compile": (_EAGER, None),
    "*.entropy_from_logits_with_chunking": (_CHUNKED, None),
    "*.entropy_checkpointing": (_CHUNKED, None),
    "actor_rollout_ref.actor.use_fused_kernels": (_CHUNKED, None),
    "actor_rollout_ref.actor.use_remove_padding": ("rlvr packs each group around one prompt, with no separate "
                                                   "padding-removal switch", None),
    "actor_rollout_ref.actor.freeze_vision_tower": (TEXT_ONLY + " (there is no vision tower)", (False,)),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": ("read only by verl's clip_cov and kl_cov losses, which "
                                                          "rlvr does not register", None),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": ("read only by verl's clip_cov loss, not registered", None),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": ("read only by verl's clip_cov loss, not registered", None),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": ("read only by verl's kl_cov loss, not registered", None),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": ("read only by verl's kl_cov loss, not registered", None),
    "actor_rollout_ref.actor.loss_scale_factor": ("the loss is normalised by actor.loss_agg_mode alone", (None,)),
    "actor_rollout_ref.actor.calculate_entropy": ("the entropy is computed where it is logged or in the loss", None),
    "actor_rollout_ref.actor.use_prefix_grouper": (
        "rlvr computes each group's shared prompt once in the forward (actor.share_prompt_forward)", None),
    "actor_rollout_ref.actor.data_loader_seed": ("mini-batch shuffling is seeded from trainer.seed", None),
    "*.router_replay.mode": ("MoE router replay is not implemented", ("disabled",)),
    "*.router_replay.record_file": ("MoE router replay is not implemented", (None,)),
    "*.router_replay.replay_file": ("MoE router replay is not implemented", (None,)),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": ("not implemented", (False,)),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": ("not implemented", None),
    # critic
    "critic.model.use_remove_padding": ("the critic packs each group around one prompt, with no separate "
                                        "padding-removal switch", None),
    "critic.model.enable_activation_offload": (_FSDP, (False,)),
    "critic.use_dynamic_bsz": ("the critic's micro-batches are critic.ppo_micro_batch_size_per_gpu rows, packed "
                               "around each prompt; the update does not depend on the split", None),
    "critic.ppo_max_token_len_per_gpu": ("the critic's micro-batches are critic.ppo_micro_batch_size_per_gpu rows, "
                                         "packed around each prompt; the update does not depend on the split", None),
    "critic.forward_max_token_len_per_gpu": ("the critic's value passes use critic.ppo_micro_batch_size_per_gpu "
                                             "rows", None),
    "critic.forward_micro_batch_size": ("the critic's value passes use critic.ppo_micro_batch_size_per_gpu rows",
                                        None),
    "critic.forward_micro_batch_size_per_gpu": ("the critic's value passes use critic.ppo_micro_batch_size_per_gpu "
                                                "rows", None),
    "critic.strategy": ("the critic is sharded as actor_rollout_ref.actor.strategy says", None),
    "critic.enable": ("rlvr uses a critic exactly when algorithm.adv_estimator=gae", (None,)),
    "critic.shuffle": ("the critic's mini-batches follow actor_rollout_ref.actor.shuffle", None),
    "critic.data_loader_seed": ("mini-batch shuffling is seeded from trainer.seed", None),
    "critic.loss_agg_mode": ("the value loss is aggregated as actor_rollout_ref.actor.loss_agg_mode (verl's default "
                             "for it)", None),
    "actor_rollout_ref.ref.strategy": ("the reference is sharded as actor_rollout_ref.actor.strategy says", None),
    # rollout
    "actor_rollout_ref.rollout.load_format": ("the native engine uses the actor's weights in place; vLLM starts "
                                              "empty (dummy) and gets them streamed before each rollout", None),
    "actor_rollout_ref.rollout.enable_chunked_prefill": (
        "rlvr decides it: on a GPU vLLM chunks prefills by max_num_batched_tokens (its V1 engine's default); "
        "on a CPU rlvr turns chunked prefill off and prefills each prompt whole (vLLM's CPU build fails a seeded "
        "request whose prompt it splits), in process and on the vllm serve replicas it starts; the native engine "
        "prefills a wave at once", None),
    "actor_rollout_ref.rollout.calculate_log_probs": (
        "both engines always return the sampled tokens' log-probs (rollout_log_probs)", None),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": ("log-prob passes follow actor.use_dynamic_bsz", None),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": (
        "log-prob passes follow actor.ppo_max_token_len_per_gpu", None),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": ("log-prob passes follow actor.use_dynamic_bsz", None),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": (
        "log-prob passes follow actor.ppo_max_token_len_per_gpu", None),
    "actor_rollout_ref.rollout.prompt_length": ("the engine's prompt budget is data.max_prompt_length", None),
    "actor_rollout_ref.rollout.response_length": ("the engine's response budget is data.max_response_length", None),
    "actor_rollout_ref.rollout.ignore_eos": ("generation stops at the tokenizer's end tokens", (False,)),
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": ("vLLM captures its own CUDA-graph sizes "
                                                          "(with enforce_eager=false)", None),
    "actor_rollout_ref.rollout.data_parallel_size": ("each training rank runs its own engine", (1,)),
    "actor_rollout_ref.rollout.expert_parallel_size": ("expert parallelism is not implemented", (1,)),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": ("pipeline parallelism is not implemented", (1,)),
    "actor_rollout_ref.rollout.logprobs_mode": (
        "both engines return the log-probs of the distribution sampled from, temperature applied (verl's "
        "processed_logprobs)", ("processed_logprobs",)),
    "actor_rollout_ref.rollout.scheduling_policy": ("requests are served first come, first served", ("fcfs",)),
    "actor_rollout_ref.rollout.disable_log_stats": ("rlvr logs its own generation metrics", None),
    "actor_rollout_ref.rollout.over_sample_rate": (
        "verl declares it (abort the slowest requests) but no verl code reads it at b178a3cd; rlvr waits for "
        "every row of the batch", None),
    "actor_rollout_ref.rollout.sglang_rollout_mode": (
        "verl dropped it: no verl code reads it at b178a3cd (one of its example YAMLs still sets it)", None),
    "actor_rollout_ref.rollout.multi_stage_wake_up": (
        "rlvr's vLLM always wakes in two stages (its weights, then the KV cache once the actor has moved off)", None),
    "actor_rollout_ref.rollout.engine_kwargs.vllm": (
        "rlvr builds vLLM's arguments from the rollout keys it reads (max_num_seqs, max_num_batched_tokens, "
        "gpu_memory_utilization, enforce_eager, enable_prefix_caching, ...); set those", (None, {})),
    "actor_rollout_ref.rollout.engine_kwargs.sglang": ("the sglang engine is not available", (None, {})),
    "actor_rollout_ref.rollout.engine_kwargs.trtllm": ("the TensorRT-LLM engine is not available", (None, {})),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": (
        "the trajectory keeps the tokens the model generated (the training template)", (False,)),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": (
        "rlvr counts mismatches (multi_turn/tokenization_mismatch) and never fails on them; "
        "multi_turn.enable_tokenization_sanity_check=false turns the count off", None),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": ("each prompt is sampled rollout.n times", (None,)),
    "actor_rollout_ref.rollout.agent.num_workers": ("agent loops run as coroutines of one event loop in each "
                                                    "rollout worker's process", None),
    "actor_rollout_ref.rollout.agent.custom_async_server": ("custom rollout servers are not implemented", None),
    "actor_rollout_ref.rollout.agent.custom_async_server.path": ("custom rollout servers are not implemented",
                                                                 (None,)),
    "actor_rollout_ref.rollout.agent.custom_async_server.name": ("custom rollout servers are not implemented", None),
    "actor_rollout_ref.rollout.trace.backend": ("rollout tracing is not implemented; trainer.rollout_data_dir dumps "
                                                "every step's samples", (None,)),
    "actor_rollout_ref.rollout.trace.*": ("rollout tracing is not implemented", None),
    "actor_rollout_ref.rollout.skip_rollout": ("every step generates", (False,)),
    "actor_rollout_ref.rollout.skip_dump_dir": ("every step generates", None),
    "actor_rollout_ref.rollout.skip_tokenizer_init": ("the engine shares the actor's tokenizer", None),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": ("MoE router replay is not implemented", (False,)),
    "actor_rollout_ref.rollout.prometheus.enable": ("no Prometheus endpoint is served", (False,)),
    "actor_rollout_ref.rollout.prometheus.*": ("no Prometheus endpoint is served", None),
    "actor_rollout_ref.rollout.quantization": ("quantized rollout is not implemented", (None,)),
    "actor_rollout_ref.rollout.quantization_config_file": ("quantized rollout is not implemented", (None,)),
    "actor_rollout_ref.rollout.layered_summon": (
        "the weights reach vLLM one tensor at a time (a LoRA actor's merged ones too), never a whole gathered model",
        None),
    # data
    "data.train_max_samples": ("every row of data.train_files is used; write a smaller file", (-1, None)),
    "data.val_max_samples": ("every row of data.val_files is used; write a smaller file", (-1, None)),
    "data.tool_config_path": (_VERL_COPY + " (actor_rollout_ref.rollout.multi_turn.tool_config_path)", None),
    "data.return_raw_input_ids": ("the reward model re-tokenises the decoded text itself", None),
    "data.return_full_prompt": ("the full prompt is not needed by any rlvr component", None),
    "data.dataloader_num_workers": ("rows are tokenised once at load, in the trainer process", None),
    "data.filter_overlong_prompts_workers": ("rows are tokenised once at load, in the trainer process", None),
    "data.return_multi_modal_inputs": (TEXT_ONLY, None),
    "data.validation_shuffle": ("validation runs over the rows in file order", (False,)),
    "data.trust_remote_code": ("the tokenizer is loaded with actor_rollout_ref.model.trust_remote_code", None),
    "data.custom_cls.path": ("custom dataset classes are not implemented; write rows in verl's format "
                             "(rlvr prepare)", (None,)),
    "data.custom_cls.name": ("custom dataset classes are not implemented", None),
    "data.sampler.class_path": ("custom samplers (curricula) are not implemented; data.shuffle", (None,)),
    "data.sampler.class_name": ("custom samplers are not implemented", None),
    "data.datagen.path": ("dynamic data generation is not implemented", (None,)),
    "data.datagen.name": ("dynamic data generation is not implemented", None),
    # verl's reward manager and reward-model worker sections
    "reward_manager.source": (_ONE_MANAGER, ("register",)),
    "reward_manager.name": (_ONE_MANAGER, ("naive", "dapo")),
    "reward_manager.module.path": (_ONE_MANAGER + "; a custom scorer is reward.custom_reward_function", (None,)),
    "reward_manager.module.name": (_ONE_MANAGER, None),
    "reward_model.reward_manager": (_ONE_MANAGER, ("naive", "dapo")),
    "reward_model.reward_loop_source": (_ONE_MANAGER, ("register",)),
    "reward_model.reward_loop_module_path": (_ONE_MANAGER + "; a custom scorer is reward.custom_reward_function",
                                             (None,)),
    "reward_model.reward_loop_class_name": (_ONE_MANAGER, (None,)),
    "reward_model.use_reward_loop": (_ONE_MANAGER, None),
    "reward_model.num_workers": (_RM_SERVER + "; parallel rule scoring is reward.num_workers", None),
    "reward_model.enable_resource_pool": (_RM_SERVER, (False,)),
    "reward_model.n_gpus_per_node": (_RM_SERVER, None),
    "reward_model.nnodes": (_RM_SERVER, None),
    "reward_model.strategy": (_RM_SERVER, None),
    "reward_model.rollout": (_RM_SERVER, None),
    "reward_model.model.input_tokenizer": (
        "the reward model decodes the policy's tokens and re-encodes them with its own tokenizer and chat template, "
        "as verl does when the tokenizers differ", None),
    "reward_model.model.trust_remote_code": ("the reward model is loaded without remote code", (False,)),
    "reward_model.model.override_config": ("the reward model's config.json is used as is", (None, {})),
    "reward_model.model.use_remove_padding": (_RM_SERVER, None),
    "reward_model.model.use_fused_kernels": (_RM_SERVER, None),
    "reward_model.model.fsdp_config": (_RM_SERVER, None),
    "reward_model.max_length": ("the reward model scores the whole prompt and response", (None,)),
    "reward_model.use_dynamic_bsz": (_RM_SERVER + "; its batches are reward.reward_model.micro_batch_size_per_gpu "
                                     "rows", None),
    "reward_model.forward_max_token_len_per_gpu": (_RM_SERVER, None),
    "reward_model.sandbox_fusion.url": ("rlvr's code scorers run in its own sandbox; no SandboxFusion service is "
                                        "called", (None,)),
    "reward_model.sandbox_fusion.*": ("no SandboxFusion service is called", None),
    "reward_model.ulysses_sequence_parallel_size": (_SP, (1,)),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": ("the overlong penalty is always logged "
                                                           "(reward extra info)", None),
    "reward_model.reward_kwargs.max_resp_len": (
        "DAPO's overlong penalty ends at data.max_response_length (a different max_resp_len is refused at load)",
        None),
    "reward_model.overlong_buffer.log": ("the overlong penalty is always logged (reward extra info)", None),
    # algorithm
    "algorithm.use_pf_ppo": ("PF-PPO reweighting is not implemented", (False,)),
    "algorithm.pf_ppo": ("PF-PPO reweighting is not implemented", None),
    # trainer
    "trainer.balance_batch": ("each data-parallel rank takes a contiguous share of each mini-batch's groups, "
                              "not reordered to even out tokens (the same update; only the ranks' load differs)", None),
    "trainer.use_legacy_worker_impl": ("rlvr has one worker implementation", None),
    "trainer.ray_wait_register_center_timeout": ("rlvr's Ray workers are created directly (no register center); "
                                                 "a worker that does not start fails the run with Ray's error", None),
    "trainer.critic_warmup": ("a critic warm-up (no actor update for the first steps) is not implemented", (0,)),
    "trainer.val_only": ("validation alone is `rlvr eval`", (False,)),
    "trainer.default_hdfs_dir": ("checkpoints go to trainer.default_local_dir", None),
    "trainer.log_val_generations": ("validation generations are not logged to trackers; `rlvr rollout` prints "
                                    "validation prompts with their responses and scores", (0,)),
    "trainer.validation_data_dir": ("validation generations are not dumped; `rlvr rollout` prints them", (None,)),
    "trainer.esi_redundant_time": ("elastic (ESI) preemption saves are not implemented; Ctrl-C or SIGTERM saves "
                                   "the complete step", None),
    "trainer.del_local_ckpt_after_load": ("checkpoints are kept (trainer.max_actor_ckpt_to_keep prunes them)",
                                          (False,)),
    "trainer.max_critic_ckpt_to_keep": ("a checkpoint holds the actor and the critic together; "
                                        "trainer.max_actor_ckpt_to_keep prunes both", None),
    "transfer_queue.enable": ("verl's transfer queue is not implemented; batches pass as DataProto", (False,)),
    "ray_kwargs.timeline_json_file": ("no Ray timeline is written", (None,)),
}

# verl key -> the rlvr key it is read as (the value moves over; one notice per layer)
VERL_ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.tau_pos": "actor_rollout_ref.actor.policy_loss.tau_pos",
    "actor_rollout_ref.actor.tau_neg": "actor_rollout_ref.actor.policy_loss.tau_neg",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "actor_rollout_ref.actor.optim.warmup_style",
    "critic.optim.lr_scheduler_type": "critic.optim.warmup_style",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "custom_reward_function.reward_kwargs": "reward.custom_reward_function.reward_kwargs",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.path",
    "reward_model.micro_batch_size_per_gpu": "reward.reward_model.micro_batch_size_per_gpu",
    "reward_model.launch_reward_fn_async": "reward.launch_reward_fn_async",
    # DAPO's overlong reward shaping: the recipe's spelling and the reward-kwargs spelling of its scripts
    "reward_model.overlong_buffer.enable": "reward.overlong_buffer.enable",
    "reward_model.overlong_buffer.len": "reward.overlong_buffer.len",
    "reward_model.overlong_buffer.penalty_factor": "reward.overlong_buffer.penalty_factor",
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": "reward.overlong_buffer.enable",
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": "reward.overlong_buffer.len",
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": "reward.overlong_buffer.penalty_factor",
}

# verl key (or section) -> the rlvr key to use instead
VERL_RENAMED: dict[str, str] = {
    "reward_model.reward_kwargs": "reward.custom_reward_function.reward_kwargs (keyword arguments of the scorer); "
                                  "DAPO's overlong_buffer_cfg.{enable,len,penalty_factor} are read as reward.overlong_buffer",
    "data.tokenizer": "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.rollout.multi_turn.max_turns": "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
}

# verl's global micro-batch sizes (rows per forward over all the data-parallel ranks) -> rlvr's per-device
# key. verl divides them by the device count over the Ulysses size (fsdp_workers.py; rlvr has no Ulysses),
# and refuses the global key beside the per-device one (ActorConfig, CriticConfig): so does rlvr, at load
VERL_GLOBAL_MICRO_BATCH: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward.reward_model.micro_batch_size_per_gpu",
}

# verl keys read with verl's meaning once every layer is merged (rlvr/config/loader.py), as what they become
VERL_READ_AT_LOAD: dict[str, str] = {
    **{key: f"{per_device} = {key} // (trainer.n_gpus_per_node x trainer.nnodes)"
       for key, per_device in VERL_GLOBAL_MICRO_BATCH.items()},
    "trainer.resume_from_path": "trainer.resume_mode (the checkpoint folder) with trainer.resume_mode=resume_path; "
                                "ignored otherwise, as verl ignores it",
}

MEGATRON_BACKEND = ("verl's Megatron-LM backend is not implemented in rlvr, which shards with FSDP2 "
                    "(actor_rollout_ref.actor.strategy=fsdp2)")
MEGATRON = MEGATRON_BACKEND + ": drop them"
MEGATRON_LORA = ("Megatron's LoRA keys (actor_rollout_ref.model.lora.*) become "
                 "actor_rollout_ref.model.lora_rank/lora_alpha")
# the keys of verl's Megatron config (ppo_megatron_trainer.yaml) that its FSDP config does not have; a
# section covers its sub-keys. Refused for any value: a default-valued one is still a Megatron script's
VERL_MEGATRON: tuple[str, ...] = (
    "actor_rollout_ref.actor.megatron", "actor_rollout_ref.ref.megatron", "critic.megatron", "reward_model.megatron",
    "actor_rollout_ref.actor.load_weight", "actor_rollout_ref.ref.load_weight", "critic.load_weight",
    "reward_model.load_weight", "critic.nccl_timeout", "reward_model.nccl_timeout",
    "actor_rollout_ref.rollout.layer_name_map",
    "actor_rollout_ref.model.override_config.model_config", "actor_rollout_ref.model.override_config.moe_config",
    "critic.model.override_config.model_config", "critic.model.override_config.moe_config",
    *(f"{role}.optim.{name}" for role in ("actor_rollout_ref.actor", "critic")
      for name in ("lr_warmup_init", "lr_decay_steps", "lr_decay_style", "min_lr", "weight_decay_incr_style",
                   "lr_wsd_decay_style", "lr_wsd_decay_steps", "use_checkpoint_opt_param_scheduler")),
)
# Megatron's LoRA section -> the FSDP LoRA keys rlvr reads (never dropped: the run would train every weight)
VERL_MEGATRON_LORA: dict[str, dict[str, str]] = {
    "actor_rollout_ref.model.lora": {"rank": "actor_rollout_ref.model.lora_rank",
                                     "alpha": "actor_rollout_ref.model.lora_alpha"},
    "critic.model.lora": {"rank": "critic.model.lora_rank", "alpha": "critic.model.lora_alpha"},
}

# keys that only a vision-language run sets (``*`` matches any part of a key) -> the values that ask for no
# image or video input, or None: refused for any value (a script that names its image column has images)
VERL_MULTIMODAL: dict[str, tuple | None] = {
    "data.image_key": None,
    "data.video_key": None,
    "data.image_patch_size": None,
    "actor_rollout_ref.rollout.engine_kwargs.*mm_*": None,  # vLLM's disable_mm_preprocessor_cache, limit_mm_per_prompt
    "reward_model.rollout.limit_images": (None,),
}
