"""The default job (`rlvr train` with no arguments: GRPO recipe, built-in model, arithmetic)
for a few steps, through the command line, on a small validation split."""

import json

import pytest

from rlvr.cli import main
from rlvr.data.prepare import prepare_arithmetic


@pytest.mark.slow
def test_default_job_runs_a_few_steps(tmp_path, capsys):
    paths = prepare_arithmetic(tmp_path / "data", train_size=64, test_size=16)
    run_dir = tmp_path / "run"
    code = main(["train", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
                 "trainer.total_training_steps=2", f"trainer.default_local_dir={run_dir}"])
    assert code == 0
    out = capsys.readouterr()
    assert str(run_dir) in out.out
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [0, 1, 2]
    first, last = records[1], records[2]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean",
                "timing_s/gen", "timing_s/ref", "timing_s/update_actor", "perf/throughput"):
        assert key in first, key
    # default job: GRPO with n = 4 and the KL loss on; one update per batch, so pi_old is the policy itself
    assert first["actor/ppo_kl"] == 0.0 and first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    # the guardrails run and are quiet: the freshness probe at step 2 finds the engine's greedy tokens
    # the actor's own (the hybrid engine shares its tensors: every gap 0), nothing is dropped or invalid
    assert last["training/freshness/probe_tokens"] > 0 and last["training/freshness/greedy_gap_max"] <= 1e-6
    assert all(r.get("reward/num_invalid", 0) == 0 and "training/dropped_groups" not in r for r in records)
    assert "rows dropped: their prompt is longer" not in out.out + out.err  # no prompt filtered at load
    assert 0.0 <= records[0]["val-core/arithmetic/reward/mean@1"] <= 1.0
    assert "val-core/arithmetic/reward/mean@1" in last
    assert (run_dir / "config.yaml").exists()
