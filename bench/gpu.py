"""rlvr on one CUDA device: the default job with FSDP2, the measured peak of each phase next to
the memory plan, and the native engine's tokens/s.

    python bench/gpu.py [--model builtin] [--parts parity,phases,rollout,train] [--steps 24] [--out DIR]

- ``phases``: the hybrid worker of the default job (8 prompts x n = 8 from the arithmetic
  task, 64-token responses, GRPO with the k3 KL loss) built in this process with
  ``strategy=fsdp2`` at world size 1, on ``cuda``, through two steps: init, generation, old
  and reference log-probs, one update. Before each phase the CUDA allocator's peak is reset;
  after it ``max_memory_allocated`` (and ``max_memory_reserved``) is read. The second step's
  figures are reported (the AdamW state exists by then), next to ``plan_memory``'s figure for
  the same config. The plan counts tensors, as ``max_memory_allocated`` does; reserved adds
  the caching allocator's slack.
- ``rollout``: the native engine (``NativeRollout``, lean decode off: it is a CPU path) on
  ``cuda``, 8 arithmetic prompts x n = 8, up to 128 new tokens, temperature 1.0, bf16 and
  fp32, against transformers' ``model.generate`` with the same prompts (bench/rollout.py's
  workload and counting), three seeds each, alternating; the median of the ratios.
- ``parity``: the prompt-once forward's flat layout (groups back to back in one row, attention
  span by span through transformers' SDPA entry) against the padded layout and the plain
  per-row forward on this device: response log-probs, entropy and the gradient of the built-in
  model on 8 arithmetic prompts x n = 8 with responses the native engine sampled, in fp32 and
  bf16 autocast. The CPU tests check the same equalities; CUDA's SDPA picks other kernels.
- ``train``: ``rlvr train`` of the default job on ``trainer.device=cuda`` with
  ``actor_rollout_ref.actor.strategy=fsdp2`` (and ``local`` with ``--strategies``), validation
  included: greedy accuracy at each validation, wall time, the median step split.
- ``profile`` (not in the default ``--parts``): one bf16 engine call under torch's profiler, its
  table written to ``OUT/profile.txt``.

Exits non-zero when no CUDA device is present: CI never runs this; the README says which
figures came from it and on what device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from runs import at_least, comma_list, fresh_run_dir, one_of, rlvr_train  # noqa: E402 (bench/ on the path first)
GB = 1e9
DEVICE = "cuda"  # --device cpu runs the same code without the memory figures (a smoke test of this script)


def job_overrides(model: str, strategy: str = "fsdp2") -> list[str]:
    return [f"actor_rollout_ref.model.path={model}", f"trainer.device={DEVICE}",
            f"actor_rollout_ref.actor.strategy={strategy}"]


def phases(model: str) -> list[dict]:
    """Per-phase CUDA peaks of the default job's worker (world size 1, FSDP2), against the plan."""
    import numpy as np

    from rlvr.config import load_config
    from rlvr.distributed.worker import free_port
    from rlvr.models.loader import load_tokenizer
    from rlvr.trainer.memory_plan import plan_memory, read_model_config
    from rlvr.workers.hybrid import ActorRolloutRefWorker
    from rollout import make_batch

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"})
    config = load_config(None, job_overrides(model) + ["trainer.total_training_steps=2"])
    plan = plan_memory(config, read_model_config(model))
    arr = config.actor_rollout_ref
    tokenizer = load_tokenizer(model)
    worker = ActorRolloutRefWorker(config, total_training_steps=2, tokenizer=tokenizer)
    device = torch.device(DEVICE)
    cuda = device.type == "cuda"
    base = torch.cuda.memory_allocated(device) if cuda else 0
    peaks: dict[str, tuple[int, int]] = {}

    def measure(phase: str, fn):
        if not cuda:
            peaks[phase] = (0, 0)
            return fn()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        peaks[phase] = (torch.cuda.max_memory_allocated(device) - base, torch.cuda.max_memory_reserved(device))
        return out

    measure("init", worker.init_model)
    prompts = make_batch(tokenizer, config.data.train_batch_size, arr.rollout.n)
    for step in range(2):
        prompts.meta_info["seed"] = step
        prompts.non_tensor_batch["uid"] = np.array([f"s{step}p{i // arr.rollout.n}" for i in range(len(prompts))],
                                                   dtype=object)
        batch = measure("generation", lambda: worker.generate_sequences(prompts))
        batch.non_tensor_batch["uid"] = prompts.non_tensor_batch["uid"]

        def update():
            full = batch.union(worker.compute_log_prob(batch)).union(worker.compute_ref_log_prob(batch))
            generator = torch.Generator().manual_seed(step)
            full.batch["advantages"] = (torch.randn(len(full), 1, generator=generator)
                                        * full.batch["response_mask"])
            return worker.update_actor(full)

        measure("update", update)
    rows = []
    for phase in ("init", "generation", "update"):
        allocated, reserved = peaks[phase]
        rows.append({"phase": phase, "allocated": allocated, "reserved": reserved, "plan": plan.phase_bytes(phase)})
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"):  # not for `rlvr train` later
        os.environ.pop(key, None)
    return rows


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def rollout_speed(model_path: str, repeats: int) -> list[dict]:
    from rlvr.config.schema import RolloutConfig
    from rlvr.models import load_model_and_tokenizer
    from rlvr.rollout import NativeRollout
    from rollout import make_batch, timed, timed_generate

    rows = []
    for dtype in ("bfloat16", "float32"):
        model, tokenizer = load_model_and_tokenizer(model_path, device=DEVICE)
        batch = make_batch(tokenizer, 8, 8)
        on_device = batch.to(DEVICE)  # model.generate reads the prompt tensors on the model's device
        engine = NativeRollout(model, tokenizer, RolloutConfig(temperature=1.0, dtype=dtype, lean_decode=False), 128)
        timed(engine, batch[:8])
        generate_model = engine.model  # the engine's weights in its dtype, as bench/rollout.py compares
        timed_generate(generate_model, tokenizer, engine.eos_ids, on_device[:8], 8)
        runs = {"engine": lambda seed: timed(engine, batch, seed),
                "generate": lambda seed: timed_generate(generate_model, tokenizer, engine.eos_ids, on_device, 128, seed)}
        rates, gen_rates = [], []
        for seed in range(repeats):
            done = {}
            for name in (list(runs) if seed % 2 == 0 else list(runs)[::-1]):  # the order flips every seed
                sync()
                done[name] = runs[name](seed)
                sync()
            (t, n), (t_gen, n_gen) = done["engine"], done["generate"]
            rates.append(n / t)
            gen_rates.append(n_gen / t_gen)
            print(f"  {dtype} seed {seed}: engine {rates[-1]:.0f} tokens/s, generate {gen_rates[-1]:.0f} tokens/s",
                  flush=True)
        ratios = [a / b for a, b in zip(rates, gen_rates)]
        rows.append({"dtype": dtype, "engine": statistics.median(rates), "generate": statistics.median(gen_rates),
                     "ratio": statistics.median(ratios), "range": (min(ratios), max(ratios))})
        del engine, model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def parity(model_path: str) -> list[dict]:
    """Flat vs padded vs plain prompt-once forward on this device (see the module docstring)."""
    from rlvr.config.schema import RolloutConfig
    from rlvr.models import load_model_and_tokenizer
    from rlvr.rollout import NativeRollout
    from rlvr.workers import forward
    from rollout import make_batch

    model, tokenizer = load_model_and_tokenizer(model_path, device=DEVICE)
    prompts = make_batch(tokenizer, 8, 8)
    prompts.meta_info["seed"] = 0
    engine = NativeRollout(model, tokenizer, RolloutConfig(temperature=1.0, lean_decode=False), 64)
    out = engine.generate_sequences(prompts)
    del engine
    b = {k: out.batch[k].to(DEVICE) for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    uids = prompts.non_tensor_batch["uid"]
    model.train()
    real = forward._uses_sdpa

    def run(layout: str, dtype: str):
        forward._uses_sdpa = (lambda m: False) if layout == "padded" else real
        try:
            model.zero_grad()
            lp, ent = forward.forward_log_probs(model, b, uids, 1.0, calculate_entropy=True, entropy_grad=True,
                                                share_prompt=layout != "plain", pad_id=tokenizer.pad_token_id,
                                                dtype=dtype)
            (lp.sum() + 0.1 * ent.sum()).backward()
        finally:
            forward._uses_sdpa = real
        grad = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        return lp.detach().float(), ent.detach().float(), grad

    rows = []
    for dtype in ("float32", "bfloat16"):
        plain = run("plain", dtype)
        for layout in ("padded", "flat"):
            got = run(layout, dtype)
            rows.append({"dtype": dtype, "layout": layout, "tokens": int(out.batch["response_mask"].sum()),
                         "log_prob_max_diff": float((got[0] - plain[0]).abs().max()),
                         "entropy_max_diff": float((got[1] - plain[1]).abs().max()),
                         "grad_rel_diff": float((got[2] - plain[2]).norm() / plain[2].norm())})
            print(f"  {rows[-1]}", flush=True)
    return rows


def profile_engine(model_path: str, out: Path) -> str:
    """One bf16 engine call under torch's profiler: where a decode step's time goes on this device."""
    from torch.profiler import ProfilerActivity, profile

    from rlvr.config.schema import RolloutConfig
    from rlvr.models import load_model_and_tokenizer
    from rlvr.rollout import NativeRollout
    from rollout import make_batch, timed

    model, tokenizer = load_model_and_tokenizer(model_path, device=DEVICE)
    batch = make_batch(tokenizer, 8, 8)
    engine = NativeRollout(model, tokenizer, RolloutConfig(temperature=1.0, dtype="bfloat16", lean_decode=False), 128)
    timed(engine, batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        elapsed, tokens = timed(engine, batch, 1)
        sync()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    text = f"{tokens} tokens in {elapsed:.2f} s\n{table}"
    (out / "profile.txt").write_text(text)
    return text


def train(model: str, strategy: str, steps: int | None, out: Path) -> dict:
    extra = [f"trainer.total_training_steps={steps}"] if steps else []
    done = rlvr_train([*job_overrides(model, strategy), "trainer.save_freq=-1", *extra], out / f"train-{strategy}",
                      out / f"train-{strategy}.log")
    records = done["records"]
    steps_done = [r for r in records if "timing_s/step" in r and r.get("step", 0) >= 2]
    median = {k: statistics.median(r[k] for r in steps_done if k in r)
              for k in ("timing_s/step", "timing_s/gen", "timing_s/ref", "timing_s/update_actor")
              if any(k in r for r in steps_done)}
    peak = max((r.get("perf/max_memory_allocated_gb", 0) for r in records), default=0)
    return {"strategy": strategy, "wall_s": done["wall_s"], "accuracy": done["accuracy"], "median": median,
            "peak_gib": peak}


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--parts", type=comma_list(one_of("parity", "phases", "rollout", "train", "profile")),
                        default="parity,phases,rollout,train")
    parser.add_argument("--strategies", type=comma_list(one_of("fsdp2", "local")), default="fsdp2",
                        help="of the train part")
    parser.add_argument("--steps", type=at_least(1), default=None, help="training steps (default: the recipe's 24)")
    parser.add_argument("--repeats", type=at_least(1), default=3, help="seeds of the rollout part")
    parser.add_argument("--out", default="outputs/gpu-bench")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke test of this script
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA device; none is visible to torch")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts
    if "train" in parts:  # an earlier run's folder is refused now, not after the other parts
        for strategy in args.strategies:
            fresh_run_dir(out / f"train-{strategy}")
    device = f"{torch.cuda.get_device_name(0) if DEVICE == 'cuda' else 'cpu'}, torch {torch.__version__}"
    report: dict = {"device": device}
    print(f"device: {device}", flush=True)
    if "phases" in parts:
        report["phases"] = phases(args.model)
        (out / "gpu.json").write_text(json.dumps(report, indent=1))
    if "rollout" in parts:
        report["rollout"] = rollout_speed(args.model, args.repeats)
        (out / "gpu.json").write_text(json.dumps(report, indent=1))
    if "parity" in parts:
        report["parity"] = parity(args.model)
        (out / "gpu.json").write_text(json.dumps(report, indent=1))
    if "profile" in parts:
        print(profile_engine(args.model, out), flush=True)
    if "train" in parts:
        report["train"] = [train(args.model, s, args.steps, out) for s in args.strategies]
        (out / "gpu.json").write_text(json.dumps(report, indent=1))

    print(f"\n{device}")
    if "phases" in report:
        print_table("per-phase peak of the default job's worker (FSDP2, world size 1), second step",
                    ["phase", "max allocated GB", "max reserved GB", "plan GB", "plan / allocated"],
                    [[r["phase"], f"{r['allocated'] / GB:.2f}", f"{r['reserved'] / GB:.2f}", f"{r['plan'] / GB:.2f}",
                      f"{r['plan'] / max(r['allocated'], 1):.2f}"] for r in report["phases"]])
    if "rollout" in report:
        print_table("native engine on cuda, 8 arithmetic prompts x n = 8, <= 128 tokens, T = 1.0",
                    ["dtype", "engine tokens/s", "model.generate tokens/s", "ratio (median, range)"],
                    [[r["dtype"], f"{r['engine']:.0f}", f"{r['generate']:.0f}",
                      f"{r['ratio']:.2f}x ({r['range'][0]:.2f}-{r['range'][1]:.2f})"] for r in report["rollout"]])
    if "parity" in report:
        print_table("prompt-once forward against the plain per-row forward (max |diff| of log-probs and entropy, "
                    "relative gradient difference)", ["dtype", "layout", "log-probs", "entropy", "gradient"],
                    [[r["dtype"], r["layout"], f"{r['log_prob_max_diff']:.1e}", f"{r['entropy_max_diff']:.1e}",
                      f"{r['grad_rel_diff']:.1e}"] for r in report["parity"]])
    for r in report.get("train", []):
        acc = ", ".join(f"step {s}: {a:.3f}" for s, a in sorted(r["accuracy"].items()))
        split = ", ".join(f"{k.split('/')[1]} {v:.2f} s" for k, v in r["median"].items())
        print(f"\nrlvr train, strategy={r['strategy']}: {r['wall_s']:.0f} s wall; greedy accuracy {acc}; "
              f"median step (from step 2): {split}; peak allocated {r['peak_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
