"""The actor's distillation term on the tiny model: the teacher's top-k through the same forward,
the gradient of an optimizer step invariant to micro-batching and packing (as every loss term's),
and the teachers routed per row."""

import numpy as np
import pytest
import torch

from rlvr.config import ConfigError
from rlvr.config.schema import DistillationConfig, DistillationLossConfig, TeacherModelConfig
from rlvr.models import load_model
from rlvr.models.tiny import save_tiny_model
from rlvr.workers.actor import Actor
from rlvr.workers.teacher import Teachers
from tests.workers.test_actor import make_actor, with_training_keys

FORWARD = ("input_ids", "attention_mask", "position_ids", "responses")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, builtin_dir):
    return save_tiny_model(tmp_path_factory.mktemp("teacher"), tokenizer_path=str(builtin_dir), seed=1)


def distillation(mode="k3", topk=4, **loss):
    return DistillationConfig(enabled=True, teacher_models={"teacher_model": TeacherModelConfig(model_path="x")},
                              distillation_loss=DistillationLossConfig(loss_mode=mode, topk=topk, **loss))


def teacher_actor(teacher_dir):
    model = load_model(teacher_dir).requires_grad_(False)
    return Actor(model, make_actor(teacher_dir).config, pad_id=0)


def with_teacher(batch, teacher_dir, config):
    out = Teachers({"default": teacher_actor(teacher_dir)}, config).compute(batch)
    for key in out.batch.keys():
        batch.batch[key] = out.batch[key]
    return batch


def test_teacher_top_k_is_the_full_forwards(batch, teacher_dir):
    """The teacher's top-k from the prompt-once forward equal ``topk`` of the plain model's
    log-softmax at each response position, and its log-prob of the sampled token that log-softmax's."""
    out = Teachers({"default": teacher_actor(teacher_dir)}, distillation("forward_kl_topk", topk=3)).compute(batch)
    model = load_model(teacher_dir)
    b = batch.batch
    P = b["input_ids"].shape[1] - b["responses"].shape[1]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                       position_ids=b["position_ids"]).logits[:, P - 1:-1].float(), -1)  # (B, R, V)
    mask = b["response_mask"].bool()
    values, ids = logp.topk(3, dim=-1)
    assert torch.equal(out.batch["teacher_topk_ids"][mask], ids[mask])
    assert torch.allclose(out.batch["teacher_topk_log_probs"][mask], values[mask], atol=1e-5)
    sampled = logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out.batch["teacher_log_prob"][mask], sampled[mask], atol=1e-5)


def step_gradient(tiny_model_dir, batch, teacher_dir, monkeypatch, config, **actor_cfg):
    """One optimizer step's gradient, read before clipping, with the distillation term alone
    (``use_task_rewards`` False: a wrong weighting of the term would show in full)."""
    import rlvr.workers.actor as actor_module

    actor = make_actor(tiny_model_dir, use_kl_loss=False, entropy_coeff=0.0, ppo_mini_batch_size=2, **actor_cfg)
    actor.distillation = config
    batch = with_teacher(with_training_keys(actor, batch), teacher_dir, config)
    seen = []

    def record_then_skip(model, optimizer, grad_clip):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone())
        return 1.0, True

    monkeypatch.setattr(actor_module, "clip_and_step", record_then_skip)
    metrics = actor.update_policy(batch)
    return seen[0], metrics


@pytest.mark.parametrize("mode, extra", [("k3", {}), ("forward_kl_topk", {}), ("abs", {"loss_max_clamp": 0.5}),
                                         ("k1", {"use_policy_gradient": True})])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gradient_invariant_to_micro_batching(batch, tiny_model_dir, teacher_dir, monkeypatch, mode, extra, agg):
    config = distillation(mode, use_task_rewards=False, **extra)
    ref, metrics = step_gradient(tiny_model_dir, batch, teacher_dir, monkeypatch, config,
                                 ppo_micro_batch_size_per_gpu=6, share_prompt_forward=False, loss_agg_mode=agg)
    assert ref.norm() > 0
    assert metrics["actor/distillation/loss"] != 0.0
    for kwargs in ({"ppo_micro_batch_size_per_gpu": 1, "share_prompt_forward": False},
                   {"ppo_micro_batch_size_per_gpu": 2, "share_prompt_forward": True},
                   {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40, "share_prompt_forward": True}):
        other, other_metrics = step_gradient(tiny_model_dir, batch, teacher_dir, monkeypatch, config,
                                             loss_agg_mode=agg, **kwargs)
        assert ((other - ref).norm() / ref.norm()) < 1e-4, kwargs
        assert other_metrics["actor/distillation/loss"] == pytest.approx(metrics["actor/distillation/loss"], rel=1e-4)


def test_task_loss_and_coefficient(batch, tiny_model_dir, teacher_dir, monkeypatch):
    """With the task rewards the step's gradient is the policy loss's plus coef x the term's: the
    gradients of coef 0.5 and coef 0 differ by half those of coef 1 and coef 0."""
    grads = {c: step_gradient(tiny_model_dir, batch, teacher_dir, monkeypatch,
                              distillation("k3", distillation_loss_coef=c), ppo_micro_batch_size_per_gpu=6)[0]
             for c in (0.0, 0.5, 1.0)}
    half, full = grads[0.5] - grads[0.0], grads[1.0] - grads[0.0]
    assert full.norm() > 0
    assert ((half - 0.5 * full).norm() / full.norm()) < 1e-4  # float32 sums of the whole step's gradient


def test_two_teachers_each_score_their_rows(batch, tiny_model_dir, teacher_dir):
    """Rows routed by data_source: each row's teacher log-probs are its own teacher's (the other
    teacher gives other numbers), and a row no teacher takes is named."""
    config = DistillationConfig(enabled=True, teacher_key="data_source", teacher_models={
        "math": TeacherModelConfig(key="math", model_path=str(teacher_dir)),
        "code": TeacherModelConfig(key="code", model_path=str(tiny_model_dir))})
    teachers = Teachers({"math": teacher_actor(teacher_dir), "code": teacher_actor(tiny_model_dir)}, config)
    batch.non_tensor_batch["data_source"] = np.array(["math", "code", "math", "code", "code", "math"], dtype=object)
    routed = teachers.compute(batch).batch["teacher_log_prob"]
    alone = {key: Teachers({"default": actor}, distillation()).compute(batch).batch["teacher_log_prob"]
             for key, actor in teachers.actors.items()}
    mask = batch.batch["response_mask"].bool()
    for row, source in enumerate(batch.non_tensor_batch["data_source"]):
        other = "code" if source == "math" else "math"
        assert torch.allclose(routed[row][mask[row]], alone[source][row][mask[row]], atol=1e-6)
        assert not torch.allclose(routed[row][mask[row]], alone[other][row][mask[row]], atol=1e-3)
    batch.non_tensor_batch["data_source"][4] = "poetry"
    with pytest.raises(ConfigError, match="row 4: its 'data_source' is 'poetry'.*'code', 'math'"):
        teachers.compute(batch)


def served_teacher(model_dir, tmp_path, name, topk_allowed=None):
    """One server process holding the teacher (rlvr serve, or vLLM's CPU build), started as the
    rollout starts its replicas: a free loopback port, /health waited on, stopped by its pid."""
    from rlvr.config.schema import RolloutConfig, RolloutServerConfig
    from rlvr.rollout.servers import start_local_replicas

    config = RolloutConfig(mode="async", name=name, max_num_seqs=8, max_model_len=256,
                           server=RolloutServerConfig(max_start_wait_time=300))
    from transformers import AutoConfig

    (replica,) = start_local_replicas(str(model_dir), config, 1, tmp_path, 256, AutoConfig.from_pretrained(model_dir),
                                      on_cpu=True)
    return replica


def assert_scores_as_in_process(batch, model_dir, replica, protocol, atol):
    from rlvr.workers.teacher import ServedTeacher

    entry = TeacherModelConfig(model_path=str(model_dir))
    entry.inference.external_server_addresses, entry.inference.name = [replica.address], protocol
    config = distillation("forward_kl_topk", topk=3)
    served = Teachers({"default": ServedTeacher(entry, timeout=60, start_wait=60)}, config).compute(batch).batch
    local = Teachers({"default": teacher_actor(model_dir)}, config).compute(batch).batch
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(served["teacher_log_prob"][mask], local["teacher_log_prob"][mask], atol=atol)
    assert torch.allclose(served["teacher_topk_log_probs"][mask], local["teacher_topk_log_probs"][mask], atol=atol)
    assert (served["teacher_topk_ids"][mask] == local["teacher_topk_ids"][mask]).float().mean() > 0.99  # ties aside
    assert (served["teacher_log_prob"][~mask] == 0).all()  # padding stays empty


def test_a_teacher_on_rlvr_serve_scores_as_the_in_process_one(batch, teacher_dir, tmp_path):
    """SGLang's prompt log-probs from an ``rlvr serve`` process equal the in-process teacher's."""
    from rlvr.rollout.servers import stop_process

    replica = served_teacher(teacher_dir, tmp_path, "native")
    try:
        assert_scores_as_in_process(batch, teacher_dir, replica, "sglang", atol=1e-4)
    finally:
        stop_process(replica.process)


@pytest.mark.slow
def test_a_teacher_on_vllm_serve_scores_as_the_in_process_one(batch, tiny_vllm_model_dir, tmp_path):
    """vLLM's ``prompt_logprobs`` from a ``vllm serve`` process (its CPU build, fp32) equal the
    in-process teacher's within vLLM's own arithmetic."""
    from rlvr.rollout.servers import stop_process

    replica = served_teacher(tiny_vllm_model_dir, tmp_path, "vllm")
    try:
        assert_scores_as_in_process(batch, tiny_vllm_model_dir, replica, "vllm", atol=2e-3)
    finally:
        stop_process(replica.process)


def test_a_failing_teacher_server_leaves_the_rotation(batch, teacher_dir, tmp_path):
    """Two servers, one answering /health but failing every score: its rows go to the other (the
    scores still the in-process teacher's), and once none is left the error names each server."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from rlvr.errors import RolloutUnavailable
    from rlvr.rollout.servers import stop_process
    from rlvr.workers.teacher import ServedTeacher
    from tests.serve.test_serve import Uvicorn

    broken = FastAPI()
    broken.get("/health")(lambda: {})
    broken.post("/generate")(lambda: JSONResponse({"error": "no model"}, status_code=500))
    replica = served_teacher(teacher_dir, tmp_path, "native")
    try:
        with Uvicorn(app=broken) as url:
            entry = TeacherModelConfig(model_path=str(teacher_dir))
            entry.inference.external_server_addresses = [url.removeprefix("http://"), replica.address]
            teacher = ServedTeacher(entry, timeout=60, start_wait=60)
            config = distillation("forward_kl_topk", topk=3)
            served = Teachers({"default": teacher}, config).compute(batch).batch
            local = Teachers({"default": teacher_actor(teacher_dir)}, config).compute(batch).batch
            mask = batch.batch["response_mask"].bool()
            assert torch.allclose(served["teacher_log_prob"][mask], local["teacher_log_prob"][mask], atol=1e-4)
            assert teacher.replicas[0].down is not None and "HTTP 500" in teacher.replicas[0].down
            assert teacher.replicas[1].down is None
            teacher.replicas[1].down = "stopped for the test"
            with pytest.raises(RolloutUnavailable, match="HTTP 500.*stopped for the test"):
                Teachers({"default": teacher}, config).compute(batch)
    finally:
        stop_process(replica.process)


def test_a_teacher_server_answering_200_with_garbage_leaves_the_rotation_named(teacher_dir):
    """A 200 whose body is not SGLang's answer (here ``meta_info`` a number) takes that server out
    with the reason, as an error status does; it used to end the run with an AttributeError."""
    from fastapi import FastAPI

    from rlvr.errors import RolloutUnavailable
    from rlvr.workers.teacher import ServedTeacher
    from tests.serve.test_serve import Uvicorn

    broken = FastAPI()
    broken.get("/health")(lambda: {})
    broken.post("/generate")(lambda: {"meta_info": 5})
    with Uvicorn(app=broken) as url:
        entry = TeacherModelConfig(model_path=str(teacher_dir))
        entry.inference.external_server_addresses = [url.removeprefix("http://")]
        teacher = ServedTeacher(entry, timeout=30, start_wait=30)
        with pytest.raises(RolloutUnavailable, match=r"HTTP 200 on /generate with a body that is not its answer "
                                                     r"\(AttributeError"):
            teacher._score([1, 2, 3, 4], 2, 0)
