"""rlvr's engine against llama.cpp's batched decode, on the same shape, in one run.

    python bench/llamacpp.py --llama-bin DIR [--rows 64] [--prompt-tokens 48] [--tokens 128] [--repeats 3]

llama.cpp is no dependency of rlvr: build its ``llama-batched-bench`` and ``llama-quantize`` (a
llama.cpp checkout, or the copy inside PyPI's llama-cpp-python source: ``pip download --no-binary
:all: --no-deps llama-cpp-python``, unpack, then in ``vendor/llama.cpp``: ``cmake -B build
-DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build -j2 --target llama-batched-bench
llama-quantize``) and pass the folder that holds them (``build/bin``). The built-in model's GGUF
(Q4_1) is dequantized to F32 once by ``llama-quantize``: the same weights rlvr runs, which
dequantizes the same file to float32. Both sides run ``--threads`` threads (torch's
``set_num_threads`` for rlvr).

The shape: ROWS sequences that share one prompt of PROMPT_TOKENS tokens (llama.cpp's ``-pps``; rlvr
prefills a prompt its group shares once), each decoding exactly TOKENS tokens: rlvr's engine samples
at T = 1 with its end-of-sequence tokens taken away, llama.cpp's bench decodes without sampling.
Printed: generated tokens / s over the whole call (prefill included) for both, llama.cpp's decode
phase alone, and rlvr / llama.cpp; the two alternate, and the ratio is the median of the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.models import load_model_and_tokenizer
from rlvr.models.loader import builtin_gguf_path, cache_root
from rlvr.rollout import NativeRollout, SamplingParams
from runs import at_least, run_child


def f32_gguf(llama_bin: Path) -> Path:
    """The built-in model's GGUF dequantized to F32, converted once and cached. The conversion is
    written under another name and renamed when complete, so an interrupted one is never reused."""
    target = cache_root() / "llamacpp" / "SmolLM2-135M-Instruct.F32.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial.gguf")
        run_child([str(llama_bin / "llama-quantize"), "--allow-requantize", str(builtin_gguf_path()), str(partial), "F32"],
                  "llama-quantize")
        partial.replace(target)
    return target


def llama_run(llama_bin: Path, gguf: Path, args) -> dict:
    """One llama-batched-bench call: its JSONL record (t_pp, t_tg, t in seconds)."""
    command = [str(llama_bin / "llama-batched-bench"), "-m", str(gguf), "-t", str(args.threads),
               "-c", str(args.prompt_tokens + args.rows * args.tokens + 16), "-b", "2048", "-ub", "512", "-pps",
               "-ctk", args.kv_type, "-ctv", args.kv_type, "-npp", str(args.prompt_tokens), "-ntg", str(args.tokens),
               "-npl", str(args.rows), "--output-format", "jsonl"]
    out = run_child(command, "llama-batched-bench")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")][-1]


def rlvr_run(engine: NativeRollout, prompt: list[int], args, seed: int) -> float:
    """Seconds for ROWS rows of exactly TOKENS sampled tokens after the shared prompt."""
    start = time.perf_counter()
    outs = engine.generate([prompt] * args.rows, SamplingParams(max_new_tokens=args.tokens, temperature=1.0, seed=seed),
                           groups=[0] * args.rows)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == args.tokens for o in outs)
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bin", required=True, type=Path, help="folder with llama-batched-bench and llama-quantize")
    p.add_argument("--rows", type=at_least(1), default=64)
    p.add_argument("--prompt-tokens", type=at_least(1), default=48)
    p.add_argument("--tokens", type=at_least(1), default=128)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--threads", type=at_least(1), default=torch.get_num_threads(), help="for both llama.cpp and torch")
    p.add_argument("--kv-type", default="f32", help="llama.cpp's KV cache type (its own default is f16; rlvr's is the "
                   "model's dtype, float32 here)")
    args = p.parse_args()
    missing = [name for name in ("llama-batched-bench", "llama-quantize") if not (args.llama_bin / name).is_file()]
    if missing:
        p.error(f"--llama-bin {args.llama_bin} has no {' or '.join(missing)}: build them as this script's help says")
    torch.set_num_threads(args.threads)  # rlvr's side: the same thread count as llama.cpp's -t
    gguf = f32_gguf(args.llama_bin)
    model, tokenizer = load_model_and_tokenizer("builtin")
    engine = NativeRollout(model, tokenizer, RolloutConfig(dtype="float32"), args.tokens)
    engine.eos_ids = [-1]  # no token ends a row: each decodes all its tokens, as llama.cpp's bench does
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a long story about a lighthouse."}],
                                         add_generation_prompt=True, tokenize=False)
    prompt = (tokenizer.encode(text, add_special_tokens=False) * args.prompt_tokens)[-args.prompt_tokens:]
    generated = args.rows * args.tokens
    rlvr_run(engine, prompt, args, seed=0)  # warm-up: packing, allocator
    llama_run(args.llama_bin, gguf, args)
    ratios = []
    for r in range(args.repeats):
        order = ("llama", "rlvr") if r % 2 == 0 else ("rlvr", "llama")
        for name in order:
            if name == "llama":
                rec = llama_run(args.llama_bin, gguf, args)
            else:
                t_rlvr = rlvr_run(engine, prompt, args, seed=r)
        llama_all, llama_tg = generated / rec["t"], rec["speed_tg"]
        ratios.append(generated / t_rlvr / llama_all)
        print(f"repeat {r}: rlvr {generated / t_rlvr:.1f} tokens/s, llama.cpp {llama_all:.1f} "
              f"(decode alone {llama_tg:.1f}); rlvr / llama.cpp {ratios[-1]:.2f}x", flush=True)
    print(f"{args.rows} rows x {args.tokens} tokens after a shared {args.prompt_tokens}-token prompt, fp32 weights, "
          f"llama.cpp's KV cache {args.kv_type}, "
          f"{args.threads} threads: rlvr / llama.cpp median {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
