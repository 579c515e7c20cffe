"""`rlvr export` gives a folder plain transformers loads and generates from; `rlvr eval` reports
accuracy and pass@n."""

import os
import re
from pathlib import Path

import pytest
import torch

from rlvr.cli import main
from rlvr.trainer.main import build_trainer


def test_export_loads_with_plain_transformers_and_generates(tiny_config, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = tiny_config("trainer.val_before_train=false", "data.val_files=[]", "trainer.total_training_steps=1")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    out = tmp_path / "exported"
    assert main(["export", config.trainer.default_local_dir, str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    for a, b in zip(model.parameters(), trainer.wg.worker.actor.model.parameters()):
        assert torch.equal(a, b)
    ids = tokenizer("What is 2 + 2?", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids.shape[1]
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "neither a checkpoint" in capsys.readouterr().err
    # a damaged checkpoint is not copied into a folder that looks whole (it was, silently)
    weights = next(Path(config.trainer.default_local_dir).rglob("actor/model.safetensors"))
    os.truncate(weights, weights.stat().st_size // 2)
    assert main(["export", config.trainer.default_local_dir, str(tmp_path / "damaged")]) == 2
    err = capsys.readouterr().err
    assert f"cannot export {weights.parents[1]}: {weights} is truncated" in err and "Traceback" not in err
    assert not (tmp_path / "damaged").exists()


def test_eval_prints_accuracy_and_pass_at_n(tiny_model_dir, tiny_data, capsys):
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tiny_data["test"]), "--n", "2",
                 "--max-response-length", "4", "--batch-size", "2"]) == 0
    out, err = capsys.readouterr()
    assert "arithmetic/reward/mean@1" in out and "accuracy (greedy)" in out
    assert "arithmetic/reward/best@2" in out and "pass@2" in out
    # each pass shows its progress on stderr, batch by batch: 4 prompts in batches of 2
    assert re.search(r"greedy: +50%.*\| 2/4 \[", err) and re.search(r"greedy: +100%.*\| 4/4 \[", err), err
    assert re.search(r"2 samples at T=1.0: +50%.*\| 2/4 \[", err), err


@pytest.mark.parametrize("option,value,message", [
    ("--temperature", "-1", "argument --temperature: must be a number > 0"),  # was: ran, and reported 0.0
    ("--temperature", "0", "argument --temperature: must be a number > 0"),  # pass@n of n greedy copies
    ("--n", "0", "argument --n: must be >= 1, got 0"),  # was: accepted
    ("--batch-size", "0", "argument --batch-size: must be >= 1, got 0"),
    ("--max-response-length", "-4", "argument --max-response-length: must be >= 1, got -4"),
])
def test_eval_refuses_nonsense_options_by_name(tmp_path, capsys, option, value, message):
    with pytest.raises(SystemExit) as exit:  # refused as argparse refuses: before any model loads
        main(["eval", "--model", str(tmp_path / "never_loaded"), "--data", str(tmp_path / "never_read.parquet"),
              option, value])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"rlvr eval: error: {message}" in err and "Traceback" not in err


@pytest.mark.slow
def test_eval_builtin_model(tiny_data, tmp_path, capsys):
    from rlvr.data.prepare import prepare_arithmetic

    data = prepare_arithmetic(tmp_path, train_size=4, test_size=24)
    assert main(["eval", "--model", "builtin", "--data", str(data["test"]), "--n", "4",
                 "--max-response-length", "64"]) == 0
    out = capsys.readouterr().out
    accuracy = float(out.split("arithmetic/reward/mean@1")[1].split()[0])
    pass_at_4 = float(out.split("arithmetic/reward/best@4/mean")[1].split()[0])
    assert 0.0 < accuracy < 1.0 and 0.0 < pass_at_4 <= 1.0
