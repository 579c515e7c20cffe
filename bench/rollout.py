"""Rollout throughput: rlvr's native engine vs vLLM (``rollout.name=vllm``, its CPU build, in
this process, eager, prefix caching on) vs transformers' ``model.generate`` on GRPO's workload
(8 distinct prompts x n=8, up to 128 new tokens, temperature 1.0), in one process.

    .venv/bin/python bench/rollout.py [--prompts 8] [--n 8] [--max-new-tokens 128] [--dtypes float32,bfloat16] [--repeats 3]

Prints generated tokens/s for each engine and the ratios to ``generate``, per dtype, the fp32
compute ceiling (the projections' FLOPs a token against a ``torch.mm`` peak measured after each
setting) and the fraction of it each engine reached, and the peak resident memory of the
process. ``generate`` is timed with the same prompts, the same sampling settings and its padded
rows not counted as generated tokens. Shared machines are noisy and
tokens/s depends on the lengths drawn (a batch decodes until its longest row ends), so the engines
alternate ``--repeats`` times (each warmed up first; the order flips every repeat), repeat r
sampling with seed r in all, and the median of the per-repeat ratios is reported.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path
import statistics
import time

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.config.validate import DTYPES
from rlvr.data import left_pad
from rlvr.data.tasks import arithmetic
from rlvr.models import load_model_and_tokenizer
from rlvr.protocol import DataProto
from runs import at_least, comma_list, one_of

PROMPT_SETS = ("arithmetic", "open", "tools")

QUESTIONS = ["What is 17 + 25? Explain step by step.", "Write a short poem about the sea.",
             "What is the capital of France, and why is it famous?", "Compute 12 * 13 and show your work.",
             "Give three tips for learning a new language.", "Explain photosynthesis to a child.",
             "What is 144 divided by 12?", "Describe a cat in two sentences."]


def questions(kind: str, num_prompts: int) -> list[str]:
    """``arithmetic``: the built-in task's test prompts (the default GRPO workload);
    ``open``: open-ended questions with long answers."""
    if kind == "open":
        return [QUESTIONS[i % len(QUESTIONS)] for i in range(num_prompts)]
    rows = arithmetic.make_splits(0, num_prompts, seed=0)["test"]
    return [row["prompt"][0]["content"] for row in rows]


def tool_prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    """The calculator task's prompts as its recipe renders them (a system prompt with the tool's
    schema and the call format: ~200 tokens, the length of a tool or agent task's prompt), from
    ``rlvr prepare calculator``'s test split."""
    from rlvr.config.schema import DataConfig, MultiTurnConfig
    from rlvr.data import RLHFDataset
    from rlvr.rollout import ToolSetup

    config = RolloutConfig(multi_turn=MultiTurnConfig(enable=True, tool_config_path="calculator", format="tag"))
    setup = ToolSetup.from_config(tokenizer, config)
    data = Path("~/data/calculator/test.parquet").expanduser()
    if not data.exists():
        raise SystemExit(f"{data} is missing: run `.venv/bin/rlvr prepare calculator` first")
    dataset = RLHFDataset([data], tokenizer, DataConfig(max_prompt_length=512, return_raw_chat=True), setup.chat)
    rows = [dataset[i] for i in range(num_prompts)]
    return [list(row["raw_prompt_ids"]) for row in rows]


def make_batch(tokenizer, num_prompts: int, n: int, kind: str = "arithmetic") -> DataProto:
    if kind == "tools":
        ids = tool_prompts(tokenizer, num_prompts)
        input_ids, mask, pos = left_pad(ids, tokenizer.pad_token_id)
        batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
                                    {"uid": [str(i) for i in range(num_prompts)]})
        return batch.repeat(n, interleave=True)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False) for q in questions(kind, num_prompts)]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    input_ids, mask, pos = left_pad(ids, tokenizer.pad_token_id)
    batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
                                {"uid": [str(i) for i in range(num_prompts)]})
    return batch.repeat(n, interleave=True)


def timed(engine, batch: DataProto, seed: int = 0) -> tuple[float, int]:
    batch.meta_info["seed"] = seed
    start = time.perf_counter()
    out = engine.generate_sequences(batch)
    return time.perf_counter() - start, int(out.batch["response_mask"].sum())


def timed_own_prompts(engine, batch: DataProto, seed: int) -> tuple[float, int]:
    """``timed`` with every row reading its own copy of its group's prompt in decode steps."""
    shared, engine.core.share_prompts = engine.core.share_prompts, False
    try:
        return timed(engine, batch, seed)
    finally:
        engine.core.share_prompts = shared


@torch.inference_mode()
def timed_generate(model, tokenizer, eos_ids, batch: DataProto, max_new_tokens: int, seed: int = 0) -> tuple[float, int]:
    """Plain ``model.generate`` (multinomial sampling, T=1, no top-k/top-p), tokens up to each row's EOS."""
    from rlvr.rollout import response_mask_from_eos  # rlvr.rollout imports transformers: not needed to check arguments

    torch.manual_seed(seed)
    start = time.perf_counter()
    out = model.generate(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                         eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    elapsed = time.perf_counter() - start
    responses = out[:, batch.batch["input_ids"].shape[1]:]
    return elapsed, int(response_mask_from_eos(responses, eos_ids).sum())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=at_least(1), default=8)
    parser.add_argument("--n", type=at_least(1), default=8)
    parser.add_argument("--max-new-tokens", type=at_least(1), default=128)
    parser.add_argument("--dtypes", type=comma_list(one_of(*DTYPES)), default="float32,bfloat16")
    parser.add_argument("--prompt-set", type=comma_list(one_of(*PROMPT_SETS)), default="arithmetic,open",
                        help="arithmetic, open and/or tools (the calculator task's ~200-token prompts)")
    parser.add_argument("--no-shared-prompts", action="store_true",
                        help="every row reads its own copy of its group's prompt in decode steps (the engine before)")
    parser.add_argument("--shared-ab", action="store_true",
                        help="also time the engine with every row reading its own copy of the prompt (same seeds)")
    parser.add_argument("--repeats", type=at_least(1), default=3, help="alternating engine/generate runs per setting")
    parser.add_argument("--skip-generate", action="store_true", help="do not time model.generate")
    parser.add_argument("--skip-vllm", action="store_true", help="do not time vLLM")
    parser.add_argument("--no-lean", action="store_true", help="rollout.lean_decode=false (transformers decode step)")
    args = parser.parse_args(argv)
    if args.shared_ab and (args.no_shared_prompts or args.no_lean):  # the lean step is what reads a shared prompt
        parser.error("--shared-ab times shared prompts against each row's own: it needs the lean decode step with "
                     "shared prompts (no --no-shared-prompts, no --no-lean)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rlvr.rollout import NativeRollout, VLLMRollout  # here: checking the arguments needs no transformers
    from step import matmul_peak_gflops, parameter_counts

    model, tokenizer = load_model_and_tokenizer("builtin")
    print(f"workload: {args.prompts} prompts x n={args.n}, <= {args.max_new_tokens} new tokens, temperature 1.0, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeats")
    for kind, dtype in [(k, d) for k in args.prompt_set for d in args.dtypes]:
        batch = make_batch(tokenizer, args.prompts, args.n, kind)
        config = RolloutConfig(temperature=1.0, dtype=dtype, lean_decode=not args.no_lean)
        native = NativeRollout(model, tokenizer, config, args.max_new_tokens)
        native.core.share_prompts = native.core.share_prompts and not args.no_shared_prompts
        timed(native, batch[: args.n])  # warm-up: first-call allocations and lazy imports
        runs = {"rlvr": lambda seed: timed(native, batch, seed)}
        if args.shared_ab:
            runs["own"] = lambda seed: timed_own_prompts(native, batch, seed)
        if not args.skip_vllm:
            vllm = VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", temperature=1.0, dtype=dtype),
                               args.max_new_tokens, max_prompt_length=int(batch.batch["input_ids"].shape[1]))
            vllm.sync_weights()
            timed(vllm, batch[: args.n])
            runs["vllm"] = lambda seed: timed(vllm, batch, seed)
        if not args.skip_generate:
            timed_generate(native.model, tokenizer, native.eos_ids, batch[: args.n], args.max_new_tokens)  # warm-up too
            runs["generate"] = lambda seed: timed_generate(native.model, tokenizer, native.eos_ids, batch,
                                                           args.max_new_tokens, seed)
        rates, gen_rates, vllm_rates, own_rates = [], [], [], []
        for repeat in range(args.repeats):  # each repeat samples with its own seed, in every engine
            order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]  # flips every repeat: the machine drifts
            done = {name: runs[name](repeat) for name in order}
            t_native, tok_native = done["rlvr"]
            rates.append(tok_native / t_native)
            line = f"    rlvr engine: {tok_native} tokens in {t_native:.1f} s = {rates[-1]:.1f} tokens/s"
            if "own" in done:
                t_own, tok_own = done["own"]
                own_rates.append(tok_own / t_own)
                line += f" | each row its own prompt: {own_rates[-1]:.1f} tokens/s ({rates[-1] / own_rates[-1]:.2f}x)"
            if "vllm" in done:
                t_vllm, tok_vllm = done["vllm"]
                vllm_rates.append(tok_vllm / t_vllm)
                line += f" | vLLM: {tok_vllm} tokens in {t_vllm:.1f} s = {vllm_rates[-1]:.1f} tokens/s"
            if "generate" in done:
                t_gen, tok_gen = done["generate"]
                gen_rates.append(tok_gen / t_gen)
                line += (f" | model.generate: {tok_gen} tokens in {t_gen:.1f} s = {gen_rates[-1]:.1f} tokens/s"
                         f" | ratio {rates[-1] / gen_rates[-1]:.2f}x")
            print(line, flush=True)
        summary = f"[{kind} prompts, {dtype}] median rlvr engine {statistics.median(rates):.1f} tokens/s"
        if vllm_rates:
            ratios = [a / b for a, b in zip(rates, vllm_rates)]
            summary += (f" | vLLM {statistics.median(vllm_rates):.1f} tokens/s | rlvr / vLLM median "
                        f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")
        if own_rates:
            ratios = [a / b for a, b in zip(rates, own_rates)]
            summary += (f" | shared prompts / each row its own: median {statistics.median(ratios):.2f}x "
                        f"(range {min(ratios):.2f}-{max(ratios):.2f})")
        if gen_rates:
            ratios = [a / b for a, b in zip(rates, gen_rates)]
            summary += (f" | model.generate {statistics.median(gen_rates):.1f} tokens/s"
                        f" | rlvr / generate median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-"
                        f"{max(ratios):.2f})")
            if vllm_rates:
                summary += f" | vLLM / generate median {statistics.median(v / g for v, g in zip(vllm_rates, gen_rates)):.2f}x"
        print(summary, flush=True)
        if dtype == "float32":  # the projections' FLOPs a token against the machine's fp32 matmul peak, measured now
            body, head = parameter_counts(model)
            ceiling = matmul_peak_gflops() * 1e9 / (2 * (body + head))
            line = (f"    fp32 compute ceiling {ceiling:.0f} tokens/s ({2 * (body + head) / 1e9:.2f} GFLOP a token at the "
                    f"torch.mm peak measured now): rlvr engine {statistics.median(rates) / ceiling:.0%}")
            print(line + (f", vLLM {statistics.median(vllm_rates) / ceiling:.0%}" if vllm_rates else ""), flush=True)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"    peak resident memory of the process so far: {peak_mb:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
