import os
import re
import shutil
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.data import read_rows


def test_prepare_arithmetic_and_countdown(tmp_path, capsys):
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "a"), "--train-size", "40", "--test-size", "10"]) == 0
    assert len(read_rows(tmp_path / "a" / "train.parquet")) == 40
    assert "wrote test" in capsys.readouterr().out
    assert main(["prepare", "countdown", "--out", str(tmp_path / "c"), "--train-size", "5", "--test-size", "5"]) == 0
    assert len(read_rows(tmp_path / "c" / "test.parquet")) == 5


def test_prepare_gsm8k_without_src_is_a_clear_error(tmp_path, capsys):
    assert main(["prepare", "gsm8k", "--out", str(tmp_path)]) == 2
    assert "needs --src PATH" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["arithmetic", "--digits", "3"], ["gsm8k"], ["arithmetic", "--train-size", "2000"]])
def test_a_refused_prepare_leaves_no_empty_folder(tmp_path, capsys, args):
    # --digits 3 under the default max operand 20, gsm8k without --src, more rows than 0..20 has: each
    # refused after the folder was made, which a later `ls` showed empty
    assert main(["prepare", *args, "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()  # a folder the user had stays
    assert main(["prepare", *args, "--out", str(tmp_path / "kept")]) == 2
    assert (tmp_path / "kept").is_dir()


def test_prepare_into_a_folder_that_cannot_be_made_is_a_clear_error(tmp_path, capsys):
    """A file where the folder should be, a file as a parent, and a parent that takes no folders:
    each names --out and the path, with no traceback."""
    (tmp_path / "file").write_text("x")
    outs = [tmp_path / "file", tmp_path / "file" / "sub"] + ([Path("/proc/rlvr-x")] if Path("/proc/self").exists() else [])
    for out in outs:
        assert main(["prepare", "arithmetic", "--out", str(out), "--train-size", "4", "--test-size", "2"]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: cannot make that folder" in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "x"


def test_config_show_prints_resolved_yaml(capsys):
    assert main(["config", "show", "actor_rollout_ref.rollout.n=8"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: grpo" in out and "'n': 8" in out


def test_config_error_exits_2_without_traceback(capsys):
    assert main(["config", "show", "data.train_batch_sise=3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'data.train_batch_size'" in err and "Traceback" not in err


def test_rollout_on_tiny_model(tmp_path, tiny_model_dir, capsys):
    main(["prepare", "arithmetic", "--out", str(tmp_path), "--train-size", "16", "--test-size", "8"])
    code = main(["rollout", "--limit", "4", f"actor_rollout_ref.model.path={tiny_model_dir}",
                 f"data.val_files={tmp_path / 'test.parquet'}", "data.max_response_length=8"])
    assert code == 0
    assert "4 prompts, mean score" in capsys.readouterr().out


def test_rollout_loads_the_model_as_the_actor_does(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """rlvr rollout loaded model.path bare: override_config, trust_remote_code and tokenizer_path were
    ignored, so it scored another model than the one training would run."""
    import rlvr.models

    main(["prepare", "arithmetic", "--out", str(tmp_path), "--train-size", "16", "--test-size", "8"])
    common = ["rollout", "--limit", "2", f"actor_rollout_ref.model.path={tiny_model_dir}",
              f"data.val_files={tmp_path / 'test.parquet'}", "data.max_response_length=4"]
    assert main([*common, f"actor_rollout_ref.model.tokenizer_path={tmp_path / 'no_tokenizer'}"]) == 2
    assert "no_tokenizer" in capsys.readouterr().err
    seen, load = {}, rlvr.models.load_model

    def recording(path, dtype="float32", device="cpu", trust_remote_code=False, override_config=None):
        seen["override_config"] = override_config
        return load(path, dtype, device, trust_remote_code, override_config)

    monkeypatch.setattr(rlvr.models, "load_model", recording)
    assert main([*common, "actor_rollout_ref.model.override_config={attention_dropout: 0.0}"]) == 0
    assert seen["override_config"] == {"attention_dropout": 0.0}


def test_rollout_with_missing_model_path(tmp_path, capsys):
    assert main(["rollout", f"actor_rollout_ref.model.path={tmp_path / 'nope'}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_algos_list(capsys):
    assert main(["algos", "list"]) == 0
    out = capsys.readouterr().out
    assert "grpo " in out and "Dr.GRPO" in out and "vanilla" in out and "gspo" in out and "low_var_kl" in out


def test_a_tools_yaml_error_is_one_message(tmp_path, tiny_model_dir, capsys):
    """A tools YAML with a type error: its message (file, tool, key) used to arrive inside a
    traceback, as the command line did not catch ToolConfigError; now it is a config error."""
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: calculator\n    config: [1, 2]\n")
    code = main(["train", "--config", "calculator", f"actor_rollout_ref.model.path={tiny_model_dir}",
                 f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                 f"trainer.default_local_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"rlvr train: error: {tools}: tools[0].config: must be a mapping" in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["config.json", "model.safetensors"])
def test_a_damaged_model_folder_is_named_by_eval_and_plan(tmp_path, tiny_model_dir, capsys, damage):
    """A model folder whose config.json is cut mid-object, or whose weights are truncated (an
    interrupted download): one message naming the file, not a transformers or safetensors
    traceback; the plan, which reads no weights, checks their headers too."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    file = folder / damage
    if damage == "config.json":
        file.write_text('{"model_type": "llama", ')
        problem = f"{file} is not valid JSON"
    else:
        size = file.stat().st_size
        os.truncate(file, size // 2)
        problem = f"{file} is truncated: {size // 2} bytes where its header describes {size}"
    for argv in (["eval", "--model", str(folder), "--data", str(tmp_path / "never_read.parquet")],
                 ["plan", "--device-memory-gb", "8", f"actor_rollout_ref.model.path={folder}"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"rlvr {argv[0]}: error: {problem}" in err, err
        assert "download or copy the model again" in err and "Traceback" not in err


def test_a_run_directory_that_is_a_file_is_refused_at_load(tmp_path, capsys):
    """trainer.default_local_dir naming a file used to fail with FileExistsError once the model had
    loaded; now the config is refused, naming the file once (not again for rollouts/ under it)."""
    file = tmp_path / "notes.txt"
    file.write_text("")
    assert main(["config", "show", f"trainer.default_local_dir={file}"]) == 2
    err = capsys.readouterr().err
    assert (f"trainer.default_local_dir = '{file}' is a file, not a folder; point it at a new or existing folder, "
            f"or move {file} away") in err
    assert "rollout_data_dir" not in err and "Traceback" not in err
    assert main(["config", "show", f"trainer.default_local_dir={file / 'run'}"]) == 2
    assert f"is under {file}, which is a file" in capsys.readouterr().err


def test_prepare_asking_for_more_problems_than_the_spec_has_is_a_clear_error(tmp_path, capsys):
    """Operands 0-20 with + - x give about 1,300 distinct problems: 2,000 rows was a traceback."""
    assert main(["prepare", "arithmetic", "--out", str(tmp_path), "--train-size", "2000"]) == 2
    err = capsys.readouterr().err
    assert "--train-size 2000 --test-size 300: only" in err and "distinct problems" in err and "Traceback" not in err


def test_prepare_countdown_running_out_of_problems_is_a_clear_error(tmp_path, capsys, monkeypatch):
    """The generator's ValueError reached the user as a traceback (countdown's space is too large to
    exhaust in a test: the draw is made to fail)."""
    from rlvr.data.tasks import countdown

    monkeypatch.setattr(countdown, "make_problem", lambda rng, **kw: ([1, 2, 3], 6, "1+2+3"))
    assert main(["prepare", "countdown", "--out", str(tmp_path), "--train-size", "2", "--test-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "--train-size 2 --test-size 1: train: could not draw 2 distinct problems" in err and "Traceback" not in err


@pytest.mark.parametrize("size", ["-5", "0"])
@pytest.mark.parametrize("option", ["--train-size", "--test-size"])
def test_prepare_refuses_a_split_of_no_rows(tmp_path, capsys, option, size):
    """--train-size -5 wrote an empty train file and exited 0 (0 silently meant the default)."""
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", "arithmetic", "--out", str(tmp_path), option, size])
    assert exit_.value.code == 2
    assert f"argument {option}: must be >= 1, got {size}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_prepare_gsm8k_refuses_sizes_it_would_ignore(tmp_path, capsys):
    """gsm8k writes the dataset's own splits: a size would be silently ignored."""
    assert main(["prepare", "gsm8k", "--src", str(tmp_path), "--train-size", "10"]) == 2
    assert "--train-size/--test-size do not apply to gsm8k" in capsys.readouterr().err


def test_an_empty_validation_set_with_validation_asked_for_is_said(tmp_path, capsys):
    """data.val_files=[] with test_freq=12 and val_before_train (the recipe's) skipped validation
    without a word; now the run says so before anything loads (here the model path stops it next)."""
    code = main(["train", "data.val_files=[]", f"actor_rollout_ref.model.path={tmp_path / 'no_model'}",
                 f"trainer.default_local_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err
    assert ("data.val_files is empty: this run validates never, so trainer.test_freq=12 and "
            "trainer.val_before_train=true have no effect") in err
    main(["train", "data.val_files=[]", "trainer.test_freq=-1", "trainer.val_before_train=false",
          f"actor_rollout_ref.model.path={tmp_path / 'no_model'}", f"trainer.default_local_dir={tmp_path / 'run'}"])
    assert "data.val_files is empty" not in capsys.readouterr().err


def test_eval_labels_the_greedy_pass_as_greedy(tmp_path, tiny_model_dir, capsys):
    """With --n 1 the greedy line read "mean accuracy of 1 samples" (the sampled pass's label for
    mean@n overwrote the greedy one); there is no sampled pass then."""
    main(["prepare", "arithmetic", "--out", str(tmp_path), "--train-size", "2", "--test-size", "2"])
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tmp_path / "test.parquet"),
                 "--max-response-length", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"arithmetic/reward/mean@1 +\d\.\d{4}  accuracy \(greedy\)$", out, re.M), out
    assert "samples" not in out


def test_eval_on_a_lora_adapter_says_export_merges_it(tmp_path, capsys):
    """A LoRA checkpoint's actor/ holds only the adapter: eval said nothing of it."""
    actor = tmp_path / "global_step_4" / "actor"
    actor.mkdir(parents=True)
    (actor / "adapter_config.json").write_text('{"base_model_name_or_path": "/models/base", "r": 8}')
    for model in (actor, actor.parent):
        assert main(["eval", "--model", str(model), "--data", str(tmp_path / "never_read.parquet")]) == 2
        err = capsys.readouterr().err
        assert (f"rlvr eval: error: {actor} is a LoRA adapter (adapter_config.json), not a whole model: "
                f"`rlvr export {actor.parent} OUT` merges it into its base model (/models/base); then evaluate "
                "OUT") in err, err


def test_overrides_go_before_and_after_config_in_any_order(capsys):
    """`config show --config dapo k=v` and `train k=v --config dapo` ended in argparse's
    "unrecognized arguments"; overrides on both sides of --config are read, in the order typed."""
    assert main(["config", "show", "--config", "dapo", "trainer.experiment_name=after"]) == 0
    out = capsys.readouterr().out
    assert "experiment_name: after" in out and "enable: true" in out  # dapo's filter_groups, under the override
    assert main(["config", "show", "trainer.experiment_name=first", "--config", "dapo",
                 "trainer.experiment_name=last"]) == 0
    assert "experiment_name: last" in capsys.readouterr().out  # the later one wins, as typed
    assert main(["train", "actor_rollout_ref.actor.grad_clip=0.5", "--config", "dapo",
                 "actor_rollout_ref.rollout.n=4", "--explain"]) == 0
    card = capsys.readouterr().out
    assert "min(1, 0.5 / global norm)" in card and "x n=4 =" in card and "dynamic sampling (DAPO)" in card
    with pytest.raises(SystemExit) as exit_:  # what is not an override is still refused
        main(["config", "show", "--config", "dapo", "--confg", "x"])
    assert exit_.value.code == 2 and "unrecognized arguments: --confg x" in capsys.readouterr().err


def test_a_misspelt_recipe_suggests_the_nearest(capsys):
    assert main(["config", "show", "--config", "dapoo"]) == 2
    err = capsys.readouterr().err
    assert "'dapoo' is neither a file nor a shipped recipe; did you mean dapo? (recipes: " in err, err
    assert "Traceback" not in err


def test_rollout_refuses_a_limit_below_one(capsys):
    """--limit -3 ended in a ValueError traceback from max() of no prompts."""
    with pytest.raises(SystemExit) as exit:
        main(["rollout", "--limit", "-3"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "rlvr rollout: error: argument --limit: must be >= 1, got -3" in err and "Traceback" not in err


def test_eval_and_rollout_refuse_an_unscorable_row_before_generating(tmp_path, tiny_model_dir, capsys):
    """Both generated first and then died in a KeyError traceback; rollout also ignored the run's
    reward config (its custom function), scoring by data_source alone."""
    import json

    row = {"data_source": "my_task", "prompt": [{"role": "user", "content": "Say 7."}],
           "reward_model": {"ground_truth": "7"}}
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--max-response-length", "2"]) == 2
    err = capsys.readouterr().err
    assert "d.jsonl, line 1" in err and "my_task" in err and "Traceback" not in err
    common = ["rollout", "--limit", "1", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.val_files=[{data}]",
              "data.max_response_length=2"]
    assert main(common) == 2
    assert "my_task" in capsys.readouterr().err
    scorer = tmp_path / "score.py"
    scorer.write_text("def always(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.75\n")
    assert main([*common, f"reward.custom_reward_function.path={scorer}", "reward.custom_reward_function.name=always"]) == 0
    assert "1 prompts, mean score 0.750" in capsys.readouterr().out


def test_eval_says_how_many_rows_it_dropped_as_overlong(tmp_path, tiny_model_dir, capsys):
    import json

    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": text}],
             "reward_model": {"ground_truth": "7"}} for text in ("3 + 4?", "word " * 100)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--max-response-length", "2",
                 "--max-prompt-length", "40"]) == 0
    captured = capsys.readouterr()
    assert "1 of 2 rows dropped" in captured.err and "(1 prompts" in captured.out


@pytest.mark.parametrize("args, option", [(["countdown", "--num-operands", "5"], "--num-operands"),
                                          (["arithmetic", "--system-prompt", "think-answer"], "--system-prompt"),
                                          (["calculator", "--digits", "4"], "--digits")])
def test_prepare_refuses_an_option_of_another_task(tmp_path, capsys, args, option):
    assert main(["prepare", *args, "--out", str(tmp_path / "x")]) == 2
    assert f"{option} applies to rlvr prepare" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_prepare_gsm8k_from_a_test_file_writes_the_test_split(tmp_path, capsys):
    import json

    src = tmp_path / "test.jsonl"
    src.write_text(json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    assert main(["prepare", "gsm8k", "--src", str(src), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "test.parquet").exists() and not (tmp_path / "out" / "train.parquet").exists()


def test_verls_bundled_config_names_are_verls_configs(tmp_path, monkeypatch, capsys):
    """verl's scripts pass --config-path=config --config-name=ppo_trainer (or ppo_megatron_trainer):
    Hydra reads a relative path beside verl's main_ppo, so they name verl's own configs. rlvr looked
    for ./config/ppo_trainer.yaml and said it does not exist."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config-path=config", "--config-name=ppo_megatron_trainer", "--explain"]) == 2
    err = capsys.readouterr().err
    assert "verl's Megatron-LM backend is not implemented in rlvr" in err and "*.megatron.*" in err
    # verl's defaults: its ppo_mini_batch_size of 256 is refused beside a batch of 16, as with --base verl
    assert main(["train", "--config-path=config", "--config-name=ppo_trainer", "data.train_batch_size=16",
                 "--explain"]) == 2
    assert "ppo_mini_batch_size = 256 prompts is larger than data.train_batch_size = 16" in capsys.readouterr().err
    # a file of that name where the path says is the user's own
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "ppo_trainer.yaml").write_text("data:\n  train_batch_size: 16\n")
    assert main(["config", "show", "--config-path=config", "--config-name=ppo_trainer"]) == 0
    assert "train_batch_size: 16" in capsys.readouterr().out


def test_plot_of_a_metrics_file_with_a_damaged_line_names_it_without_a_traceback(tmp_path, capsys):
    """A torn last line (a killed run) is skipped; a damaged line before it, which the reader refuses
    naming its line, came out of `rlvr plot` as a ValueError traceback."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5}\n{"step": 2, "crit\n'
                                            '{"step": 3, "critic/score/mean": 0.7}\n')
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'metrics.jsonl'}, line 2: not a JSON record" in err and "Traceback" not in err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5}\n{"step": 2, "crit')
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "plots" / "reward.png").is_file()
