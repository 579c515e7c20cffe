"""FSDP2 on 2 CPU ranks (gloo) equals one process: the same sampled tokens, log-probs, loss
metrics, gradient norms and final weights after several optimizer steps, with several mini-
and micro-batches, two PPO epochs, the prompt-once forward on and off, and a sharded reference;
and a checkpoint written by 2 ranks resumes in one process exactly where one process would be.
Rows stop early (a stop string), so the ranks answer responses of different widths and the
joined batch must have the one process's layout.

Each rank is its own process (``parity_rank.py``, started as torchrun would), rendezvousing on
127.0.0.1 only."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlvr
from rlvr.algos.losses import LOSS_AGG_MODES
from rlvr.distributed.worker import free_port

RANK_SCRIPT = Path(__file__).with_name("parity_rank.py")
# the tiny random model never samples its EOS; a stop string that about one token in four holds
# ends rows after 1 to 6 tokens, so the ranks' longest rows (their response widths) differ
STOP_EARLY = "actor_rollout_ref.rollout.stop=[r]"


def base_overrides(model_dir, world, strategy, *extra):
    return [f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu", f"trainer.n_gpus_per_node={world}",
            f"actor_rollout_ref.actor.strategy={strategy}", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=6", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
            STOP_EARLY, *extra]


def run_ranks(tmp, name, world, overrides, steps, first_step=0, resume_from=None, loss_agg_modes=None):
    out = Path(tmp) / name
    out.mkdir(parents=True)
    spec = out / "spec.json"
    spec.write_text(json.dumps({"overrides": overrides, "steps": steps, "first_step": first_step,
                                "resume_from": str(resume_from) if resume_from else None,
                                "loss_agg_modes": loss_agg_modes}))
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1]),  # the rlvr under test
               "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        if world == 1:
            for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
                env.pop(key)
        procs.append(subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(spec), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    except subprocess.TimeoutExpired:  # ranks out of step in a collective wait forever: never leave them behind
        for p in procs:
            p.kill()
        raise AssertionError(f"the {world} ranks did not finish in 180 s (a collective out of step?)") from None
    failed = [f"rank {rank} failed:\n{log[-3000:]}" for rank, (p, log) in enumerate(zip(procs, logs)) if p.returncode]
    assert not failed, "\n".join(failed[::-1])  # the last rank's error first: rank 0 often only lost its peer
    return torch.load(out / "record.pt", weights_only=False), load_file(out / "checkpoint" / "actor" /
                                                                         "model.safetensors")


def assert_same_run(got, expected, atol=2e-5):
    rec, weights = got
    ref_rec, ref_weights = expected
    # the layout too: the joined batch is as wide as the one process's
    assert [r.shape for r in rec["responses"]] == [r.shape for r in ref_rec["responses"]]
    for key in ("responses", "old_log_probs", "ref_log_prob", "teacher_log_prob", "teacher_topk_log_probs"):
        assert len(rec[key]) == len(ref_rec[key]), key
        for a, b in zip(rec[key], ref_rec[key]):
            assert torch.allclose(a.float(), b.float(), atol=atol), key
    assert len(rec["metrics"]) == len(ref_rec["metrics"])
    for m, r in zip(rec["metrics"], ref_rec["metrics"]):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac",
                    "actor/ppo_kl", "perf/actor_forward_tokens"):
            assert m[key] == pytest.approx(r[key], rel=1e-4, abs=atol), key
    assert weights.keys() == ref_weights.keys()
    assert_same_weights(weights, ref_weights, atol)


def assert_same_weights(weights, ref_weights, atol=2e-5):
    """Within fp32 rounding. Adam divides each gradient by its own running magnitude, so an entry
    whose gradient is ~1e-9 (a rarely used embedding row) turns a rounding difference of the
    reduction order into a visible step: a handful of the 3.1M embedding entries may differ by up
    to a few 1e-4 (still well under one lr=1e-2 step); every other entry agrees to ``atol``. How
    many depends on the CPU's reduction order: up to 8 where the suite was first run, 37-41 on an
    AVX2-only AMD EPYC (the same code), so up to 64 of them (2e-5 of the entries) pass."""
    for key in weights:
        diff = (weights[key] - ref_weights[key]).abs()
        assert int((diff > atol).sum()) <= 64 and float(diff.max()) < 1e-3, (key, int((diff > atol).sum()),
                                                                             float(diff.max()))


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["actor_rollout_ref.actor.share_prompt_forward=true"],
    ["actor_rollout_ref.actor.share_prompt_forward=false"],
    # micro-batches by a token budget: the ranks get different numbers of them and the ones with
    # fewer repeat a zero-weight pass so that the sharded model's collectives stay in step
    # (rows of the full 6 tokens: rows stopped early all fit the budget alike)
    ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=45",
     "data.max_prompt_length=39",  # prompts of 33-39 tokens: a group of 2 x 6 fits 45 only after a short prompt
     "actor_rollout_ref.rollout.stop=[]"],
], ids=["prompt-once", "plain", "dynamic-bsz"])
def test_two_fsdp2_ranks_equal_one_process(tiny_model_dir, tmp_path, extra):
    one = run_ranks(tmp_path, "one", 1, base_overrides(tiny_model_dir, 1, "local", *extra), steps=2)
    two = run_ranks(tmp_path, "two", 2, base_overrides(tiny_model_dir, 2, "fsdp2", *extra), steps=2)
    assert_same_run(two, one)
    if "actor_rollout_ref.rollout.stop=[]" not in extra:
        # the case that matters: some step's ranks answered responses of different widths
        assert any(len(set(widths)) > 1 for widths in two[0]["rank_widths"]), two[0]["rank_widths"]
    # the run moved: 2 steps x 2 epochs x 2 mini-batches at lr 1e-2 changed the weights
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    moved = max(float((two[1][k] - initial[k]).abs().max()) for k in initial if k in two[1])
    assert moved > 1e-3
    assert len(two[0]["metrics"]) == 2 and two[0]["metrics"][0]["actor/grad_norm"] > 0


@pytest.mark.slow
def test_every_loss_agg_mode_is_the_same_over_1_2_and_4_ranks(tiny_model_dir, tmp_path):
    """miles #3231: a loss normalised by each rank's own tokens makes the gradient depend on the
    number of ranks. One step per loss_agg_mode (8 prompts x 2, mini-batches of 4 prompts: 2 optimizer
    steps a step, each rank of 4 holding one group of each); the 2- and 4-rank runs equal one process."""
    extra = ("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_epochs=1")
    one = run_ranks(tmp_path, "one", 1, base_overrides(tiny_model_dir, 1, "local", *extra), steps=4,
                    loss_agg_modes=list(LOSS_AGG_MODES))
    grad_norms = [m["actor/grad_norm"] for m in one[0]["metrics"]]
    assert len(set(grad_norms)) == 4 and min(grad_norms) > 0
    for world in (2, 4):
        got = run_ranks(tmp_path, f"ranks{world}", world, base_overrides(tiny_model_dir, world, "fsdp2", *extra),
                        steps=4, loss_agg_modes=list(LOSS_AGG_MODES))
        assert_same_run(got, one)


@pytest.mark.slow
def test_two_fsdp2_ranks_with_vllm_equal_one_process(tiny_vllm_model_dir, tmp_path):
    """rollout.name=vllm: each rank runs its own in-process vLLM engine beside the ranks' process
    group, fed weights gathered from the shards; every row is seeded by its place in the whole
    batch, so the 2 ranks sample the one process's tokens and train to its weights. With
    tensor_model_parallel_size=2 one engine spans both ranks (vLLM's external launcher, each rank
    holding half of every layer): the leader generates both ranks' rows, the other rank's engine
    follows it, and each gets its own rows back; that run equals the one process's too."""
    vllm = "actor_rollout_ref.rollout.name=vllm"
    one = run_ranks(tmp_path, "one", 1, base_overrides(tiny_vllm_model_dir, 1, "local", vllm), steps=2)
    initial = load_file(Path(tiny_vllm_model_dir) / "model.safetensors")
    for tp in (1, 2):
        two = run_ranks(tmp_path, f"tp{tp}", 2, base_overrides(
            tiny_vllm_model_dir, 2, "fsdp2", vllm, f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"),
            steps=2)
        assert_same_run(two, one)
        assert (one[0]["vllm_tp"], two[0]["vllm_tp"]) == (1, tp)
        assert two[0]["vllm_qkv_rows"] * tp == one[0]["vllm_qkv_rows"]  # this rank's share of the layer
        if tp == 1:  # (with TP=2 both ranks answer slices of the leader's one batch: one width)
            assert any(len(set(widths)) > 1 for widths in two[0]["rank_widths"]), two[0]["rank_widths"]
        assert max(float((two[1][k] - initial[k]).abs().max()) for k in initial if k in two[1]) > 1e-3  # it trained


@pytest.mark.slow
def test_two_fsdp2_ranks_with_a_sharded_teacher_equal_one_process(tiny_model_dir, tmp_path):
    """On-policy distillation with its teacher sharded like the reference: the teacher's log-probs and
    top-k, the distillation loss and the weights after two steps equal one process's."""
    extra = ("distillation.enabled=true", f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}",
             "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=3")
    one = run_ranks(tmp_path, "one", 1, base_overrides(tiny_model_dir, 1, "local", *extra), steps=2)
    two = run_ranks(tmp_path, "two", 2, base_overrides(tiny_model_dir, 2, "fsdp2", *extra), steps=2)
    assert_same_run(two, one)
    assert len(two[0]["teacher_topk_log_probs"]) == 2
    for m, r in zip(two[0]["metrics"], one[0]["metrics"]):
        assert m["actor/distillation/loss"] == pytest.approx(r["actor/distillation/loss"], rel=1e-4, abs=2e-5)


@pytest.mark.slow  # 15 s: make test stays under 15 minutes
def test_one_fsdp2_rank_in_process_equals_the_local_strategy(tiny_model_dir, tmp_path):
    """strategy=fsdp2 on one device: a process group of one (the sharded code path, for debugging
    and for one GPU) trains exactly as strategy=local."""
    local = run_ranks(tmp_path, "local", 1, base_overrides(tiny_model_dir, 1, "local"), steps=2)
    sharded = run_ranks(tmp_path, "sharded", 1, base_overrides(tiny_model_dir, 1, "fsdp2"), steps=2)
    assert_same_run(sharded, local)


@pytest.mark.slow  # 17 s: make test stays under 15 minutes
def test_sharded_engine_gathers_fresh_weights_per_rollout_and_frees_them_for_training(tiny_model_dir, tmp_path):
    """Under FSDP2 the engine holds unsharded weights only while a rollout runs: none after
    loading, none during any update, all of them (bf16, the rollout dtype: half the fp32
    bytes) in a rollout, where they equal the actor's current weights after the updates, and
    the engine decodes on them (no copy of its own)."""
    bf16 = "actor_rollout_ref.rollout.dtype=bfloat16"
    rec, _ = run_ranks(tmp_path, "sharded", 2, base_overrides(tiny_model_dir, 2, "fsdp2", bf16), steps=2)
    local, _ = run_ranks(tmp_path, "local", 1, base_overrides(tiny_model_dir, 1, "local", bf16), steps=2)
    from rlvr.models import load_model

    model = load_model(tiny_model_dir)
    bf16_bytes = 2 * sum(p.numel() for p in model.parameters())  # each tied tensor once
    assert rec["engine_bytes_at_init"] == 0
    assert rec["engine_bytes_in_update"] == [0, 0]
    facts = rec["engine"]
    assert facts["dtype"] == "torch.bfloat16" and facts["bytes_in_rollout"] == bf16_bytes
    assert facts["bytes_after"] == 0 and facts["loads"] == 3  # two steps' rollouts and this check's
    assert facts["engine_is_rollout_model"]  # the engine decodes on them: no copy of its own
    assert facts["max_diff"] == 0.0  # the actor's weights after two updates, cast to bf16
    # before any update the weights are the same bits: the same tokens. After one, the two runs' fp32
    # weights differ by reduction-order rounding, which a bf16 cast can turn into a different token
    # (the fp32 parity tests compare every step); max_diff above shows the engine is current
    assert torch.equal(rec["responses"][0], local["responses"][0])


@pytest.mark.slow
def test_checkpoints_resume_on_another_number_of_ranks(tiny_model_dir, tmp_path):
    one_rank = base_overrides(tiny_model_dir, 1, "local")
    straight = run_ranks(tmp_path, "straight", 1, one_rank, steps=3)
    run_ranks(tmp_path, "two", 2, base_overrides(tiny_model_dir, 2, "fsdp2"), steps=2)
    resumed = run_ranks(tmp_path, "resumed", 1, one_rank, steps=1, first_step=2,
                        resume_from=tmp_path / "two" / "checkpoint")
    # the third step after a 2-rank start equals the third step of the one-process run
    assert resumed[0]["metrics"][0]["actor/grad_norm"] == pytest.approx(straight[0]["metrics"][2]["actor/grad_norm"],
                                                                       rel=1e-4)
    assert_same_weights(resumed[1], straight[1])
    # and the other way: a one-process checkpoint resumed on 2 ranks, where rank 0 alone reads it
    run_ranks(tmp_path, "one", 1, one_rank, steps=2)
    resumed = run_ranks(tmp_path, "resumed_on_two", 2, base_overrides(tiny_model_dir, 2, "fsdp2"), steps=1,
                        first_step=2, resume_from=tmp_path / "one" / "checkpoint")
    assert resumed[0]["metrics"][0]["actor/grad_norm"] == pytest.approx(straight[0]["metrics"][2]["actor/grad_norm"],
                                                                       rel=1e-4)
    assert_same_weights(resumed[1], straight[1])


@pytest.mark.slow
def test_a_legacy_checkpoint_resumes_on_two_ranks(tiny_model_dir, tmp_path):
    """A one-process checkpoint from before name-keyed optimizer states (optimizer.state_dict():
    parameters by their place in the groups) resumed on 2 ranks: rank 0, which alone reads it,
    used to take a loading path of its own while the other rank waited in a broadcast for ever."""
    one_rank = base_overrides(tiny_model_dir, 1, "local")
    straight = run_ranks(tmp_path, "straight", 1, one_rank, steps=3)
    run_ranks(tmp_path, "one", 1, one_rank, steps=2)
    as_legacy(tmp_path / "one" / "checkpoint" / "actor_state.pt")
    resumed = run_ranks(tmp_path, "legacy_on_two", 2, base_overrides(tiny_model_dir, 2, "fsdp2"), steps=1,
                        first_step=2, resume_from=tmp_path / "one" / "checkpoint")
    # the third step equals the one-process run's: the moments were restored, not restarted
    assert resumed[0]["metrics"][0]["actor/grad_norm"] == pytest.approx(straight[0]["metrics"][2]["actor/grad_norm"],
                                                                       rel=1e-4)
    assert_same_weights(resumed[1], straight[1])


def as_legacy(state_file: Path) -> None:
    """Rewrite a checkpoint's name-keyed optimizer state as ``optimizer.state_dict()`` wrote it."""
    state = torch.load(state_file, weights_only=False)
    optimizer = state["optimizer"]
    place = {name: i for i, name in enumerate(p for group in optimizer["param_groups"] for p in group["params"])}
    state["optimizer"] = {"state": {place[name]: v for name, v in optimizer["state"].items()},
                          "param_groups": [{**g, "params": [place[p] for p in g["params"]]}
                                           for g in optimizer["param_groups"]]}
    assert state["optimizer"]["state"] and all(isinstance(k, int) for k in state["optimizer"]["state"])
    torch.save(state, state_file)


def test_the_critic_is_sharded_like_the_actor(tiny_model_dir):
    """strategy=fsdp2 shards the critic too (its equality with one process is checked on 2 Ray
    workers in tests/trainer/test_ray_training.py): every parameter is a DTensor shard, and its
    checkpoint is the one-process layout (a Hugging Face folder with the value head)."""
    code = f"""
import tempfile
from pathlib import Path
from torch.distributed.tensor import DTensor
from rlvr.config import load_config
from rlvr.trainer.main import critic_args
from rlvr.workers.critic import CriticWorker
cfg = load_config(None, ["actor_rollout_ref.model.path={tiny_model_dir}", "critic.model.path={tiny_model_dir}",
                         "trainer.device=cpu", "actor_rollout_ref.actor.strategy=fsdp2", "algorithm.adv_estimator=gae"])
critic = CriticWorker(*critic_args(cfg, 2, 0))
critic.init_model()
folder = Path(tempfile.mkdtemp())
critic.save_checkpoint(folder)
from safetensors import safe_open
with safe_open(str(folder / "critic" / "model.safetensors"), "pt") as f:
    names = set(f.keys())
print(all(isinstance(p, DTensor) for p in critic.model.parameters()), "score.weight" in names, len(names))
"""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    from rlvr.workers.critic import load_value_model

    expected = len(load_value_model(str(tiny_model_dir), torch.device("cpu")).state_dict())
    assert out.stdout.split()[-3:] == ["True", "True", str(expected)]
