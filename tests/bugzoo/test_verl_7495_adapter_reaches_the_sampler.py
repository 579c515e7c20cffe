"""verl #7495 (https://github.com/verl-project/verl/issues/7495) and ms-swift #9855
(https://github.com/modelscope/ms-swift/issues/9855): with LoRA, the rollout engine never received
the trained adapter (verl's sync pushed the frozen base weights, "0 of them lora_"; swift's async
vLLM server kept sampling from the base model), and the runs trained on silently, on samples of
the initial policy.

Here a LoRA run on the tiny model, with a learning rate that moves its greedy tokens within two
updates: with the adapter reaching the engine, the freshness probe passes at every step;
with either of the two ways rlvr's native engine receives the adapter cut off, the run stops.
"""

import json
from pathlib import Path

import pytest
import torch

import rlvr.rollout.lean
from rlvr.errors import StopTraining
from rlvr.rollout.engine import NativeRollout
from rlvr.trainer.main import build_trainer
from rlvr.trainer.guards import freshness_tolerance

LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=0.05", "trainer.total_training_steps=3", "trainer.freshness_check_freq=1",
        "trainer.val_before_train=false", "data.val_files=[]"]


def base_weights_only(self, version=None):
    """The sync of verl #7495: every tensor of the model but the adapter's."""
    with torch.no_grad():
        for (name, dst), src in zip(self.model.named_parameters(), self.actor_model.parameters()):
            if "lora_" not in name:
                dst.copy_(src)


def decode_without_adapters(monkeypatch):
    """The lean step blind to the adapter both ways it sees one: merged into the packed projections
    (``active_adapters``) and added per projection (``lora_delta``)."""
    monkeypatch.setattr(rlvr.rollout.lean, "active_adapters", lambda layer: [])
    monkeypatch.setattr(rlvr.rollout.lean, "lora_delta", lambda proj, x: None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_lora_run_whose_engine_gets_the_adapter_passes_the_probe(tiny_config, dtype):
    """float32: the engine shares the actor's peft model (its lean step merges the adapter into its
    packed projections, or adds the adapter's term where nothing is packed); bfloat16: the engine
    holds a copy, adapter included, refreshed at every sync.
    fails when the adapter's way to the engine is cut: the lean step blind to the adapter
    (``decode_without_adapters``), or ``NativeRollout.sync_weights`` skipping the ``lora_`` tensors."""
    config = tiny_config(*LORA, f"actor_rollout_ref.rollout.dtype={dtype}")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    records = [json.loads(line) for line in open(Path(config.trainer.default_local_dir) / "metrics.jsonl")]
    probed = [r for r in records if r.get("training/freshness/probe_tokens", 0) > 0]
    assert {2, 3} <= {r["step"] for r in probed}  # after one and two updates of the adapter
    # the tiny model's logits are small: the tolerance is its floor, 0.01 (fp32) or 0.25 (bf16)
    assert {r["training/freshness/greedy_gap_tolerance"] for r in probed} == {freshness_tolerance(config, 0.0)}
    assert all(r["training/freshness/greedy_gap_max"] <= r["training/freshness/greedy_gap_tolerance"] for r in probed)


@pytest.mark.parametrize("dtype, cut", [
    ("bfloat16", lambda monkeypatch: monkeypatch.setattr(NativeRollout, "sync_weights", base_weights_only)),
    ("float32", lambda monkeypatch: decode_without_adapters(monkeypatch)),
], ids=["copy-synced-without-the-adapter", "shared-model-decoded-without-the-adapter"])
def test_a_lora_run_whose_engine_misses_the_adapter_stops(tiny_config, monkeypatch, dtype, cut):
    """fails when the freshness probe (``_check_freshness`` in rlvr/trainer/ppo_trainer.py, called at
    the start of ``train_step``) is removed: the run then trains on the base model's samples."""
    cut(monkeypatch)
    trainer = build_trainer(tiny_config(*LORA, f"actor_rollout_ref.rollout.dtype={dtype}"), progress_bar=False)
    # the greedy probe's token check, or (first, since issue 48) the engine-against-actor drift of its log-probs
    with pytest.raises(StopTraining, match=r"step [23]: the rollout engine( does not hold the actor's weights|'s "
                                           r"log-probs have drifted from the actor's)"):
        trainer.fit()
    trainer.tracker.close()
