"""vLLM's wake order on a GPU, checked on the CPU.

No vLLM GPU build runs here, so the hybrid worker's ``rollout_mode`` / ``trainer_mode`` drive
a recording stand-in for vLLM's engine (``sleep``, ``wake_up(tags)``, the runner's
``reload_weights``) and a ledger of one device's memory that every transition charges and
frees. The actor's shards, AdamW state and the reference move through the worker's own
offload code; ``trainer.device=cuda`` selects the GPU path although torch sees no GPU.

The sizes are a 4B-parameter policy on one 80 GB device: fp32 shards 16 GB, AdamW's two
moments 32 GB, an fp32 reference 16 GB, and vLLM at gpu_memory_utilization 0.5 (40 GB):
bf16 weights 8 GB and a 32 GB KV pool. Training holds 16 + 32 + 16 = 64 GB; the budget
is 80 GB. Waking vLLM whole beside training needs 64 + 40 = 104 GB.
"""

from types import SimpleNamespace

import pytest
import torch

from rlvr.config.loader import load_config
from rlvr.distributed import fsdp
from rlvr.rollout import SamplingParams, VLLMRollout, vllm_rollout
from rlvr.workers import hybrid
from rlvr.workers.hybrid import ActorRolloutRefWorker

GB = {"actor": 16, "optimizer": 32, "reference": 16, "vllm_weights": 8, "kv_cache": 32}
BUDGET = 80
OFFLOAD = ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
           "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
           "actor_rollout_ref.ref.fsdp_config.param_offload=true"]


class Ledger:
    """One device's memory. Tensors torch frees stay in its caching allocator (still on the
    device, reusable by torch) until ``empty_cache``; vLLM's allocator maps and unmaps its own.
    Records every call in order, the peak of each transition, and any moment the actor or its
    optimizer state shares the device with vLLM's KV cache."""

    def __init__(self):
        self.held: dict[str, int] = {}
        self.torch_cache = 0
        self.calls: list[str] = []
        self.peak = 0
        self.overlaps: list[set[str]] = []

    @property
    def used(self) -> int:
        return sum(self.held.values()) + self.torch_cache

    def charge(self, name: str, by_torch: bool = True) -> None:
        assert name not in self.held, f"{name} is on the device twice"
        if by_torch:
            self.torch_cache -= min(self.torch_cache, GB[name])
        self.held[name] = GB[name]
        self.peak = max(self.peak, self.used)
        if "kv_cache" in self.held and {"actor", "optimizer"} & set(self.held):
            self.overlaps.append(set(self.held))

    def free(self, name: str, by_torch: bool = True) -> None:
        size = self.held.pop(name)
        self.torch_cache += size if by_torch else 0

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.torch_cache = 0

    def transition(self, fn) -> tuple[list[str], int]:
        """The calls ``fn`` makes and the device's peak while it runs."""
        first, self.peak = len(self.calls), self.used
        fn()
        return self.calls[first:], self.peak


class OnDevice:
    """Stands for state the worker moves with ``.to(device)``: the actor's and the reference's
    FSDP roots, and (through ``fsdp.move_optimizer_state``) the AdamW state."""

    def __init__(self, ledger: Ledger, name: str):
        self.ledger, self.name = ledger, name

    def to(self, device):
        self.ledger.calls.append(f"{self.name} -> {torch.device(device).type}")
        if torch.device(device).type == "cuda":
            self.ledger.charge(self.name)
        else:
            self.ledger.free(self.name)
        return self


class RecordingLLM:
    """vLLM's ``LLM`` as the rollout uses it, recording its calls. It refuses what vLLM cannot do:
    sleeping twice, waking memory that is awake, reloading weights or generating while asleep."""

    def __init__(self, ledger: Ledger, args: dict):
        self.ledger, self.args = ledger, args
        self.model = torch.nn.Module()  # the runner's model: no experts to re-pack after a reload
        worker = SimpleNamespace(model_runner=self)
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)))))
        ledger.calls.append("start")
        for name in ("vllm_weights", "kv_cache"):  # vLLM takes its whole reservation at start
            ledger.charge(name, by_torch=False)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        assert {"vllm_weights", "kv_cache"} <= set(self.ledger.held), "sleep of an engine not wholly awake"
        self.ledger.calls.append(f"sleep({level})")
        for name in ("vllm_weights", "kv_cache"):
            self.ledger.free(name, by_torch=False)

    def wake_up(self, tags=None) -> bool:
        tags = list(tags or ["weights", "kv_cache"])
        self.ledger.calls.append(f"wake_up({','.join(tags)})")
        for tag in tags:
            self.ledger.charge({"weights": "vllm_weights", "kv_cache": "kv_cache"}[tag], by_torch=False)
        return True

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        assert "vllm_weights" in self.ledger.held, "weights reloaded into a sleeping engine"
        assert len(list(weights_iterator)) > 0
        self.ledger.calls.append("reload_weights")

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, requests, sampling, use_tqdm=False):
        assert {"vllm_weights", "kv_cache"} <= set(self.ledger.held), "generate while asleep"
        self.ledger.calls.append("generate")
        step = {5: SimpleNamespace(logprob=-1.0)}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5], logprobs=[step], finish_reason="length")])
                for _ in requests]


@pytest.fixture
def ledger(monkeypatch):
    """A fresh ledger; vLLM engines started from here on are recording stand-ins, in an engine
    table of their own (the module's real engines are untouched)."""
    ledger = Ledger()
    monkeypatch.setattr(vllm_rollout, "_ENGINES", {})
    monkeypatch.setattr(vllm_rollout, "_start_engine", lambda model, tokenizer, args, device: RecordingLLM(ledger, args))
    monkeypatch.setattr(fsdp, "move_optimizer_state", lambda optimizer, device: optimizer.to(device))
    monkeypatch.setattr(torch.cuda, "empty_cache", ledger.empty_cache)
    # the worker's device check refuses cuda on a machine without one; here the ledger is that device
    monkeypatch.setattr(hybrid, "resolve_device", torch.device)
    return ledger


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from rlvr.models import load_model, load_tokenizer

    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def gpu_worker(policy, ledger, overrides) -> ActorRolloutRefWorker:
    """A hybrid worker on ``trainer.device=cuda`` whose actor, optimizer and reference are ledger
    entries (training's state on the device), with a vLLM rollout started beside them."""
    model, tokenizer = policy
    config = load_config(None, ["trainer.device=cuda", "actor_rollout_ref.actor.strategy=fsdp2",
                                "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.use_kl_loss=true",
                                *overrides])
    worker = ActorRolloutRefWorker(config, total_training_steps=2, tokenizer=tokenizer)
    worker.actor = SimpleNamespace(model=model, root=OnDevice(ledger, "actor"),
                                   optimizer=OnDevice(ledger, "optimizer"))
    worker.ref = SimpleNamespace(root=OnDevice(ledger, "reference"))
    ledger.charge("actor")
    ledger.charge("reference")
    ledger.charge("optimizer")  # AdamW's state (empty before the first update: the worst case)
    ledger.transition(lambda: setattr(worker, "rollout", worker._build_rollout(model)))
    return worker


def test_rollout_mode_wakes_the_kv_cache_only_once_the_actor_is_off_the_device(policy, ledger):
    """verl's order: wake vLLM's weights, stream the actor's into them, offload the actor's
    shards, AdamW state and the reference, return torch's cached memory, wake the KV cache; and
    the reverse. Each transition peaks under the 80 GB budget (72 GB: training's 64 + vLLM's
    weights 8), and the actor or its optimizer state never shares the device with the KV cache."""
    worker = gpu_worker(policy, ledger, OFFLOAD)
    assert ledger.calls == ["actor -> cpu", "optimizer -> cpu", "reference -> cpu", "empty_cache", "start",
                            "sleep(2)", "actor -> cuda", "optimizer -> cuda", "reference -> cuda"]
    assert ledger.peak == 64 and ledger.used == 64  # vLLM starts alone (40), then sleeps until a rollout
    for step in range(2):
        calls, peak = ledger.transition(worker.rollout_mode)
        assert calls == ["wake_up(weights)", "reload_weights", "actor -> cpu", "optimizer -> cpu",
                         "reference -> cpu", "empty_cache", "wake_up(kv_cache)"]
        assert peak == 64 + 8 <= BUDGET  # the KV cache wakes into the 32 + 16 + 16 GB the offload returned
        assert ledger.used == 8 + 32  # vLLM alone
        worker.rollout.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
        calls, peak = ledger.transition(worker.trainer_mode)
        assert calls == ["sleep(2)", "actor -> cuda", "optimizer -> cuda", "reference -> cuda"]
        assert peak == 64 <= BUDGET
        worker.weights_version += 1  # an update
    assert ledger.overlaps == []


def test_without_offload_the_kv_cache_wakes_beside_training(policy, ledger):
    """Offload off, the order is the same and the budget is the user's to size: 64 + 40 = 104 GB
    over 80, which is what param_offload / optimizer_offload exist to prevent (the test of the
    ledger itself: it sees the overlap the offload removes)."""
    worker = gpu_worker(policy, ledger, [])
    assert ledger.overlaps  # at the engine's start already
    calls, peak = ledger.transition(worker.rollout_mode)
    assert calls == ["wake_up(weights)", "reload_weights", "empty_cache", "wake_up(kv_cache)"]
    assert peak == 104 > BUDGET and ledger.overlaps


def test_sleep_state_belongs_to_the_shared_engine(policy, ledger):
    """Two rollouts over one engine: the second's free_cache does not sleep it again, and its
    sync wakes the weights the first one's sleep released (vLLM would reload into unmapped
    memory otherwise)."""
    model, tokenizer = policy
    config = load_config(None, ["actor_rollout_ref.rollout.name=vllm"]).actor_rollout_ref.rollout
    first = VLLMRollout(model, tokenizer, config, 8, 16, device="cuda")
    second = VLLMRollout(model, tokenizer, config, 8, 16, device="cuda")
    assert first.engine is second.engine and ledger.calls == ["start", "sleep(2)"]  # asleep until a rollout
    first.sync_weights(1)
    first.wake_up(["kv_cache"])
    first.free_cache()
    second.free_cache()
    assert ledger.calls == ["start", "sleep(2)", "wake_up(weights)", "reload_weights", "wake_up(kv_cache)",
                            "sleep(2)"]
    second.sync_weights(1)
    second.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert ledger.calls[6:] == ["wake_up(weights)", "reload_weights", "wake_up(kv_cache)", "generate"]


@pytest.mark.parametrize("device, cuda_visible", [("cuda", False), ("cpu", True)])
def test_the_gpu_path_follows_the_device_not_torch(policy, ledger, monkeypatch, device, cuda_visible):
    """``trainer.device`` decides: cuda starts vLLM with sleep mode and a device fraction although
    torch sees no GPU; cpu sizes the KV cache in bytes although torch sees one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_visible)
    model, tokenizer = policy
    config = load_config(None, ["actor_rollout_ref.rollout.name=vllm"]).actor_rollout_ref.rollout
    args = VLLMRollout(model, tokenizer, config, 8, 16, device=device).llm.args
    if device == "cuda":
        assert args["enable_sleep_mode"] is True and args["gpu_memory_utilization"] == 0.5
        assert "kv_cache_memory_bytes" not in args
    else:
        assert "enable_sleep_mode" not in args and "gpu_memory_utilization" not in args
        assert args["kv_cache_memory_bytes"] > 0
