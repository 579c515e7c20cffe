"""One weight sync to a rollout pool of its own: the broadcast against an in-process copy.

    .venv/bin/python bench/weight_sync.py [--models builtin,0.36b] [--receivers 1] [--bucket-mb 2048,256]
                                          [--repeats 3] [--servers]

For each model shape (Llama-style, built on the meta device: ``builtin`` is SmolLM2-135M's,
``0.36b`` a wider one of 0.36B parameters) and bucket size, a root process broadcasts the fp32
weights (``rlvr.distributed.weight_sync``, gloo on 127.0.0.1) to ``--receivers`` processes, as
the actor's rank 0 does to ``hybrid_engine=false`` rollout workers, and each receiver ``take``s
the version. Printed per case, medians of ``--repeats`` versions: seconds from the send's start
until every receiver holds the version, the rate in GB/s, and the ratio to the reference run in
the same process: cloning the same tensors (what ``colocate_async`` does to hand a version to
an engine in the trainer's process; a memory-bound lower bound for moving the bytes once).
``--servers`` times the sync of ``rollout.mode=async`` to one ``rlvr serve`` replica instead
(``server_cases``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch

from runs import at_least, comma_list, one_of

SHAPES = {  # hidden, layers, intermediate, heads, kv heads, vocabulary
    "builtin": (576, 30, 1536, 9, 3, 49152),
    "0.36b": (1024, 24, 2816, 16, 4, 49152),
}
HOST = "127.0.0.1"


def meta_of(name: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.distributed.weight_sync import weight_meta

    hidden, layers, inter, heads, kv, vocab = SHAPES[name]
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return weight_meta(model)


def tensors_of(meta):
    g = torch.Generator().manual_seed(0)
    return [(name, torch.randn(shape, generator=g)) for name, shape, _ in meta]


def _receiver(rank, world, port, meta, bucket_bytes, repeats, out):
    from rlvr.distributed.weight_sync import WeightGroup, WeightReceiver

    torch.set_num_threads(1)
    receiver = WeightReceiver(lambda: WeightGroup(HOST, port, rank, world, "gloo"), meta, bucket_bytes)
    for version in range(1, repeats + 1):
        receiver.take(version)
        out.put((rank, version, time.time()))
    receiver._thread.join(60)  # the sender's close ends it: the group is torn down before the process exits


def run_case(meta, tensors, receivers: int, bucket_mb: int, repeats: int) -> list[float]:
    from rlvr.distributed.weight_sync import WeightGroup, WeightSender
    from rlvr.distributed.worker import free_port

    ctx = mp.get_context("spawn")
    port, world, bucket_bytes = free_port(HOST), 1 + receivers, bucket_mb << 20
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(r, world, port, meta, bucket_bytes, repeats, out))
             for r in range(1, world)]
    for p in procs:
        p.start()
    sender = WeightSender(WeightGroup(HOST, port, 0, world, "gloo"), meta, bucket_bytes)
    times = []
    for version in range(1, repeats + 1):
        start = time.time()
        sender.send(version, iter(tensors))
        arrived = [out.get(timeout=600)[2] for _ in range(receivers)]
        times.append(max(arrived) - start)
    sender.close()
    for p in procs:
        p.join(30)
    return times


def copy_time(tensors, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        copy = {name: t.detach().clone() for name, t in tensors}
        times.append(time.perf_counter() - start)
        del copy
    return times


def server_cases(names: list[str], repeats: int) -> None:
    """``--servers``: one ``rlvr serve`` replica of each shape (random weights, the built-in
    model's tokenizer), started as ``rollout.mode=async`` starts it, and the trainer's sync to it
    by each route: the gloo broadcast (``/update_weights_from_distributed``) and the disk route
    (a safetensors folder, ``/update_weights_from_disk``). Medians of ``repeats`` versions."""
    import tempfile
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.config.schema import RolloutConfig
    from rlvr.models import load_tokenizer
    from rlvr.rollout.servers import ServerRollout

    tokenizer = load_tokenizer("builtin")
    print(f"{'model':>8} {'params':>7} {'MB':>6} {'route':>12} {'sync s':>7} {'GB/s':>6}")
    for name in names:
        hidden, layers, inter, heads, kv, vocab = SHAPES[name]
        config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                             num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                             tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        folder = Path(tempfile.mkdtemp(prefix=f"rlvr-bench-{name}-"))
        model = LlamaForCausalLM(config).eval()
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        model.name_or_path = str(folder)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", max_num_seqs=8), 16, 64,
                                log_dir=folder / "logs")
        try:
            version = 0
            for route in ("distributed", "disk"):
                rollout.config.server.weight_sync = route
                times = []
                for _ in range(repeats + 1):  # the first opens the group (distributed): not counted
                    version += 1
                    start = time.perf_counter()
                    rollout.sync_weights(version)
                    times.append(time.perf_counter() - start)
                sync = statistics.median(times[1:])
                print(f"{name:>8} {sum(p.numel() for p in model.parameters()) / 1e9:>6.2f}B {nbytes / 2**20:>6.0f} "
                      f"{route:>12} {sync:>7.3f} {nbytes / sync / 1e9:>6.2f}", flush=True)
        finally:
            rollout.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=comma_list(one_of(*SHAPES)), default="builtin,0.36b")
    parser.add_argument("--receivers", type=at_least(1), default=1)
    parser.add_argument("--bucket-mb", type=comma_list(at_least(1)), default=[2048, 256], help="comma-separated sizes")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--servers", action="store_true", help="the sync to an rlvr serve replica, by each route")
    args = parser.parse_args(argv)
    if args.servers and (args.receivers, args.bucket_mb) != (parser.get_default("receivers"),
                                                             parser.get_default("bucket_mb")):
        parser.error("--servers times one rlvr serve replica by its own routes: --receivers and --bucket-mb "
                     "do not apply")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.servers:
        server_cases(args.models, args.repeats)
        return
    print(f"{'model':>8} {'params':>7} {'MB':>6} {'bucket':>7} {'recv':>4} {'sync s':>7} {'GB/s':>6} "
          f"{'copy s':>7} {'sync/copy':>9}")
    for name in args.models:
        meta = meta_of(name)
        tensors = tensors_of(meta)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        params = sum(t.numel() for _, t in tensors)
        for bucket in args.bucket_mb:
            sync = statistics.median(run_case(meta, tensors, args.receivers, bucket, args.repeats))
            copy = statistics.median(copy_time(tensors, args.repeats))
            print(f"{name:>8} {params / 1e9:>6.2f}B {nbytes / 2**20:>6.0f} {bucket:>5}MB {args.receivers:>4} "
                  f"{sync:>7.3f} {nbytes / sync / 1e9:>6.2f} {copy:>7.3f} {sync / copy:>8.1f}x", flush=True)


if __name__ == "__main__":
    main()
