"""On-policy distillation through the trainer: verl's keys load or are refused with the reason,
the teacher's tokenizer is checked, a student learns a teacher's preference, a non-finite teacher
row is left out and counted, and ``rlvr plan`` counts the teacher."""

import json
from pathlib import Path

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.config.validate import teacher_entries
from rlvr.models.loader import load_tokenizer
from rlvr.trainer.main import build_trainer
from tests.trainer.conftest import tiny_config, tiny_data  # noqa: F401 (fixtures)

ON = ("distillation.enabled=true",)


def teacher(path):
    return f"distillation.teacher_models.teacher_model.model_path={path}"


@pytest.mark.parametrize("overrides, message", [
    (ON, "needs a teacher: set distillation.teacher_models.teacher_model.model_path"),
    (ON + (teacher("builtin"), "distillation.distillation_loss.loss_mode=k1"),
     "k1 differentiated directly has a gradient that does not depend on the teacher"),
    (ON + (teacher("builtin"), "distillation.distillation_loss.loss_mode=jsd_topk"),
     r"'jsd_topk' is not a distillation loss \(registered: \['abs', 'forward_kl_topk'"),
    (ON + (teacher("builtin"), "distillation.distillation_loss.loss_mode=forward_kl_topk",
           "distillation.distillation_loss.topk=0"), "topk >= 1"),
    (ON + (teacher("builtin"), "distillation.distillation_loss.policy_loss_mode=gspo"), "vanilla PPO clipped loss"),
    (ON + (teacher("builtin"), "distillation.distillation_loss.use_task_rewards=false"),
     "set actor_rollout_ref.actor.use_kl_loss=false and actor_rollout_ref.actor.entropy_coeff=0"),
    (ON + ("distillation.teacher_models.a.model_path=builtin", "distillation.teacher_models.b.model_path=builtin"),
     "distillation.teacher_models.a.key is not set"),
    (ON + ("distillation.teacher_models.a.model_path=builtin", "distillation.teacher_models.a.key=math",
           "distillation.teacher_models.b.model_path=builtin", "distillation.teacher_models.b.key=math"),
     "teacher_models.a and .b both have key='math'"),
    (("distillation.teacher_models.a.modelpath=builtin",), "unknown config key 'distillation.teacher_models.a.modelpath'"),
    (ON + (teacher("builtin"), "distillation.teacher_models.teacher_model.inference.external_server_addresses=[127.0.0.1:1]",
           "distillation.teacher_models.teacher_model.inference.name=trtllm"), "a served teacher speaks sglang"),
])
def test_settings_the_loss_cannot_honour_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, list(overrides))


def test_verls_mopd_script_loads_and_keeps_every_teacher(capsys):
    """verl's multi-teacher script shape (its examples/on_policy_distillation_trainer): the pool keys
    and each teacher's server settings are noted as having no effect; the configured default entry
    ``teacher_model`` beside a named teacher stays a teacher (verl drops it without a word)."""
    cfg = load_config(None, [
        "distillation.enabled=True", "distillation.n_gpus_per_node=8", "distillation.nnodes=1",
        "distillation.teacher_key=data_source",
        "distillation.teacher_models.teacher_model.key=arithmetic", "distillation.teacher_models.teacher_model.model_path=builtin",
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
        "distillation.teacher_models.teacher_model.num_replicas=4",
        "+distillation.teacher_models.code.key=code", "+distillation.teacher_models.code.model_path=builtin",
        "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=True",
        "distillation.distillation_loss.topk=64", "distillation.distillation_loss.use_task_rewards=False",
        "distillation.distillation_loss.loss_max_clamp=10.0", "distillation.distillation_loss.log_prob_min_clamp=-10.0",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0"])
    assert sorted(teacher_entries(cfg.distillation)) == ["arithmetic", "code"]
    notes = capsys.readouterr().err
    assert ("distillation.n_gpus_per_node, distillation.nnodes, distillation.teacher_models.*.inference."
            "tensor_model_parallel_size, distillation.teacher_models.*.num_replicas: rlvr's distillation teachers are "
            "frozen models on the actor's devices") in notes
    # verl's YAML always holds an unconfigured teacher_model: beside a named teacher it is no teacher
    cfg = load_config(None, list(ON) + ["distillation.teacher_models.math.model_path=builtin"])
    assert list(teacher_entries(cfg.distillation)) == ["default"]
    assert teacher_entries(cfg.distillation)["default"].model_path == "builtin"


def test_a_teacher_with_another_vocabulary_is_refused(tiny_config, tmp_path, tiny_model_dir):
    other = tmp_path / "other_teacher"
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.add_tokens(["<tool_result>"])
    tokenizer.save_pretrained(other)
    for name in ("config.json", "model.safetensors"):
        (other / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    cfg = tiny_config(*ON, teacher(other), "data.val_files=[]")
    with pytest.raises(ConfigError, match=r"teacher 'default' \(.*other_teacher\) has a vocabulary of 49153 tokens that "
                                          r"is not the student's \(49152 tokens; they differ at \[\('<tool_result>', 49152\)"):
        build_trainer(cfg, progress_bar=False)


PREFERRED = ("7", "8", "9", "0")


def preferring_teacher(out: Path, tokenizer_dir) -> Path:
    """A model that puts about a fifth of its mass on four tokens wherever it is: its layers add
    nothing to the residual stream (output projections zero), every embedding has the same large
    first component, and only the four tokens' head rows read it: logits 8 for them, 0 elsewhere
    (4 e^8 / (4 e^8 + 49148) = 0.195)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 10.0  # normalised: about 8 in the first component
        model.lm_head.weight.zero_()
        model.lm_head.weight[[tokenizer.convert_tokens_to_ids(t) for t in PREFERRED], 0] = 1.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def records(trainer):
    path = Path(trainer.config.trainer.default_local_dir) / "metrics.jsonl"
    return [json.loads(line) for line in open(path)]


def distil(tiny_config, tmp_path, tokenizer_dir, name, *overrides):
    cfg = tiny_config(*ON, teacher(preferring_teacher(tmp_path / "teacher", tokenizer_dir)),
                      "distillation.distillation_loss.topk=4", "data.val_files=[]", "trainer.val_before_train=false",
                      "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=false",
                      "actor_rollout_ref.actor.optim.lr=1e-1", "trainer.total_training_steps=6",
                      f"trainer.default_local_dir={tmp_path / name}", *overrides)
    trainer = build_trainer(cfg, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    return records(trainer)


def test_a_student_moves_to_its_teachers_tokens(tiny_config, tmp_path, tiny_model_dir):
    """forward_kl_topk alone (verl's GKD mode): the random student's mass on the teacher's four
    tokens goes from ~1e-4 to most of it in 6 steps and the top-k KL falls from 1.5 to near 0, with
    the sampled tokens ending inside the teacher's top-k; the same run with the term weighted 0 (a
    no-op loss beside a task reward that is the same for every sample) stays where it starts."""
    learned = distil(tiny_config, tmp_path, tiny_model_dir, "distil", "distillation.distillation_loss.loss_mode=forward_kl_topk",
                     "distillation.distillation_loss.use_task_rewards=false")
    first, last = learned[0], learned[-1]
    assert first["actor/distillation/student_mass"] < 1e-3 and first["actor/distillation/loss"] > 1.0
    assert last["actor/distillation/student_mass"] > 0.5 and last["actor/distillation/loss"] < 0.1
    assert last["distillation/sampled_in_topk"] > 0.5
    assert first["actor/distillation/teacher_mass"] == pytest.approx(0.195, abs=0.01)
    idle = distil(tiny_config, tmp_path, tiny_model_dir, "idle", "distillation.distillation_loss.loss_mode=forward_kl_topk",
                  "distillation.distillation_loss.distillation_loss_coef=0.0",
                  "reward.custom_reward_function.path=" + str(_constant_reward(tmp_path)))
    assert max(r["actor/distillation/student_mass"] for r in idle) < 1e-3
    assert min(r["actor/distillation/loss"] for r in idle) > 1.0


def _constant_reward(tmp_path):
    path = tmp_path / "constant.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    return path


def test_a_non_finite_teacher_row_is_left_out_and_counted(tiny_config, tmp_path, monkeypatch):
    """A teacher log-prob that is NaN on one sample: that sample carries no loss (its train_mask is
    0, the loss stays finite) and the step counts it; the other rows train."""
    from rlvr.workers.hybrid import ActorRolloutRefWorker

    original = ActorRolloutRefWorker.compute_teacher_log_prob
    seen = {}

    def poisoned(self, data):
        out = original(self, data)
        out.batch["teacher_log_prob"][1, 0] = float("nan")
        return out

    monkeypatch.setattr(ActorRolloutRefWorker, "compute_teacher_log_prob", poisoned)
    cfg = tiny_config(*ON, teacher("builtin"), "data.val_files=[]", "trainer.val_before_train=false",
                      "trainer.total_training_steps=1")
    trainer = build_trainer(cfg, progress_bar=False)
    update = trainer.wg.update_actor

    def record(batch):
        seen["train_mask"] = batch.batch["train_mask"].clone()
        return update(batch)

    trainer.wg.update_actor = record
    trainer.fit()
    trainer.tracker.close()
    (record_,) = records(trainer)
    assert record_["distillation/nonfinite_samples"] == 1.0
    assert seen["train_mask"][1].sum() == 0 and seen["train_mask"][0].sum() > 0
    assert torch.isfinite(torch.tensor(record_["actor/distillation/loss"])) and record_["actor/grad_norm"] > 0


def test_plan_counts_the_teacher(tiny_model_dir):
    from rlvr.trainer.memory_plan import plan_memory, read_model_config

    base = [f"actor_rollout_ref.model.path={tiny_model_dir}"]
    plain = plan_memory(load_config(None, base), read_model_config(str(tiny_model_dir)), 16)
    cfg = load_config(None, base + list(ON) + [teacher(tiny_model_dir)])
    plan = plan_memory(cfg, read_model_config(str(tiny_model_dir)), 16)
    params = plan.params
    assert plan.terms["teachers"].bytes == 4 * params  # one fp32 copy of a teacher the student's size
    for phase in ("init", "generation", "update"):
        assert plan.phase_bytes(phase) == pytest.approx(plain.phase_bytes(phase) + 4 * params)


def test_a_run_with_a_served_teacher(tiny_config, tmp_path, tiny_model_dir):
    """``inference.external_server_addresses``: the teacher is an ``rlvr serve`` process the run did
    not start; the plan holds no teacher on the device, and the step trains on its scores."""
    from rlvr.config.schema import RolloutConfig, RolloutServerConfig
    from rlvr.models.tiny import save_tiny_model
    from rlvr.rollout.servers import start_local_replicas, stop_process
    from rlvr.trainer.memory_plan import plan_memory, read_model_config
    from rlvr.workers.teacher import ServedTeacher

    teacher_dir = save_tiny_model(tmp_path / "teacher", tokenizer_path=str(tiny_model_dir), seed=1)
    config = RolloutConfig(mode="async", name="native", max_model_len=256, server=RolloutServerConfig())
    (replica,) = start_local_replicas(str(teacher_dir), config, 1, tmp_path, 256, on_cpu=True)
    try:
        cfg = tiny_config(*ON, teacher(teacher_dir), "distillation.distillation_loss.loss_mode=forward_kl_topk",
                          "distillation.distillation_loss.topk=4",
                          f"distillation.teacher_models.teacher_model.inference.external_server_addresses=[{replica.address}]",
                          "data.val_files=[]", "trainer.val_before_train=false", "trainer.total_training_steps=1")
        assert "teachers" not in plan_memory(cfg, read_model_config(str(tiny_model_dir)), 16).terms
        trainer = build_trainer(cfg, progress_bar=False)
        assert isinstance(trainer.wg.worker.teachers.actors["default"], ServedTeacher)
        trainer.fit()
        trainer.tracker.close()
    finally:
        stop_process(replica.process)
    (record,) = records(trainer)
    # two random tiny models: the student's tokens are ~uniform under the teacher too (log 49152 = 10.8)
    assert -12.0 < record["distillation/teacher_log_prob"] < -10.0
    assert record["actor/distillation/loss"] > 0 and record["timing_s/teacher"] > 0
