"""verl's own example scripts, as written (issue 28 §4, issue 48 §3).

Each file under ``verl_scripts/`` holds the arguments of one of verl's GRPO, PPO, DAPO or
multi-turn example scripts (the verl file and commit in its header), with only the model, data
and config paths replaced by placeholders. verl runs every one of them on 8 x 80 GB, so ``rlvr plan
--device-memory-gb 80`` must load them without asking for a change and answer that they fit, as a
GPU job; and ``python3 -m rlvr.trainer.main_ppo`` (verl's entry point) gives them verl's defaults.
``verl_scripts/refused/`` holds scripts refused for a reason their header names.
"""

from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config import ConfigError, load_config
from rlvr.trainer import main_ppo

HERE = Path(__file__).parent
SCRIPTS = sorted((HERE / "verl_scripts").glob("*.txt"))
REFUSED = HERE / "verl_scripts/refused"
CONFIG_DIR = HERE / "verl_scripts/multiturn"
REPO = HERE.parents[1]
# the published config.json each script's model has (Qwen2-7B has Qwen2.5-7B's shape)
MODELS = {
    "Qwen/Qwen3-8B": HERE / "verl_scripts/models/qwen3-8b",
    "Qwen/Qwen2-7B-Instruct": REPO / "examples/model_configs/qwen2.5-7b",
    "deepseek-ai/deepseek-llm-7b-chat": HERE / "verl_scripts/models/deepseek-llm-7b",
    "Qwen/Qwen2.5-0.5B-Instruct": REPO / "examples/model_configs/qwen2.5-0.5b",
    "Qwen/Qwen2.5-3B-Instruct": HERE / "verl_scripts/models/qwen2.5-3b",
    "Qwen/Qwen2.5-Math-7B": REPO / "examples/model_configs/qwen2.5-7b",
    "mistralai/Mistral-Nemo-Instruct-2407": HERE / "verl_scripts/models/mistral-nemo-12b",
}
# the multi-turn script runs SGLang; its sibling runs the same config on vLLM with this one change
ON_VLLM = ["actor_rollout_ref.rollout.name=vllm"]


def script_overrides(path: Path, data_dir: Path) -> list[str]:
    """The script's overrides with the placeholders filled in."""
    text = path.read_text()
    model = next(name for name in MODELS if f"config.json of {name}," in text.replace("\n# ", " "))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    lines = [line.replace("{MODEL}", str(MODELS[model])).replace("{DATA}", str(data_dir))
             .replace("{CONFIG_DIR}", str(CONFIG_DIR)) for line in lines]
    return lines + (ON_VLLM if "rollout.name=sglang" in text else [])


def overrides_only(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("--")]


def test_the_stored_scripts_cover_grpo_ppo_dapo_and_multi_turn():
    names = [p.name for p in SCRIPTS]
    assert sum(n.startswith("grpo_") for n in names) >= 3 and sum(n.startswith("ppo_") for n in names) >= 2
    assert any(n.startswith("dapo_") for n in names) and any(n.startswith("multiturn_") for n in names)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_script_loads_as_written(path, tmp_path, capsys):
    """No key is refused or answered with a guess; the notice names what rlvr does instead."""
    args = script_overrides(path, tmp_path)
    config_file = next((str(CONFIG_DIR / a.split("=", 1)[1]) + ".yaml" for a in args if a.startswith("--config-name")),
                       None)
    cfg = load_config(config_file, overrides=overrides_only(args))
    err = capsys.readouterr().err
    assert "did you mean" not in err
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"  # verl's sharded default on 8 devices
    if cfg.algorithm.adv_estimator == "gae":  # verl's PPO defaults, not the GRPO recipe's groups of 8
        assert cfg.actor_rollout_ref.rollout.n == 1
        assert cfg.critic.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    tp = [int(a.split("=")[1]) for a in args if a.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size=")]
    assert [cfg.actor_rollout_ref.rollout.tensor_model_parallel_size] == tp  # read: one engine over that many ranks


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_script_fits_8_x_80gb_as_verl_runs_it(path, tmp_path, capsys):
    # no trainer.device=cuda: a plan for a device of 80 GB is a GPU's plan, even on this CPU machine
    # (before issue 48 it was a CPU plan: vLLM's KV cache "0.6 x <host RAM> of host memory")
    rc = main(["plan", "--device-memory-gb", "80", *script_overrides(path, tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "peak" in out and "GB of host memory" not in out  # a CPU plan reserves "0.6 x <RAM> GB of host memory"
    assert "x 80.00 GB" in out  # vLLM's reservation: gpu_memory_utilization x the device


# verl's defaults (verl/trainer/config/_generated_ppo_trainer.yaml) that rlvr's GRPO recipe does not share
VERL_DEFAULTS = {
    "actor_rollout_ref.actor.use_kl_loss": False,       # recipe: true
    "actor_rollout_ref.actor.optim.lr": 1e-6,           # recipe: 1e-5
    "actor_rollout_ref.rollout.n": 1,                   # recipe: 8
    "trainer.test_freq": -1,                            # recipe: 12
    "trainer.save_freq": -1,                            # recipe: 12
    "trainer.total_epochs": 30,                         # recipe: 30 too (the schema's), with 24 steps
    "actor_rollout_ref.actor.shuffle": False,           # schema: true
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "data.train_batch_size": 1024,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "critic.model.enable_gradient_checkpointing": True,  # schema: false
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,      # schema: null (clip_ratio)
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,     # schema: null (clip_ratio)
}


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_script_gets_verls_defaults_from_main_ppo(path, tmp_path, monkeypatch, capsys):
    """python3 -m rlvr.trainer.main_ppo: the keys a script leaves out take verl's defaults, not the recipe's."""
    args = script_overrides(path, tmp_path)
    loaded = []
    import rlvr.cli

    real = rlvr.cli.load_config
    monkeypatch.setattr(rlvr.cli, "load_config", lambda *a, **k: loaded.append(real(*a, **k)) or loaded[-1])
    assert main_ppo.main(["--explain", *args]) == 0
    card = capsys.readouterr().out
    (cfg,) = loaded
    given = {a.split("=", 1)[0].lstrip("+") for a in args}
    unset = {key: value for key, value in VERL_DEFAULTS.items() if key not in given}
    assert unset, "a script that sets every key tests nothing here"
    for key, value in unset.items():
        assert _get(cfg, key) == value, key
    recipe = load_config(None, overrides_only(args)) if "--config-name" not in " ".join(args) else None
    if recipe is not None:  # rlvr's own base gives another answer for at least one of them
        assert any(_get(recipe, key) != value for key, value in unset.items())
    # the card's "differs from verl's defaults" names only what the script itself sets
    differ = next((line for line in card.splitlines() if line.startswith("differs from verl's defaults")), "")
    for key in unset:
        assert f"{key}=" not in differ, key
    assert main(["plan", "--base", "verl", "--device-memory-gb", "80", *args]) == 0, capsys.readouterr().err


def test_the_multi_turn_script_as_written_is_refused_only_for_sglang(tmp_path):
    args = script_overrides(SCRIPTS[[p.stem for p in SCRIPTS].index("multiturn_run_qwen2.5-3b_gsm8k_multiturn")],
                            tmp_path)[:-len(ON_VLLM)]
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG_DIR / "gsm8k_multiturn_grpo.yaml"), overrides_only(args), base="verl")
    assert "rollout.name=sglang with actor_rollout_ref.rollout.mode=async: SGLang is not installed here" in str(err.value)
    assert str(err.value).count("\n  - ") == 1  # the only refusal


def test_the_multi_turn_scripts_yaml_starts_from_verls_defaults(capsys):
    """Its defaults list names verl's ppo_trainer; its hydra key is Hydra's."""
    tools = CONFIG_DIR / "tool_config/gsm8k_tool_config.yaml"
    cfg = load_config(str(CONFIG_DIR / "gsm8k_multiturn_grpo.yaml"),
                      [*ON_VLLM, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}"])
    err = capsys.readouterr().err
    assert "hydra and defaults" in err and "verl's defaults" in err
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5  # the YAML's own key


def test_a_hydra_defaults_entry_rlvr_cannot_compose_is_refused(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("defaults:\n  - ppo_trainer\n  - override rollout: sglang_rollout\n  - _self_\n")
    with pytest.raises(ConfigError, match="entry {'override rollout': 'sglang_rollout'}: rlvr composes no Hydra config groups"):
        load_config(str(f))


@pytest.mark.parametrize("command", [["plan"], ["train", "--explain"]])
def test_verls_tool_classes_are_checked_at_load(command, tmp_path, capsys):
    """verl's Gsm8kTool is read as rlvr's; one rlvr has nothing like is refused by name, by plan and --explain."""
    base = ["--config", "calculator", "actor_rollout_ref.rollout.multi_turn.format=hermes"]
    gsm8k = CONFIG_DIR / "tool_config/gsm8k_tool_config.yaml"
    assert main([*command, *base, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={gsm8k}"]) == 0
    sandbox = tmp_path / "tools.yaml"
    sandbox.write_text("tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
                       "    config: {type: native, sandbox_fusion_url: http://x}\n")
    capsys.readouterr()
    assert main([*command, *base, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={sandbox}"]) == 2
    err = capsys.readouterr().err
    assert "'verl.tools.sandbox_fusion_tools.SandboxFusionTool' is verl's tool class" in err
    assert "rlvr.tools.python.PythonTool" in err


@pytest.mark.parametrize("path", sorted(REFUSED.glob("*.txt")), ids=lambda p: p.stem)
def test_refused_verl_scripts_are_refused_only_for_their_stated_reasons(path, tmp_path):
    args = script_overrides(path, tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(None, args, base="verl")
    message = str(err.value)
    assert "unknown config key" not in message and "verl's name" not in message
    if "skyworkrm" in path.name:  # a reward model
        assert "reward.reward_model.enable=true on Ray" in message and message.count("\n  - ") == 1
    else:
        assert "sequence parallelism (Ulysses) is not implemented" in message
        assert "trainer.log_val_generations=10" in message and "fsdp_size" not in message


def test_config_verl_is_verls_defaults_and_the_recipe_is_not(capsys):
    verl, recipe = load_config("verl"), load_config(None)
    for key, value in VERL_DEFAULTS.items():
        assert _get(verl, key) == value, key
    # verl's critic.model.trust_remote_code follows the actor's (${oc.select:actor_rollout_ref.model.trust_remote_code,false})
    assert load_config("verl", ["actor_rollout_ref.model.trust_remote_code=true"]).critic.model.trust_remote_code
    assert not verl.critic.model.trust_remote_code
    assert not load_config("verl", ["actor_rollout_ref.model.trust_remote_code=true",
                                    "critic.model.trust_remote_code=false"]).critic.model.trust_remote_code
    # the GRPO recipe's: KL loss on, lr 1e-5, groups of 8, validation and checkpoints every 12 steps
    assert (recipe.actor_rollout_ref.actor.use_kl_loss, recipe.actor_rollout_ref.actor.optim.lr,
            recipe.actor_rollout_ref.rollout.n, recipe.trainer.test_freq, recipe.trainer.save_freq) == (True, 1e-5, 8, 12, 12)
    assert main(["config", "show", "--base", "verl"]) == 0
    assert "project_name: verl_examples" in capsys.readouterr().out


def test_clip_ratio_alone_changes_nothing_under_verls_base_with_a_notice(capsys):
    """verl's actor.yaml sets clip_ratio_low and clip_ratio_high to 0.2, and its losses fall back to
    clip_ratio only where they are null: a script's clip_ratio=0.3 alone leaves the clip at 0.2."""
    from rlvr.algos.losses import clip_range

    capsys.readouterr()
    actor = load_config("verl", ["actor_rollout_ref.actor.clip_ratio=0.3"]).actor_rollout_ref.actor
    assert clip_range(actor) == (0.2, 0.2)
    err = capsys.readouterr().err
    assert ("actor_rollout_ref.actor.clip_ratio=0.3 (from the command line) changes nothing: as in verl, "
            "clip_ratio_low/high decide (clip_ratio_low=0.2, clip_ratio_high=0.2)") in err
    # with one of them set, the other still decides; with both set, nothing to say
    actor = load_config("verl", ["actor_rollout_ref.actor.clip_ratio=0.3",
                                 "actor_rollout_ref.actor.clip_ratio_high=0.28"]).actor_rollout_ref.actor
    assert clip_range(actor) == (0.2, 0.28)
    assert "clip_ratio_low/high decide (clip_ratio_low=0.2)" in capsys.readouterr().err
    load_config("verl", ["actor_rollout_ref.actor.clip_ratio=0.3", "actor_rollout_ref.actor.clip_ratio_low=0.3",
                         "actor_rollout_ref.actor.clip_ratio_high=0.3"])
    load_config("verl", [])
    assert "clip_ratio_low/high decide" not in capsys.readouterr().err
    # an end set to null falls back to clip_ratio, as in verl: clip_ratio decides there, no notice
    actor = load_config("verl", ["actor_rollout_ref.actor.clip_ratio=0.3",
                                 "actor_rollout_ref.actor.clip_ratio_low=null"]).actor_rollout_ref.actor
    assert clip_range(actor) == (0.3, 0.2)
    assert "clip_ratio_low/high decide" not in capsys.readouterr().err
    # rlvr's own base keeps its fallback: clip_ratio alone sets both ends, without a notice
    actor = load_config(None, ["actor_rollout_ref.actor.clip_ratio=0.3"]).actor_rollout_ref.actor
    assert clip_range(actor) == (0.3, 0.3)
    assert "clip_ratio_low/high decide" not in capsys.readouterr().err
