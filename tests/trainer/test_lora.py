"""LoRA end to end on the tiny model: only the adapter trains, the reference is the base model
(the adapter disabled, no copy), the rollout generates with the adapter, checkpoints hold the
adapter and resume exactly, and `rlvr export` writes a merged transformers folder."""

import json

import pytest
import torch

from rlvr.cli import main
from rlvr.models import load_model
from rlvr.trainer.main import build_trainer

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=5e-2", "trainer.val_before_train=false", "data.val_files=[]")


def trained(tiny_config, *extra):
    trainer = build_trainer(tiny_config(*LORA, *extra), progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    return trainer


def test_only_the_adapter_trains_and_the_reference_is_the_base_model(tiny_config, tiny_model_dir):
    trainer = build_trainer(tiny_config(*LORA), progress_bar=False)
    worker = trainer.wg.worker
    optimized = [p for group in worker.actor.optimizer.param_groups for p in group["params"]]
    names = {id(p): n for n, p in worker.model.named_parameters()}
    assert optimized and all("lora_" in names[id(p)] for p in optimized)
    assert worker.ref is None  # no second copy of the weights
    base_before = {n: p.detach().clone() for n, p in worker.model.named_parameters() if "lora_" not in n}
    trainer.fit()
    trainer.tracker.close()
    for n, p in worker.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), n  # the base weights never move
    assert any(p.abs().sum() > 0 for n, p in worker.model.named_parameters() if "lora_B" in n)  # B left zero

    # ref log-probs = the untouched base model's; the actor's (adapter on) now differ
    from rlvr.trainer.evaluate import generation_batch
    import numpy as np
    batch = next(iter(trainer.loader))
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    gen = generation_batch(batch).repeat(3)
    batch = batch.repeat(3).union(worker.generate_sequences(gen))
    ref = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    actor = worker.compute_log_prob(batch).batch["old_log_probs"]
    from rlvr.workers.actor import Actor
    base = Actor(load_model(tiny_model_dir), worker.actor.config, pad_id=trainer.tokenizer.pad_token_id)
    batch.meta_info.update(temperature=1.0, micro_batch_size=16)
    expected, _ = base.compute_log_prob(batch)
    assert (ref - expected).abs().max() < 1e-5
    assert (actor - ref).abs().max() > 1e-3


def test_rollout_generates_with_the_adapter(tiny_config):
    """Greedy responses of the engine (lean step and transformers step) equal those of the model
    with the adapter merged in, and differ from the base model's."""
    from peft import PeftModel  # noqa: F401  (the merge below goes through peft)
    from rlvr.rollout import NativeRollout, SamplingParams
    from rlvr.config.schema import RolloutConfig
    import copy

    trainer = trained(tiny_config)
    worker = trainer.wg.worker
    merged = copy.deepcopy(worker.model).merge_and_unload().eval()
    prompts = [list(ids) for ids in next(iter(trainer.loader)).non_tensor_batch["raw_prompt_ids"]]
    params = SamplingParams(max_new_tokens=8, do_sample=False)
    worker.rollout_mode()
    got = [c.token_ids for c in worker.rollout.generate(prompts, params)]
    worker.trainer_mode()
    plain = NativeRollout(merged, trainer.tokenizer, RolloutConfig(lean_decode=False), 8)
    assert got == [c.token_ids for c in plain.generate(prompts, params)]
    assert worker.rollout.lean is not None  # the lean step ran, with the adapter's term
    with worker.model.disable_adapter():
        worker.rollout_mode()
        base = [c.token_ids for c in worker.rollout.generate(prompts, params)]
        worker.trainer_mode()
    assert base != got


def test_checkpoint_holds_the_adapter_and_export_merges_it(tiny_config, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    trainer = trained(tiny_config, "trainer.save_freq=2")
    actor_dir = tmp_path / "run" / "checkpoints" / "global_step_2" / "actor"
    assert (actor_dir / "adapter_config.json").exists() and (actor_dir / "adapter_model.safetensors").exists()
    assert not (actor_dir / "model.safetensors").exists()  # the adapter only, not the whole model
    code = main(["export", str(tmp_path / "run"), str(tmp_path / "merged")])
    assert code == 0, capsys.readouterr().err
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        expected = trainer.wg.worker.model(input_ids=ids).logits
        assert (exported(input_ids=ids).logits - expected).abs().max() < 1e-4


def test_lora_run_resumes_exactly(tiny_config, tmp_path, interrupt_and_resume):
    reference = trained(tiny_config, "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'ref'}")
    config = tiny_config(*LORA, "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'cut'}")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 3, "saved step 2")
    for (name, a), b in zip(resumed.wg.worker.model.named_parameters(), reference.wg.worker.model.parameters()):
        assert torch.equal(a, b), name
    volatile = ("timing", "perf/time_per_step", "perf/throughput", "time", "perf/cpu_max_rss_gb")
    records = [[{k: v for k, v in json.loads(line).items() if not k.startswith(volatile)}
                for line in open(tmp_path / run / "metrics.jsonl")] for run in ("ref", "cut")]
    assert records[0] == records[1]


CRITIC_LORA = ("algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=1", "critic.ppo_micro_batch_size_per_gpu=3",
               "critic.model.lora_rank=4", "critic.model.lora_alpha=8", "critic.optim.lr=5e-2",
               "trainer.val_before_train=false", "data.val_files=[]")


def test_critic_with_lora_trains_its_adapter_and_its_value_head_only(tiny_config, tmp_path, interrupt_and_resume):
    trainer = build_trainer(tiny_config(*CRITIC_LORA, f"trainer.default_local_dir={tmp_path / 'ref'}",
                                        "trainer.total_training_steps=3"), progress_bar=False)
    critic = trainer.critic_wg.worker.model
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    trainer.fit()
    trainer.tracker.close()
    changed = {n for n, p in critic.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert changed == trainable  # everything trainable moved (lr 5e-2), nothing else did
    assert any("lora_" in n for n in changed) and any("score" in n for n in changed)
    assert not any("lora_" not in n and "score" not in n for n in changed)  # the backbone stays frozen
    # a resumed run ends with the same critic
    config = tiny_config(*CRITIC_LORA, f"trainer.default_local_dir={tmp_path / 'cut'}", "trainer.total_training_steps=3")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 3, "saved step 2")
    for (name, a), b in zip(resumed.critic_wg.worker.model.named_parameters(), critic.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("targets, tied", [(["q_proj"], True), (["embed_tokens"], False), (["lm_head"], False)])
def test_a_merged_copy_unties_a_tied_layer_the_adapter_changes(tiny_model_dir, targets, tied):
    """vLLM's copy of a LoRA policy holds merged weights: an adapter on the tied embedding or on the
    tied head changes one of the two only, so the copy's config must untie them (it checked the
    embedding alone: an adapted head was merged into the embedding it shares)."""
    from peft import LoraConfig, get_peft_model

    from rlvr.models.lora import merged_config

    model = load_model(str(tiny_model_dir))
    assert model.config.tie_word_embeddings
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    assert merged_config(peft_model).tie_word_embeddings is tied
