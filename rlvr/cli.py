"""The ``rlvr`` command: train, plan, prepare, eval, rollout, serve, plot, export, config show, algos list.

Config-reading commands take ``--config FILE.yaml`` and ``key=value`` overrides, exactly
as ``rlvr train`` does. Errors that come from the user's input (config, data, model path)
are printed as one clear message, without a traceback, and exit with status 2.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import time
from pathlib import Path

try:  # torch loads here: the first seconds of every command
    from rlvr.config import ConfigError, load_config, to_yaml
    from rlvr.config.verl_keys import MEGATRON_BACKEND, MEGATRON_LORA
    from rlvr.determinism import pin_threads
    from rlvr.data.io import DatasetError
    from rlvr.models.loader import ModelLoadError
    from rlvr.errors import StopTraining, TrainingInterrupted
except KeyboardInterrupt:
    if Path(sys.argv[0]).name != "rlvr":  # imported by other code: its Ctrl-C is its own
        raise
    print("rlvr: interrupted while starting; nothing was done", file=sys.stderr)
    raise SystemExit(130) from None

USER_ERRORS = (ConfigError, DatasetError, ModelLoadError, StopTraining)
# what a disk refuses a write with (full, over quota, read-only, no permission): a message, not a traceback
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
DISK_ADVICE = ("write somewhere you can, with room (rlvr train writes under trainer.default_local_dir, "
               "rlvr prepare under --out, rlvr export to its destination)")


# the options of one task: refused for the others
PREPARE_OPTIONS = {"digits": ("arithmetic",), "max_operand": ("arithmetic",), "operators": ("arithmetic",),
                   "num_operands": ("arithmetic",), "src": ("gsm8k",), "system_prompt": ("gsm8k",)}


def _cmd_prepare(args: argparse.Namespace) -> None:
    from rlvr.data import prepare

    for option, owner in PREPARE_OPTIONS.items():  # an option of another task would change nothing
        if getattr(args, option) is not None and args.task not in owner:
            raise ConfigError(f"--{option.replace('_', '-')} applies to rlvr prepare {' / '.join(owner)}, "
                              f"not {args.task}: leave it out")
    out = Path(args.out or prepare.DEFAULT_ROOT / args.task).expanduser()
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, a parent that cannot have folders (/proc/x)
        if err.errno in DISK_ERRNOS:
            raise
        raise DatasetError(f"--out {out}: cannot make that folder ({err.strerror}: {err.filename}); "
                           "pass a folder that exists or can be made") from None
    try:
        paths = _prepare_task(args, out)
    except BaseException:  # a refused option or size leaves no empty folder behind
        if made and not any(out.iterdir()):
            out.rmdir()
        raise
    for split, path in paths.items():
        print(f"wrote {split}: {path}")


def _prepare_task(args: argparse.Namespace, out: Path) -> dict:
    """Write the task's splits under ``out``: {split: path}."""
    from rlvr.data import prepare
    from rlvr.data.tasks.arithmetic import ArithmeticSpec

    if args.task == "arithmetic":
        given = {key: getattr(args, key) for key in ("digits", "max_operand", "operators", "num_operands")
                 if getattr(args, key) is not None}  # the rest: ArithmeticSpec's defaults
        if given.get("max_operand") == 0:
            given["max_operand"] = None  # --max-operand 0: bounded by --digits alone
        try:
            spec = ArithmeticSpec(**given)
        except ValueError as err:  # the spec's messages open with its field: the option of that name
            raise ConfigError("--" + str(err).replace("_", "-", 1)) from None
        try:
            paths = prepare.prepare_arithmetic(out, args.train_size or 1000, args.test_size or 300, args.seed, spec)
        except ValueError as err:  # more rows asked for than the spec has distinct problems
            raise ConfigError(f"--train-size {args.train_size or 1000} --test-size {args.test_size or 300}: {err} "
                              "(--max-operand, --digits, --num-operands)") from None
    elif args.task in ("calculator", "calculator_no_tool"):
        paths = prepare.prepare_calculator(out, args.train_size or 1000, args.test_size or 100, args.seed,
                                           with_tool=args.task == "calculator")
    elif args.task == "countdown":
        try:
            paths = prepare.prepare_countdown(out, args.train_size or 10000, args.test_size or 300, args.seed)
        except ValueError as err:  # more rows asked for than the generator draws distinct problems
            raise ConfigError(f"--train-size {args.train_size or 10000} --test-size {args.test_size or 300}: {err}; "
                              "ask for fewer rows") from None
    else:
        if args.train_size or args.test_size:
            raise DatasetError("--train-size/--test-size do not apply to gsm8k: it writes the dataset's own train "
                               "and test splits (filter the written files to take fewer rows)")
        if not args.src:
            raise DatasetError("rlvr prepare gsm8k needs --src PATH: the folder with GSM8K's train/test files")
        paths = prepare.prepare_gsm8k(out, Path(args.src), args.system_prompt)
    return paths


def _terminate_as_interrupt(signum, frame) -> None:
    """SIGTERM (what timeout, Slurm and Kubernetes send) stops a run as Ctrl-C does: the complete
    step is saved and the message says how to resume, instead of dying with every unsaved step."""
    raise KeyboardInterrupt


def _cmd_train(args: argparse.Namespace) -> None:
    import signal

    from rlvr.trainer.main import run_training

    if args.explain:
        from rlvr.trainer.explain import objective_card

        print(objective_card(_load(args)))
        return
    if args.dry_run:
        _cmd_plan(args)
        return
    pin_threads()  # one fixed intra-op thread count (rlvr/determinism.py)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    config = _load(args)  # the run's own device: --device-memory-gb sizes the check, it does not pick cuda
    _check_plan_before_training(config, args.device_memory_gb)
    run_training(config)


def _check_plan_before_training(config, device_memory_gb: float | None) -> None:
    """What ``rlvr plan`` refuses (a run over the device's memory), refused before anything loads:
    ``data.max_response_length=100000`` once loaded and generated for minutes toward a crash.
    Skipped where the plan has nothing to read: a GGUF file or a missing folder (the loader names
    it), or CUDA asked of a machine without it (a Ray cluster's GPUs, or the device check's error)."""
    import torch

    from rlvr.trainer.memory_plan import check_plan, on_gpu, plan_memory, read_model_config

    path = config.actor_rollout_ref.model.path
    if path != "builtin" and not (Path(path).expanduser() / "config.json").is_file():
        return
    if on_gpu(config) and not torch.cuda.is_available() and not device_memory_gb:
        return
    check_plan(plan_memory(config, read_model_config(path), device_memory_gb), config)


def _cmd_plan(args: argparse.Namespace) -> None:
    """Per-device memory of the run from the model's config.json alone; refuses a plan over the device."""
    from rlvr.trainer.memory_plan import check_plan, format_plan, plan_memory, read_model_config

    # a device of a given size is a GPU: trainer.device=auto plans it as cuda (docs/configuration.md)
    config = _load(args, device_hint="cuda" if args.device_memory_gb is not None else None)
    plan = plan_memory(config, read_model_config(config.actor_rollout_ref.model.path), args.device_memory_gb)
    print(format_plan(plan))
    check_plan(plan, config)


def _cmd_eval(args: argparse.Namespace) -> None:
    """Greedy accuracy and, with --n > 1, pass@n of a local model on a prepared split."""
    from rlvr.config.schema import DataConfig, RewardConfig, RolloutConfig
    from rlvr.data import RLHFDataset
    from rlvr.models import load_model_and_tokenizer
    from rlvr.rewards import RewardManager
    from rlvr.rollout import build_rollout
    from rlvr.trainer.evaluate import evaluate
    from rlvr.trainer.main import check_scorable

    _refuse_an_adapter(args.model)
    if (Path(args.model).expanduser() / "actor" / "config.json").is_file():  # a checkpoint folder: its policy
        args.model = str(Path(args.model).expanduser() / "actor")
    pin_threads()  # one fixed intra-op thread count (rlvr/determinism.py)
    model, tokenizer = load_model_and_tokenizer(args.model)
    dataset = RLHFDataset([args.data], tokenizer, DataConfig(max_prompt_length=args.max_prompt_length))
    check_scorable(dataset, RewardConfig(), "data_source", args.data)  # before generating, not after
    dataset.say_filtered(f"{args.data} (--max-prompt-length {args.max_prompt_length})")
    multi = sum(bool(row.get("agent_name") or (row.get("extra_info") or {}).get("tools_kwargs")
                     or (row.get("extra_info") or {}).get("interaction_kwargs")) for row in dataset.rows)
    if multi:  # eval has no tools config: such rows get one turn, and score as a single turn does
        print(f"[rlvr] {multi} of {len(dataset)} rows name tools, an agent loop or an interaction; rlvr eval answers "
              "every row in one turn without tools (rlvr rollout --config <the run's config.yaml> runs them as "
              "training does)", file=sys.stderr, flush=True)
    if args.limit:
        dataset.rows, dataset.origins, dataset.prompt_ids = (x[:args.limit] for x in
                                                             (dataset.rows, dataset.origins, dataset.prompt_ids))
    rollout = build_rollout(model, tokenizer, RolloutConfig(), args.max_response_length)
    rewards = RewardManager(tokenizer, RewardConfig())
    start = time.perf_counter()
    metrics = evaluate(rollout.generate_sequences, rewards, dataset, tokenizer, 1, {"do_sample": False},
                       args.batch_size, progress="greedy")
    if args.n > 1:
        metrics.update(evaluate(rollout.generate_sequences, rewards, dataset, tokenizer, args.n,
                                {"do_sample": True, "temperature": args.temperature}, args.batch_size, seed=args.seed,
                                progress=f"{args.n} samples at T={args.temperature}"))
    print(f"{args.model} on {args.data} ({len(dataset)} prompts, {time.perf_counter() - start:.0f} s):")
    for key, value in metrics.items():
        if not key.startswith("val-core/"):  # std and smaller bootstrap sizes stay in the run's metrics
            continue
        name = key.removeprefix("val-core/")
        metric = name.split("/reward/", 1)[-1]
        label = _eval_labels(args.n, args.temperature).get(metric, "")
        print(f"  {name:<40} {value:.4f}  {label}")


def _eval_labels(n: int, temperature: float) -> dict[str, str]:
    """What each printed metric is. mean@1 is the greedy pass's (with n = 1 there is no sampled pass,
    and its mean@n label would have overwritten the greedy one)."""
    sampled = {f"mean@{n}": f"mean accuracy of {n} samples",
               f"best@{n}/mean": f"pass@{n} (T={temperature}; bootstrapped as verl does)",
               f"maj@{n}/mean": f"majority vote of {n}"} if n > 1 else {}
    return {**sampled, "mean@1": "accuracy (greedy)"}


def _refuse_an_adapter(model: str) -> None:
    """A LoRA checkpoint's actor/ (or the checkpoint folder holding it) is an adapter, not a model
    transformers can load alone: say so, and that rlvr export merges it."""
    import json

    path = Path(model).expanduser()
    actor = path / "actor" if (path / "actor" / "adapter_config.json").is_file() else path
    config = actor / "adapter_config.json"
    if not config.is_file():
        return
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path") or "its base model"
    except (OSError, ValueError, AttributeError):
        base = "its base model"
    checkpoint = actor.parent if actor.name == "actor" else actor
    raise ConfigError(f"{actor} is a LoRA adapter (adapter_config.json), not a whole model: `rlvr export {checkpoint} "
                      f"OUT` merges it into its base model ({base}); then evaluate OUT")


def _cmd_export(args: argparse.Namespace) -> None:
    """Copy a checkpoint's policy out as a standalone Hugging Face folder."""
    import shutil

    import json

    from rlvr.models.lora import merged_model
    from rlvr.trainer.checkpoint import actor_missing, damaged_file, latest_checkpoint

    source = Path(args.checkpoint).expanduser()
    if source.name.startswith((".tmp-", ".pruned-")):
        raise ConfigError(f"{source} is a checkpoint being written or removed, not a saved one; export a "
                          "checkpoints/global_step_<k> folder")
    if not (source / "actor").is_dir():  # a run directory: its newest checkpoint
        latest = latest_checkpoint(source / "checkpoints")
        if latest is None:
            raise ConfigError(f"{source} is neither a checkpoint folder (with actor/) nor a run directory with "
                              "checkpoints/global_step_<k>/")
        source = latest
    out = Path(args.out).expanduser()
    if out.exists():
        raise ConfigError(f"{out} already exists; choose a new folder")
    actor = source / "actor"
    config = actor / ("adapter_config.json" if (actor / "adapter_config.json").exists() else "config.json")
    damaged = actor_missing(actor) or damaged_file(actor) or (None if config.is_file() else (config, "is missing"))
    if damaged is not None:  # a copy would carry it into a folder that looks whole
        raise ConfigError(f"cannot export {source}: {damaged[0]} {damaged[1]}; export an earlier checkpoint "
                          f"(a checkpoints/global_step_<k> folder of the run)")
    partial = out.with_name(f".tmp-{out.name}")  # renamed to OUT when whole: a cut-short export leaves no OUT
    shutil.rmtree(partial, ignore_errors=True)
    adapter_config = source / "actor" / "adapter_config.json"
    try:
        if adapter_config.exists():  # a LoRA checkpoint: merge the adapter into its base model
            base = json.loads(adapter_config.read_text())["base_model_name_or_path"]
            merged_model(base, source / "actor").save_pretrained(partial, safe_serialization=True)
            for item in (source / "actor").iterdir():  # the tokenizer files saved next to the adapter
                if item.is_file() and not item.name.startswith("adapter_") and item.name != "README.md":
                    shutil.copy2(item, partial / item.name)
            what = f"{source / 'actor'} (LoRA adapter) merged into {base}"
        else:
            shutil.copytree(source / "actor", partial)
            what = str(source / "actor")
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(f"exported {what} -> {out} (load with AutoModelForCausalLM.from_pretrained)")


def _cmd_plot(args: argparse.Namespace) -> None:
    from rlvr.trainer.plot import plot_run, read_metrics

    try:
        read_metrics(Path(args.run_dir).expanduser())  # refused here, naming the file and line, not mid-plot
    except (FileNotFoundError, ValueError) as err:  # no metrics.jsonl; a damaged line before the last
        raise ConfigError(str(err)) from None
    paths = plot_run(args.run_dir, args.out)
    print(f"wrote {len(paths)} PNG files to {paths[0].parent} (curves.png has every panel)")


def _cmd_config(args: argparse.Namespace) -> None:
    print(to_yaml(_load(args)), end="")


def _cmd_rollout(args: argparse.Namespace) -> None:
    """Load the model and a batch of validation prompts, generate, score, print."""
    from rlvr.data import RLHFDataset
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rewards import RewardManager
    from rlvr.rollout import ToolSetup, build_rollout
    from rlvr.trainer.evaluate import generation_batch
    from rlvr.trainer.main import check_scorable, validation_reward_config

    cfg = _load(args)
    pin_threads()  # one fixed intra-op thread count (rlvr/determinism.py)
    model_cfg = cfg.actor_rollout_ref.model  # loaded as the actor loads it
    model = load_model(model_cfg.path, "float32", "cpu", model_cfg.trust_remote_code, model_cfg.override_config)
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
    tools = ToolSetup.from_config(tokenizer, cfg.actor_rollout_ref.rollout, cfg.data.apply_chat_template_kwargs)
    dataset = RLHFDataset(cfg.data.val_files, tokenizer, cfg.data, tools.chat if tools else None)
    reward = validation_reward_config(cfg.reward)  # the run's validation scoring: its functions, no length penalty
    check_scorable(dataset, reward, cfg.data.reward_fn_key, "data.val_files")  # before generating, not after
    dataset.say_filtered("data.val_files")
    items = [dataset[i] for i in range(min(args.limit, len(dataset)))]
    batch = dataset.collate(items)
    gen = generation_batch(batch)  # what the engine reads; the rest (reward columns) stays for scoring
    gen.meta_info.update(do_sample=cfg.actor_rollout_ref.rollout.val_kwargs.do_sample)
    rollout = build_rollout(model, tokenizer, cfg.actor_rollout_ref.rollout, cfg.data.max_response_length, tools,
                            cfg.data.max_prompt_length, template_kwargs=cfg.data.apply_chat_template_kwargs,
                            model_cfg=model_cfg)
    rollout.sync_weights()  # an engine of its own (vllm) gets the model's weights
    start = time.perf_counter()
    out = rollout.generate_sequences(gen)
    elapsed = time.perf_counter() - start
    manager = RewardManager(tokenizer, reward, cfg.data.reward_fn_key)
    try:
        result = manager(batch.union(out))
    finally:
        manager.close()
    scores = result.token_level_scores.sum(dim=-1).tolist()
    for i, item in enumerate(items):
        present = out.batch["attention_mask"][i, -out.batch["responses"].shape[1]:].bool()
        text = tokenizer.decode(out.batch["responses"][i][present], skip_special_tokens=True)
        if i < args.show:
            question = item["extra_info"].get("expression") or item["extra_info"].get("question", "")
            print(f"[{i}] {question!s:>12} -> {text.strip()[:80]!r}  score={scores[i]:.0f}")
    tokens = int(out.batch["response_mask"].sum())
    print(f"{len(items)} prompts, mean score {sum(scores) / len(scores):.3f}, "
          f"{tokens} tokens in {elapsed:.1f} s ({tokens / elapsed:.1f} tokens/s)")
    if "messages" in out.non_tensor_batch:
        called = [any(m["role"] == "tool" for m in msgs) for msgs in out.non_tensor_batch["messages"]]
        correct = [s > 0 for s in scores]
        through = sum(c and t for c, t in zip(correct, called))
        print(f"tool-call rate {sum(called) / len(called):.3f}; {through} of {sum(correct)} correct answers came "
              "after a tool call")


def _cmd_serve(args: argparse.Namespace) -> None:
    """The config's model behind SGLang's and OpenAI's HTTP routes (docs/serve.md)."""
    from rlvr.serve.runner import ServeOptions, check_host, serve

    options = ServeOptions(args.host, args.port, args.api_key, args.request_timeout, args.max_waiting,
                           args.max_model_len, args.served_model_name, args.tool_call_parser,
                           args.max_num_batched_tokens)
    check_host(options)  # before anything loads
    cfg = _load(args)
    pin_threads()  # one fixed intra-op thread count (rlvr/determinism.py)
    serve(cfg, options)


def _cmd_algos(args: argparse.Namespace) -> None:
    from rlvr.algos import ADV_ESTIMATORS, POLICY_LOSSES
    from rlvr.algos.kl import KL_TYPES
    from rlvr.algos.losses import LOSS_AGG_MODES

    for title, key, registry in (("advantage estimators", "algorithm.adv_estimator", ADV_ESTIMATORS),
                                 ("policy losses", "actor_rollout_ref.actor.policy_loss.loss_mode", POLICY_LOSSES)):
        print(f"{title} ({key}):")
        for name, doc in registry.summaries().items():
            print(f"  {name:<30} {doc}")
    print(f"KL estimators (actor_rollout_ref.actor.kl_loss_type, algorithm.kl_penalty): {', '.join(KL_TYPES)}")
    print(f"loss aggregation (actor_rollout_ref.actor.loss_agg_mode): {', '.join(LOSS_AGG_MODES)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a policy (default: GRPO, built-in model, arithmetic task)")
    _add_config_args(p)
    _add_plan_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the memory plan (as rlvr plan) and exit")
    p.add_argument("--explain", action="store_true",
                   help="print the objective the config resolves to (batches, estimator, loss, KL, off-policy degree, "
                        "importance sampling, inert keys, defaults unlike verl's) and exit; nothing loads")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("plan", help="per-device memory of a training run, before anything loads")
    _add_config_args(p)
    _add_plan_args(p)
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("eval", help="greedy accuracy and pass@n of a local model on a prepared split")
    p.add_argument("--model", required=True, help="HF folder, .gguf file, builtin, or an exported checkpoint")
    p.add_argument("--data", required=True, help="a parquet/JSONL split, e.g. ~/data/arithmetic/test.parquet")
    p.add_argument("--n", type=_at_least(1), default=1, help="samples per prompt for pass@n (1: greedy only)")
    p.add_argument("--temperature", type=_positive_float, default=1.0, help="sampling temperature for pass@n (> 0)")
    p.add_argument("--max-response-length", type=_at_least(1), default=256)
    p.add_argument("--max-prompt-length", type=_at_least(1), default=1024)
    p.add_argument("--batch-size", type=_at_least(1), default=None,
                   help="prompts per generation batch (default: all; the progress bar moves once per batch)")
    p.add_argument("--limit", type=_at_least(0), default=0, help="only the first N prompts (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("plot", help="PNG curves (reward, validation accuracy, length, KL, entropy, step time)")
    p.add_argument("run_dir", help="a run directory with metrics.jsonl")
    p.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser("export", help="write a checkpoint's policy as a standalone Hugging Face folder")
    p.add_argument("checkpoint", help="a checkpoints/global_step_<k> folder, or a run directory (newest checkpoint)")
    p.add_argument("out", help="the new folder")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("prepare", help="write train/test parquet files for a task")
    p.add_argument("task", choices=["arithmetic", "calculator", "calculator_no_tool", "countdown", "gsm8k"],
                   help="calculator: the tool task (train with --config calculator); calculator_no_tool: the same "
                        "problems without the tool")
    p.add_argument("--out", help="output folder (default ~/data/TASK)")
    p.add_argument("--src", help="gsm8k: folder or file with the raw GSM8K data")
    p.add_argument("--system-prompt", help="gsm8k: a system prompt (text, or think-answer / think-answer-zh: the "
                                           "<think>/<answer> format of the gsm8k_zh recipe); the question then goes "
                                           "bare, without the '####' instruction")
    p.add_argument("--train-size", type=_at_least(1), default=None,
                   help="rows in train (default 1000; countdown 10000)")
    p.add_argument("--test-size", type=_at_least(1), default=None, help="rows in test (default 300; calculator 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=None, help="arithmetic: digits of the largest operand (default 2)")
    p.add_argument("--max-operand", type=int, default=None,
                   help="arithmetic: largest operand (default 20; 0: by --digits)")
    p.add_argument("--operators", default=None, help="arithmetic: operators to use, from +-*/ (default +-*)")
    p.add_argument("--num-operands", type=int, default=None, help="arithmetic: numbers per problem (default 2)")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("config", help="print the resolved config")
    p.add_argument("action", choices=["show"])
    _add_config_args(p)
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("algos", help="list the registered advantage estimators, policy losses and KL types")
    p.add_argument("action", choices=["list"])
    p.set_defaults(func=_cmd_algos)

    p = sub.add_parser("rollout", help="generate and score responses for a few validation prompts")
    p.add_argument("--limit", type=_at_least(1), default=16, help="number of prompts")
    p.add_argument("--show", type=int, default=8, help="print this many samples")
    _add_config_args(p)
    p.set_defaults(func=_cmd_rollout)

    p = sub.add_parser("serve", help="serve the config's model over HTTP: SGLang's routes and OpenAI's /v1")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (another than loopback needs --api-key)")
    p.add_argument("--port", type=_at_least(1, 65535), default=8000)
    p.add_argument("--api-key", default=None, help="every request must send Authorization: Bearer KEY")
    p.add_argument("--request-timeout", type=_positive_float, default=600.0,
                   help="seconds a request may run; past them its rows are aborted and it gets 504")
    p.add_argument("--max-waiting", type=_at_least(1), default=4096,
                   help="rows that may wait for a free row (a request of n samples counts n); more get 503 with "
                        "Retry-After")
    p.add_argument("--max-model-len", type=_at_least(2), default=None,
                   help="prompt + new tokens of one request (default: rollout.max_model_len, else the model's "
                        "max_position_embeddings)")
    p.add_argument("--max-num-batched-tokens", type=_at_least(1), default=None,
                   help="tokens one engine step takes: a decode token per running row plus the prompts it admits "
                        "(default: rollout.max_num_batched_tokens, else 1024: a burst of requests is prefilled a part "
                        "per step)")
    p.add_argument("--served-model-name", default=None, help="the name /v1/models lists (default: model.path)")
    p.add_argument("--tool-call-parser", default="hermes", help="how chat tool calls are read: hermes or tag")
    _add_config_args(p)
    p.set_defaults(func=_cmd_serve)
    return parser


def _at_least(low: int, high: int | None = None):
    """An argparse type: an integer >= ``low`` (and <= ``high``); anything else is refused naming
    the option."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's message for a non-number: "invalid int value"
    return parse


def _positive_float(text: str) -> float:
    """An argparse type: a finite float > 0 (a sampling temperature: 0 is greedy, below 0 inverts the
    distribution)."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (pass@n samples at this temperature; greedy accuracy "
                                         f"needs none), got {text}")
    return value


_positive_float.__name__ = "float"


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML file layered over the GRPO recipe, or a shipped recipe: "
                                    "grpo (the default), dapo, gsm8k_zh, calculator, distill; verl: verl's defaults")
    p.add_argument("--config-path", help="Hydra's (verl's scripts): the folder of --config-name")
    p.add_argument("--config-name", help="Hydra's (verl's scripts): a YAML in --config-path; one whose defaults "
                                         "list names ppo_trainer starts from verl's defaults")
    p.add_argument("--base", choices=["grpo", "verl"], default=None,
                   help="what the config starts from: grpo (rlvr's recipe) or verl (verl's defaults, as "
                        "python -m rlvr.trainer.main_ppo); default: verl for a YAML of verl's shape, else grpo")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. data.train_batch_size=16; also "
                                                "+key=value, ++key=value and ~key (back to the schema default)")


# the configs verl's main_ppo bundles (verl/trainer/config/), as its scripts name them with a relative
# --config-path: None, verl's defaults (rlvr's verl base); otherwise why rlvr has no such config
VERL_BUNDLED_CONFIGS = {
    "ppo_trainer": None,
    "ppo_megatron_trainer": f"{MEGATRON_BACKEND}: drop --config-path/--config-name and every *.megatron.* key; "
                            f"{MEGATRON_LORA}",
}


def _config_file(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the config file, the base) from --config and --base, or from Hydra's --config-path/--config-name
    as verl's scripts pass them (verl's bundled ppo_trainer is no file: verl's defaults as the base)."""
    if args.config_name is None:
        if args.config_path is not None:
            raise ConfigError("--config-path names the folder of --config-name; give --config-name too")
        return args.config, args.base
    if args.config is not None:
        raise ConfigError("--config and --config-name both name the config file; keep one")
    name = args.config_name if args.config_name.endswith((".yaml", ".yml")) else f"{args.config_name}.yaml"
    path = Path(args.config_path or ".").expanduser() / name
    stem = Path(name).stem
    if not path.is_file() and stem in VERL_BUNDLED_CONFIGS and not Path(args.config_path or ".").is_absolute():
        # Hydra reads a relative --config-path beside verl's main_ppo: verl's own config of that name
        if VERL_BUNDLED_CONFIGS[stem] is not None:
            raise ConfigError(f"--config-name {args.config_name!r} is verl's bundled {stem}.yaml: "
                              f"{VERL_BUNDLED_CONFIGS[stem]}")
        if args.base not in (None, "verl"):
            raise ConfigError(f"--config-name {args.config_name!r} is verl's defaults; --base {args.base} is not: keep one")
        return None, "verl"
    if not path.is_file():
        raise ConfigError(f"--config-name {args.config_name!r}: {path} does not exist (looked in --config-path "
                          f"{args.config_path or '.'!r})")
    return str(path), args.base


def _load(args: argparse.Namespace, device_hint: str | None = None):
    config_file, base = _config_file(args)
    return load_config(config_file, args.overrides, base=base, device_hint=device_hint)


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-memory-gb", type=float, default=None,
                   help="memory of one device for the plan (default: the GPU's, or on a CPU this machine's RAM)")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse reads a subcommand's ``overrides`` in one stretch: key=value words after an option
    (``config show --config dapo k=v``, ``train a=1 --config dapo b=2``) come back unrecognised. They
    are overrides where the command takes them, in the order typed; anything else is refused."""
    args, extra = parser.parse_known_args(argv)
    stray = [word for word in extra if word.startswith("-")]
    if extra and (stray or not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        args.func(args)
    except USER_ERRORS as err:
        print(f"rlvr {args.command}: error: {err}", file=sys.stderr)
        return 2
    except TrainingInterrupted as err:
        print(f"rlvr {args.command}: {err}", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        print(f"rlvr {args.command}: error: {err.strerror}: {err.filename}; {DISK_ADVICE}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the fit loop (which saves and says so), or in any other command
        what = "interrupted before training started; nothing was saved" if args.command == "train" else "interrupted"
        print(f"rlvr {args.command}: {what}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
