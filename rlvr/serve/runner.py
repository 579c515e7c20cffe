"""``rlvr serve``: load the config's model, build the engine core, serve it with uvicorn.

The model loads as ``rlvr rollout`` loads it (``actor_rollout_ref.model.path``: ``builtin``, a
Hugging Face folder, a GGUF file, a checkpoint folder or a run directory's newest checkpoint; with
the model section's ``tokenizer_path``, ``trust_remote_code`` and ``override_config``), in
``rollout.dtype``, with the native engine's core (``rollout.max_num_seqs`` rows at once,
``rollout.lean_decode``). SIGINT and SIGTERM abort every in-flight request (clients get their
tokens so far with finish reason ``abort``), let uvicorn close the connections, stop the engine
thread, and return: the process exits with status 0.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import ConfigError

LOOPBACK_NAMES = {"localhost"}


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    request_timeout: float = 600.0
    max_waiting: int = 4096
    max_model_len: int | None = None
    served_model_name: str | None = None
    tool_call_parser: str = "hermes"
    max_num_batched_tokens: int | None = None


SERVE_BATCHED_TOKENS = 1024
"""A server's default step budget (vLLM's default differs between its server and its offline
engine too): a burst of requests is prefilled a part per step, so the first ones get their first
token while the rest wait. Measured with 32 requests of 64 tokens at once (the built-in model,
2 cores): time to first token p50 2.5 s unbounded, 1.8 s at 1024 or 512, the same tokens/s."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(options: ServeOptions) -> None:
    if not is_loopback(options.host) and not options.api_key:
        raise ConfigError(f"--host {options.host}: a server reachable from other machines needs --api-key KEY "
                          "(every request must then send Authorization: Bearer KEY); or keep the default "
                          "--host 127.0.0.1")


def listen_socket(options: ServeOptions) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use (or a host this machine does
    not have) is refused at once, naming the options, instead of after the load by uvicorn."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(options.host, options.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise ConfigError(f"--host {options.host}: not an address to listen on ({err})") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart right after a stop
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise ConfigError(f"--host {options.host} --port {options.port}: cannot listen there ({err.strerror}); "
                          "pick a free port with --port") from None
    return sock


def model_source(path: str) -> str:
    """The loadable model of ``path``: a checkpoint folder's ``actor/``, a run directory's newest
    checkpoint's, or ``path`` itself (the model path, and ``/update_weights_from_disk``'s)."""
    from rlvr.trainer.checkpoint import latest_checkpoint

    folder = Path(path).expanduser()
    if (folder / "actor").is_dir():
        return str(folder / "actor")
    if (folder / "checkpoints").is_dir():
        latest = latest_checkpoint(folder / "checkpoints")
        if latest is None:
            raise ConfigError(f"{folder} has checkpoints/ but no checkpoints/global_step_<k>/ in it")
        return str(latest / "actor")
    return path


def weights_folder(path: str) -> Path:
    try:
        return Path(model_source(path)).expanduser()
    except ConfigError as err:
        raise ValueError(str(err)) from None


def build_server(config, options: ServeOptions):
    """The model, its engine (started) and the ``Server`` the routes use."""
    from rlvr.cli import _refuse_an_adapter
    from rlvr.config.validate import on_gpu
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout.async_engine import AsyncEngine
    from rlvr.rollout.engine import NativeRollout, decode_attention
    from rlvr.serve.state import Server, copy_weights_into
    from rlvr.tools.parsers import TOOL_PARSERS

    if options.tool_call_parser not in TOOL_PARSERS:
        raise ConfigError(f"--tool-call-parser {options.tool_call_parser!r}: use one of {sorted(TOOL_PARSERS)}")
    rollout_cfg = config.actor_rollout_ref.rollout
    path = model_source(config.actor_rollout_ref.model.path)
    _refuse_an_adapter(path)
    dtype = rollout_cfg.dtype if rollout_cfg.dtype != "auto" else "float32"
    device = "cuda" if on_gpu(config) else "cpu"  # trainer.device=auto: the GPU where there is one, as training
    model_cfg = config.actor_rollout_ref.model  # as the actor loads it: a replica computes the same model
    model = load_model(path, dtype, device, model_cfg.trust_remote_code, model_cfg.override_config)
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or path, model_cfg.trust_remote_code)
    rollout = NativeRollout(model, tokenizer, rollout_cfg, max_response_length=1)
    # --max-model-len, else the config's rollout.max_model_len, else the model's own context
    context = options.max_model_len or rollout_cfg.max_model_len or getattr(model.config, "max_position_embeddings",
                                                                            None) or 4096
    rollout.core.max_model_len = context  # the core refuses what the routes would
    rollout.core.max_num_batched_tokens = (options.max_num_batched_tokens or rollout_cfg.max_num_batched_tokens
                                           or SERVE_BATCHED_TOKENS)
    engine = AsyncEngine(rollout.core, max_waiting=options.max_waiting,
                         step_context=lambda: decode_attention(model.device))

    def release(tags: set[str]) -> str:
        done = []
        if "kv_cache" in tags:
            rollout.core.kept = []
            rollout.core.release()
            done.append("kv_cache: the KV slab and kept contexts are freed")
        if "weights" in tags:
            if rollout.lean is not None:
                rollout.lean.release()
            done.append("weights: the lean decoder's packed copies are freed; the model's own weights stay in "
                        "memory (on a CPU there is no device to move them off)")
        return "; ".join(done)

    server = Server(engine, tokenizer, options.served_model_name or str(config.actor_rollout_ref.model.path), path,
                    int(context), int(model.get_input_embeddings().weight.shape[0]), options.request_timeout,
                    options.api_key, options.tool_call_parser,
                    load_weights=lambda path: copy_weights_into(rollout.model, weights_folder(path)), release=release,
                    model=rollout.model)
    engine.start()
    return server


class _Uvicorn:
    """uvicorn's server, whose exit signal also aborts the engine's requests (so open responses
    end at once and the graceful shutdown does not wait on generations)."""

    @staticmethod
    def make(app, options: ServeOptions, engine):
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                engine._post_nowait(engine.core.abort_all)
                super().handle_exit(sig, frame)

        return Server(uvicorn.Config(app, host=options.host, port=options.port, log_level="warning",
                                     timeout_graceful_shutdown=10, access_log=False))


def serve(config, options: ServeOptions) -> int:
    """Run until SIGINT/SIGTERM -> 0."""
    from rlvr.serve.app import build_app

    check_host(options)
    sock = listen_socket(options)
    try:
        server = build_server(config, options)
    except BaseException:
        sock.close()
        raise
    app = build_app(server)
    uv = _Uvicorn.make(app, options, server.engine)
    caught: list[int] = []
    # uvicorn re-raises the signal it caught once it has shut down; these handlers take it, so the
    # process returns normally instead of dying of it (SIGTERM) or raising KeyboardInterrupt (SIGINT)
    previous = {sig: signal.signal(sig, lambda s, f: caught.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(f"rlvr serve: {server.model_path} on http://{options.host}:{options.port} (SGLang routes and /v1; "
          f"context {server.max_model_len} tokens{', API key required' if options.api_key else ''})",
          file=sys.stderr, flush=True)
    try:
        uv.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.engine.stop(abort=True)
    print(f"rlvr serve: stopped ({server.aborted} requests aborted by clients or timeouts)", file=sys.stderr)
    return 0
