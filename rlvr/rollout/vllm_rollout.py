"""``rollout.name=vllm``: vLLM as the rollout engine, colocated with the actor in its process.

As verl's hybrid engine and TRL's colocate mode: each training process (each rank) runs its own
in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), built with ``load_format=dummy``
from the policy's own config and tokenizer (written to a folder), so nothing is read twice.
Beside the ranks' process group, vLLM's world takes every rank, in tensor-parallel groups of
``tensor_model_parallel_size`` consecutive ranks (verl's "external data parallel" x TP). With one
rank a group each samples its own rows; a group of several runs one engine through vLLM's
external launcher, its first rank generating the group's rows and the others following
(``EngineRanks``).

- **Weights**: ``sync_weights`` streams the policy's weights into vLLM's in-place reload
  (``reload_weights(is_checkpoint_format=True)``: vLLM repacks each layer as it arrives), one
  tensor at a time: a sharded (FSDP2) parameter is gathered alone, a LoRA layer's weight is sent
  merged (W + scale B A), and no second full copy is ever built. The engine records which
  policy and which weight version it holds; a version it does not hold is always reloaded, so a
  rollout never runs on stale weights.
- **Memory**: on a GPU (the device the worker was given, ``trainer.device``) with
  ``free_cache_engine`` the engine sleeps between rollouts (vLLM's sleep mode, level
  ``SLEEP_LEVEL``) and wakes in two parts, as verl's hybrid engine does: ``wake_up(["weights"])``
  before the weights are streamed in, ``wake_up(["kv_cache"])`` only once the worker has moved
  the actor's state off the device (``ActorRolloutRefWorker.rollout_mode``). The engine is asleep
  from its start until the first rollout. What is awake, and whose weights it holds, is the
  shared engine's state (``SharedEngine``), never a rollout's. vLLM's CPU build has no sleep
  mode: there the KV cache holds ``max_num_seqs`` rows of ``max_model_len`` tokens, capped at
  ``CPU_KV_CACHE_CAP`` but never below one row in whole blocks, unless ``gpu_memory_utilization``
  is set, and it stays allocated between rollouts.
- **Sampling**: every row is a request with its own seed, derived from the step's seed, the
  row's place in the whole batch and its prompt length (so a rank, a wave or a multi-turn turn
  draws the same tokens however the rows are split). Log-probs are vLLM's ``processed_logprobs``:
  the sampled token's log-prob under softmax(logits / T), what the actor computes.

Departures from the native engine: sampled tokens differ (another random stream) while greedy
tokens agree up to ties. Both report the log-prob of the distribution sampled from: with top-k /
top-p / min-p, renormalised over the kept tokens.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import os
import tempfile
from typing import Hashable, Iterator, Sequence

import torch
import torch.distributed as dist

from rlvr.config import ConfigError
from rlvr.config.schema import RolloutConfig
from rlvr.config.validate import whole_prefill_problem
from rlvr.distributed.fsdp import full_tensor
from rlvr.distributed.weight_sync import persistent_buffers
from rlvr.models.checkpoint_names import to_checkpoint_names
from rlvr.models.loader import DTYPES
from rlvr.models.lora import active_adapters, merged_config
from rlvr.protocol import DataProto
from rlvr.rollout.base import BaseRollout, Completion, register_rollout
from rlvr.rollout.sampling import SamplingParams

_ENGINES: dict[tuple, "SharedEngine"] = {}  # engine arguments -> engine: shared (each takes seconds to start)
_SERIALS = itertools.count()  # rollouts are told apart by serial, never by id() (reused after garbage collection)


def policy_weights(model: torch.nn.Module, tied_head: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights by checkpoint name (fused experts split per expert, as vLLM's loaders
    read them), one tensor at a time: an FSDP2 shard gathered (a
    collective: every rank must drain the iterator), a tied weight gathered once and sent under
    each of its names (vLLM's layer-wise reload expects the head too) unless ``tied_head`` is
    False (an engine with no head of its own, ``engine_has_head``), a peft LoRA layer's weight
    merged with its active adapters (``base_layer`` dropped from the name, adapter matrices not
    sent), then the persistent buffers: what a checkpoint stores beside the parameters (GLM-4-MoE's
    router ``e_score_correction_bias``, Gemma-4's ``layer_scalar``), which vLLM holds as parameters
    and would otherwise keep at its dummy values."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    head = _head_alias(model)
    lora = {name: m for name, m in model.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")}
    with torch.no_grad():
        for first, param in model.named_parameters():
            if ".lora_" in first:
                continue
            tensor = full_tensor(param.detach())
            for name in names[id(param)]:
                if not tied_head and name == head and len(names[id(param)]) > 1:
                    continue
                owner, _, leaf = name.rpartition(".")
                layer = lora.get(owner.removesuffix(".base_layer")) if owner.endswith(".base_layer") else None
                if layer is None:
                    yield from to_checkpoint_names(model, {name: tensor}).items()
                    continue
                merged = tensor
                for adapter in active_adapters(layer) if leaf == "weight" else ():  # linear or embedding
                    merged = merged + full_tensor(layer.get_delta_weight(adapter).detach())
                yield from to_checkpoint_names(model, {f"{owner.removesuffix('.base_layer')}.{leaf}": merged}).items()
        for name, buffer in persistent_buffers(model):  # peft's base_layer dropped from the name
            name = name.replace(".base_layer.", ".")
            yield from to_checkpoint_names(model, {name: full_tensor(buffer.detach())}).items()


def _head_alias(model: torch.nn.Module) -> str | None:
    """The name of the output head's weight (``lm_head.weight``), the alias of a tied embedding."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in model.named_modules():
        if head is not None and module is head:
            return f"{name}.weight"
    return None


def engine_has_head(vllm_model: torch.nn.Module) -> bool:
    """Whether vLLM's model has an output head parameter (``lm_head``) to reload. Some of vLLM's
    implementations of tied families have none and compute the logits from ``embed_tokens``
    (``HEADLESS_ARCHITECTURES``: Gemma-2, Gemma-3n, Cohere): Gemma-2's and Gemma-3n's reloads refuse
    a tensor named ``lm_head.weight``. Gemma-3's ties a head of its own and takes it."""
    return any(name.split(".")[-2:-1] == ["lm_head"] for name, _ in vllm_model.named_parameters(remove_duplicate=False))


HEADLESS_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3nForCausalLM", "CohereForCausalLM", "Cohere2MoeForCausalLM")
"""vLLM 0.32's causal LMs (its registry's class names) that compute the logits from ``embed_tokens`` and
have no ``lm_head`` (gemma2.py, gemma3n.py, commandr.py, cohere2_moe.py): a ``vllm serve`` replica is
sent no head for them (``vllm_builds_head``), where in process the engine's own parameters tell
(``engine_has_head``). Gemma-2's and Gemma-3n's loaders refuse ``lm_head.weight``; Cohere's drop it."""


def vllm_classes(model: torch.nn.Module) -> list[str]:
    """The vLLM classes (its registry's names) that would run ``model``: by the config's
    ``architectures``, else the model's class name; an architecture vLLM does not list keeps its name."""
    with _environment_kept():  # importing vLLM writes into os.environ
        from vllm.model_executor.models.registry import _VLLM_MODELS

    architectures = getattr(model.config, "architectures", None) or [type(model).__name__]
    return [_VLLM_MODELS[a][1] if a in _VLLM_MODELS else a for a in architectures]


def vllm_builds_head(model: torch.nn.Module) -> bool:
    """Whether vLLM's implementation of ``model``'s architecture has an ``lm_head`` to load (its tied
    alias is then sent); decided from the architecture, for servers whose model rlvr cannot inspect."""
    return not any(name in HEADLESS_ARCHITECTURES for name in vllm_classes(model))


EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # Qwen-MoE / OLMoE, Mixtral, DeepSeek / GLM


def is_mixture_of_experts(config) -> bool:
    """The config has routed experts (vLLM then builds its fused-MoE layers)."""
    return any((getattr(config, key, None) or 0) > 1 for key in EXPERT_KEYS)


def _repack_cpu_experts(model: torch.nn.Module) -> None:
    """Pack a CPU mixture of experts' reloaded weights again. vLLM 0.32's in-place reload skips
    the experts kernel's ``process_weights_after_loading`` on a weight update (its CPU prepack),
    so the CPU kernel would read the new, plain matrices as packed ones."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None and isinstance(kernel.fused_experts, CPUUnquantizedExperts):
            kernel.fused_experts.process_weights_after_loading(module)


CPU_BATCHED_TOKENS = 4096
"""vLLM's CPU build's default ``max_num_batched_tokens``: rlvr's on a CPU, raised to max_model_len."""


def whole_prefill_tokens(asked: int | None, max_model_len: int) -> int:
    """The ``max_num_batched_tokens`` of a vLLM engine on a CPU, which runs with chunked prefill off.
    vLLM's CPU build fails every seeded request whose prompt a step prefills in part (its model
    runner rewinds the request's generator, which a CPU generator cannot do: "CPU Generator does
    not use offset"), and it splits a prompt whenever a step's prompts pass
    ``max_num_batched_tokens``: 64 rows of a 200-token prompt did. On a CPU every prompt is
    therefore prefilled whole (as vLLM's V0 engine did), which needs a step to hold the longest
    prompt. In process and on the ``vllm serve`` replicas a run starts alike."""
    problem = whole_prefill_problem(asked, max_model_len)  # refused at load too (config/validate.py)
    if problem:
        raise ValueError(problem)
    return max(asked or CPU_BATCHED_TOKENS, max_model_len)


def request_seed(seed: int, row: int, prompt_length: int) -> int:
    """A row's sampling seed: fixed by the step's seed, the row's place in the whole batch and how
    many tokens its prompt has (a multi-turn row's later turns draw from new streams)."""
    digest = hashlib.blake2b(f"{seed}:{row}:{prompt_length}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@contextlib.contextmanager
def _environment_kept():
    """Undo what starting vLLM writes into ``os.environ`` (its own ``VLLM_*`` keys excepted): it
    sets LD_PRELOAD (its OpenMP library), LOCAL_WORLD_SIZE=1, LD_LIBRARY_PATH, HF_HUB_OFFLINE and
    more, which every process rlvr starts later would inherit: Ray workers, distributed ranks,
    reward pools and the python tool's sandbox (where the preloaded library does not exist)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in [k for k in os.environ if k not in before and not k.startswith("VLLM_")]:
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


SLEEP_LEVEL = 2
"""vLLM's sleep level between rollouts: 2 discards the weights with the KV cache, where level 1
would keep a host copy of them. The policy's weights change at every update, so that copy would
be stale by the next rollout (rlvr streams the new ones in anyway) while it cost each rank a
rollout-dtype copy of the model in host RAM, beside the offloaded actor and optimizer. verl
chooses 2 as well (vLLM >= 0.8.5)."""

WAKE_TAGS = ("weights", "kv_cache")  # what vLLM's sleep releases, by the tags its wake_up takes

CPU_KV_CACHE_CAP = 2**30  # bytes: on a CPU the KV cache stays allocated beside training (no sleep mode)
CPU_BLOCK_SIZE = 128
"""Tokens per KV cache block of vLLM's CPU backend (``CpuPlatform.check_and_update_config`` sets
128 unless the model uses MLA, whose 16 divides it; on a GPU the default is
``CacheConfig.DEFAULT_BLOCK_SIZE`` = 16, which a backend may raise)."""
GPU_MEMORY_UTILIZATION = 0.5  # the device fraction vLLM reserves on a GPU when the config says none (verl's default)


def cpu_kv_cache_bytes(bytes_per_token: int, max_num_seqs: int, max_model_len: int) -> int:
    """The CPU engine's KV cache: ``max_num_seqs`` rows of ``max_model_len`` tokens, capped at
    ``CPU_KV_CACHE_CAP`` (rows beyond it wait in vLLM's queue) but never below one full row. vLLM
    counts whole blocks and holds one back (its block pool's null block), so that row is
    ``ceil(max_model_len / CPU_BLOCK_SIZE) + 1`` blocks: a floor of exactly ``max_model_len``
    tokens fails vLLM's start ("To serve at least one request with the model's max seq len ...")."""
    one_row = bytes_per_token * CPU_BLOCK_SIZE * (-(-max_model_len // CPU_BLOCK_SIZE) + 1)
    return max(one_row, min(bytes_per_token * max_model_len * max_num_seqs, CPU_KV_CACHE_CAP))


def kv_bytes_per_token(model_config, dtype: torch.dtype, tensor_parallel_size: int = 1) -> int:
    """Keys and values of one token over every layer, on one of ``tensor_parallel_size`` ranks:
    vLLM gives each rank ``max(1, kv_heads // tensor_parallel_size)`` heads (replicated when there
    are fewer heads than ranks). Layer by layer: a config with per-layer attributes (Gemma-4's
    full-attention layers have ``global_head_dim`` and their own kv heads) answers them per layer
    (``per_layer_config``). Sliding layers are counted at full length, an upper bound."""
    values = 0
    for i in range(model_config.num_hidden_layers):
        layer = _layer_config(model_config, i)
        heads = getattr(layer, "num_key_value_heads", None) or layer.num_attention_heads
        head_dim = getattr(layer, "head_dim", None) or layer.hidden_size // layer.num_attention_heads
        values += 2 * max(1, heads // tensor_parallel_size) * head_dim
    return values * dtype.itemsize


def _layer_config(model_config, index: int):
    """Layer ``index``'s view of ``model_config``: its ``per_layer_config`` entry where the config has
    per-layer attributes (transformers' heterogeneous configs), else the config itself."""
    per_layer = getattr(model_config, "per_layer_config", None)
    return per_layer[index] if per_layer else model_config


def _start_engine(config, tokenizer, args: dict, device: torch.device):
    """vLLM's ``LLM`` in this process, started from a folder holding the policy's ``config`` and
    tokenizer (the weights come by ``sync_weights``)."""
    with _environment_kept():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in this process: its weights are reachable
        if args.get("tensor_parallel_size", 1) > 1 and device.type == "cpu":
            # vLLM's CPU collectives under the external launcher name their shared memory the same in
            # every run ("/dev/shm/-tp:0-[0-1]-cpushm_<rank>") and do not remove it at exit, so the next
            # run on the machine failed with "create shm in SHMManager failed. errno: 17": each rank
            # removes its own stale segment first (a live engine keeps its mapping of an unlinked one)
            for stale in glob.glob(f"/dev/shm/*-cpushm_{dist.get_rank() % args['tensor_parallel_size']}"):
                with contextlib.suppress(OSError):
                    os.unlink(stale)
        if args.get("distributed_executor_backend") == "external_launcher" and device.type == "cuda":
            # the external launcher takes its device index from LOCAL_RANK, which a worker group sets to
            # the process's place on the node; the worker's device is the index it sees (Ray: 0 of 1)
            os.environ["LOCAL_RANK"] = str(device.index if device.index is not None else torch.cuda.current_device())
        from vllm import LLM

        with tempfile.TemporaryDirectory(prefix="rlvr-vllm-") as folder:
            config.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            return LLM(model=folder, tokenizer=folder, **args)


def check_native_architecture(model: torch.nn.Module, served: bool = False) -> None:
    """Refuse a policy whose architecture vLLM has no implementation of its own for: vLLM 0.32 runs
    it through its transformers backend (its registry maps it to ``transformers``, or lacks it).
    Measured on tiny random models (OLMo-2, OLMo-3, SmolLM3): the backend decorates the family's
    transformers decoder class in place (``support_torch_compile``), after which the actor's own
    model fails in its forward ("'Olmo2Model' object has no attribute 'do_not_compile'"); with that
    mended, vLLM's greedy tokens still differed from transformers' (OLMo-2, SmolLM3) or its engine
    did not start (OLMo-3: vLLM found no room for one row in the KV cache rlvr sized). rlvr cannot
    check such an engine, so it refuses it. ``served``: for the ``vllm serve`` replicas rlvr starts
    (another process: the actor's forward is safe, the tokens are not)."""
    with _environment_kept():  # importing vLLM writes into os.environ
        from vllm.model_executor.models.registry import _VLLM_MODELS

    config = model.config
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    native = [a for a in architectures if a in _VLLM_MODELS and _VLLM_MODELS[a][0] != "transformers"]
    if not native:
        where, instead = (("the vllm serve replicas rlvr starts would run it through its transformers backend",
                           "actor_rollout_ref.rollout.name=native (rlvr serve replicas)") if served else
                          ("it would run it through its transformers backend, which breaks the actor's own forward "
                           "in this process", "actor_rollout_ref.rollout.name=native"))
        raise ConfigError(f"actor_rollout_ref.rollout.name=vllm: vLLM has no implementation of its own for "
                          f"{architectures[0]} (model_type {getattr(config, 'model_type', '?')!r}); {where}, "
                          "whose greedy tokens differed from transformers' on OLMo-2 and SmolLM3 (OLMo-3's engine "
                          f"did not start; vLLM 0.32). Use {instead} for this family.")


class EngineRanks:
    """The ranks one engine spans under tensor parallelism: ``size`` consecutive ranks of the
    process group (vLLM's layout, external data parallel x TP), led by the first of them.

    vLLM's external launcher runs one engine per rank, and the engine's collectives need every
    rank of a TP group to generate the same requests in the same order (vLLM's premise: the
    same inputs and deterministic scheduling give the same outputs). So the leader alone runs
    a rollout, over the rows of every rank in its group (the multi-turn loop and its tools
    included), and sends each batch of requests to the others before generating it; they
    generate what they are sent until the leader says the rollout is over, then take their own
    rows of its answer. Control messages go over gloo groups of their own, beside vLLM's."""

    def __init__(self, size: int):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.size, self.leader = size, rank - rank % size
        self.is_leader = rank == self.leader
        # new_group is collective over the whole group: every rank makes every group, in one order
        groups = {start: dist.new_group(list(range(start, start + size)), backend="gloo")
                  for start in range(0, world, size)}
        self.group = groups[self.leader]

    def broadcast(self, message=None):
        """The leader's ``message`` on every rank of the group."""
        box = [message]
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        return box[0]

    def gather(self, part) -> list | None:
        """Every rank's ``part``, in rank order, on the leader (None elsewhere)."""
        parts = [None] * self.size if self.is_leader else None
        dist.gather_object(part, parts, dst=self.leader, group=self.group)
        return parts

    def scatter(self, parts: list | None):
        """The leader's ``parts[i]`` on the group's i-th rank."""
        box = [None]
        dist.scatter_object_list(box, parts, src=self.leader, group=self.group)
        return box[0]


class SharedEngine:
    """One vLLM engine and its state, shared by every rollout built with the same arguments in
    this process: which of its memory is awake, and whose weights (rollout serial, version) it
    holds. Kept here, not in each rollout, so that two rollouts over one engine never sleep it
    twice, nor take a sleeping engine for an awake one."""

    def __init__(self, llm, sleeps: bool, ranks: EngineRanks | None = None):
        self.llm, self.sleeps = llm, sleeps  # sleeps: started with enable_sleep_mode
        self.ranks = ranks  # tensor parallel: the ranks this engine spans (None: this rank alone)
        self.asleep: set[str] = set()  # vLLM's wake_up tags whose memory is released
        self.holds: tuple[int, int] | None = None  # (serial, version) of the weights it holds
        self.sleep()  # asleep until the first rollout: training starts beside it

    @property
    def runner(self):
        return self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner

    def sleep(self) -> None:
        if not self.sleeps or self.asleep == set(WAKE_TAGS):
            return
        self.wake_up(WAKE_TAGS)  # half awake (a rollout_mode cut short): vLLM sleeps a wholly awake engine
        self.llm.sleep(level=SLEEP_LEVEL)
        self.asleep = set(WAKE_TAGS)
        self.holds = None  # level 2 discarded them

    def wake_up(self, tags: Sequence[str]) -> None:
        """Reallocate the memory of ``tags`` (``"weights"``, ``"kv_cache"``) that sleeps."""
        tags = [t for t in tags if t in self.asleep]
        if tags:
            self.llm.wake_up(tags=tags)
            self.asleep -= set(tags)

    @property
    def has_head(self) -> bool:
        """Whether the engine's model takes a tied head under its own name (``engine_has_head``)."""
        if not hasattr(self, "_has_head"):
            self._has_head = engine_has_head(self.runner.model)
        return self._has_head

    def reload(self, weights: Iterator[tuple[str, torch.Tensor]], holds: tuple[int, int]) -> None:
        self.wake_up(["weights"])
        self.runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        _repack_cpu_experts(self.runner.model)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.holds = holds


@register_rollout("vllm")
class VLLMRollout(BaseRollout):
    """vLLM over the policy ``model`` (whose weights ``sync_weights`` streams into it); its GPU
    path (sleep mode, ``gpu_memory_utilization``) follows ``device``, not what torch can see."""

    streams_weights = True

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int,
                 max_prompt_length: int | None = None, device: torch.device | str | None = None):
        super().__init__(model, tokenizer, config, max_response_length, max_prompt_length, device)
        self.policy, self.serial = model, next(_SERIALS)
        self.on_gpu = self.device.type == "cuda"
        self.max_model_len = config.max_model_len or (
            max_prompt_length + max_response_length if max_prompt_length else model.config.max_position_embeddings)
        self.engine = self._engine(model, tokenizer)
        self.syncs = 0  # how many times weights were streamed into the engine

    @property
    def llm(self):
        return self.engine.llm

    # ------------------------------------------------------------------ the engine
    def _engine_args(self, model) -> dict:
        cfg = self.config
        dtype = model.dtype if cfg.dtype == "auto" else DTYPES[cfg.dtype]
        args = dict(dtype=str(dtype).removeprefix("torch."), load_format="dummy", seed=cfg.seed,
                    max_model_len=self.max_model_len, max_num_seqs=cfg.max_num_seqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens, enforce_eager=cfg.enforce_eager,
                    enable_prefix_caching=cfg.enable_prefix_caching,
                    tensor_parallel_size=cfg.tensor_model_parallel_size,
                    distributed_executor_backend="external_launcher" if cfg.tensor_model_parallel_size > 1 else None,
                    generation_config="vllm",  # sampling comes from rlvr's config, not the folder's defaults
                    logprobs_mode="processed_logprobs")
        if self.on_gpu:
            args.update(gpu_memory_utilization=cfg.gpu_memory_utilization or GPU_MEMORY_UTILIZATION,
                        enable_sleep_mode=cfg.free_cache_engine)
        elif cfg.gpu_memory_utilization is not None:
            args.update(gpu_memory_utilization=cfg.gpu_memory_utilization)  # a fraction of the host's memory
        else:
            per_token = kv_bytes_per_token(model.config, dtype, cfg.tensor_model_parallel_size)  # one rank's
            args.update(kv_cache_memory_bytes=cpu_kv_cache_bytes(per_token,
                                                                 cfg.max_num_seqs, self.max_model_len))
        if not self.on_gpu:
            args.update(enable_chunked_prefill=False,
                        max_num_batched_tokens=whole_prefill_tokens(cfg.max_num_batched_tokens, self.max_model_len))
        return args

    def _engine(self, model, tokenizer) -> SharedEngine:
        """The engine for these arguments, started once per process."""
        check_native_architecture(model)
        args = self._engine_args(model)
        config = merged_config(model)  # with an adapted tied embedding: a head of its own
        key = (config.to_json_string(use_diff=False), tokenizer.name_or_path, len(tokenizer),
               tuple(sorted((k, str(v)) for k, v in args.items())))
        if key not in _ENGINES:
            tp = self.config.tensor_model_parallel_size
            if tp > 1 and not dist.is_initialized():
                raise RuntimeError(f"actor_rollout_ref.rollout.tensor_model_parallel_size = {tp}: one engine over {tp} "
                                   "ranks needs the ranks' process group (actor.strategy=fsdp2 over a worker group)")
            ranks = EngineRanks(tp) if tp > 1 else None
            _ENGINES[key] = SharedEngine(_start_engine(config, tokenizer, args, self.device),
                                         args.get("enable_sleep_mode", False), ranks)
        return _ENGINES[key]

    def wake_up(self, tags: Sequence[str]) -> None:
        """vLLM's memory for ``tags`` back on the device (nothing to do unless the engine sleeps)."""
        self.engine.wake_up(tags)

    def sync_weights(self, version: int | None = None) -> None:
        """Stream the policy's weights into the engine (waking its weights' memory, not its KV
        cache, if it sleeps) unless it holds this very version of this rollout's policy
        (``version`` None: always)."""
        if version is not None and self.engine.holds == (self.serial, version):
            return
        self.engine.reload(policy_weights(self.policy, tied_head=self.engine.has_head),
                           (self.serial, version if version is not None else -1))
        self.syncs += 1

    def free_cache(self) -> None:
        """On a GPU with ``free_cache_engine``: the engine sleeps (weights and KV cache released)."""
        self.engine.sleep()

    # ------------------------------------------------------------------ generation
    def _sampling(self, params: SamplingParams, seed: int, max_tokens: int):
        from vllm import SamplingParams as VLLMSamplingParams

        greedy = params.greedy
        return VLLMSamplingParams(
            n=1, max_tokens=max_tokens, temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=0 if greedy or params.top_k <= 0 else params.top_k,
            min_p=0.0 if greedy else params.min_p, seed=None if greedy else seed, logprobs=0,
            stop=list(params.stop) or None, stop_token_ids=list(self.eos_ids), include_stop_str_in_output=True,
            skip_special_tokens=False, detokenize=bool(params.stop))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 groups: Sequence[Hashable] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """One request per prompt; ``groups`` is not read: vLLM's prefix cache shares a group's
        prompt in whole KV blocks (``CPU_BLOCK_SIZE`` tokens on a CPU, so a shorter prompt is
        prefilled by every row)."""
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        ranks = self.engine.ranks
        if ranks is not None and not ranks.is_leader:
            raise RuntimeError("under tensor parallelism only the first rank of an engine's group generates; the "
                               "others follow it (VLLMRollout.generate_in_group)")
        if self.engine.holds is None or self.engine.holds[0] != self.serial:  # holding another policy's
            if ranks is not None:  # a reload is collective: the followers would never join this one
                raise RuntimeError("the engine spans several ranks and holds another policy's weights: sync them "
                                   "on every rank (rollout_mode) before generating")
            self.sync_weights()
        self.engine.wake_up(WAKE_TAGS)  # a caller without the worker's order (rollout workers)

        rows = params.row_ids or tuple(range(params.row_offset, params.row_offset + len(prompts)))
        budgets = [min(int(b), params.max_new_tokens) for b in max_new_tokens] if max_new_tokens is not None \
            else [params.max_new_tokens] * len(prompts)
        for r, p in enumerate(prompts):
            if len(p) + budgets[r] > self.max_model_len:
                budgets[r] = self.max_model_len - len(p)
                if budgets[r] < 1:
                    raise ValueError(f"prompt of row {rows[r]} has {len(p)} tokens, no room left under "
                                     f"actor_rollout_ref.rollout.max_model_len={self.max_model_len}: raise it")
        requests = [TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts]
        sampling = [self._sampling(params, request_seed(params.seed, row, len(p)), budget)
                    for p, row, budget in zip(prompts, rows, budgets)]
        if ranks is not None:
            ranks.broadcast(("generate", requests, sampling))  # the followers' engines generate them with this one
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for out in outputs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            log_probs = [float(step[t].logprob) for t, step in zip(ids, o.logprobs)]
            completions.append(Completion(ids, log_probs, "stop" if o.finish_reason == "stop" else "length"))
        return completions

    def generate_in_group(self, prompts: DataProto, rollout=None) -> DataProto:
        """``rollout.generate_sequences(prompts)`` (this engine's, or the multi-turn loop's over it)
        where the engine spans several ranks (``EngineRanks``): every rank of the group calls this
        with its own rows; the leader generates the group's rows together, the others follow, and
        each gets its own rows back. One rank alone: the plain call."""
        rollout, ranks = rollout or self, self.engine.ranks
        if ranks is None:
            return rollout.generate_sequences(prompts)
        parts = ranks.gather(prompts)
        if not ranks.is_leader:
            while (message := ranks.broadcast())[0] == "generate":
                self.llm.generate(message[1], message[2], use_tqdm=False)
            if message[0] == "failed":
                raise RuntimeError(f"the rollout failed on rank {ranks.leader}, which leads this rank's engine: "
                                   f"{message[1]}")
            return ranks.scatter(None)
        try:
            meta = dict(prompts.meta_info)  # the leader's: its row_offset is the group's first row
            batch = DataProto.concat([DataProto(p.batch, p.non_tensor_batch, {}) for p in parts])
            batch.meta_info = meta
            out = rollout.generate_sequences(batch)
        except BaseException as error:
            ranks.broadcast(("failed", f"{type(error).__name__}: {error}"))
            raise
        ranks.broadcast(("done",))
        bounds = list(itertools.accumulate([0] + [len(p) for p in parts]))
        return ranks.scatter([out.slice(a, b) for a, b in zip(bounds, bounds[1:])])
