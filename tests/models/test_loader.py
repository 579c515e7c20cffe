import time

import pytest
import torch

from rlvr.models import (
    ModelLoadError,
    builtin_gguf_path,
    load_model,
    load_tokenizer,
    make_tiny_model,
    model_folder,
    resolve_model_source,
)
from rlvr.models import loader


def test_builtin_resolves_to_packaged_gguf():
    src = resolve_model_source("builtin")
    assert src.kind == "gguf" and src.path == builtin_gguf_path() and src.path.name.endswith(".gguf")


def test_hub_id_is_refused_with_instructions():
    with pytest.raises(ModelLoadError, match="never downloads.*huggingface-cli download HuggingFaceTB/SmolLM2"):
        resolve_model_source("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_missing_path_and_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_source(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model_source(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        resolve_model_source(tmp_path / "w.bin")


def test_weight_files_are_checked_against_their_headers(tmp_path):
    """A safetensors file is its header's length, the header, then exactly the bytes the header's
    offsets span: shorter is truncated, longer is damaged; a shard the index names must exist."""
    import json

    from safetensors.torch import save_file

    file = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4, 4)}, str(file))  # 64 data bytes after the header
    size = file.stat().st_size
    assert loader.safetensors_problem(file) is None
    loader.check_weight_files(tmp_path)
    with open(file, "ab") as f:
        f.write(b"\0" * 3)
    assert loader.safetensors_problem(file) == f"is {size + 3} bytes where its header describes {size} (damaged)"
    with open(file, "r+b") as f:
        f.truncate(20)  # inside the header
    assert loader.safetensors_problem(file).startswith("is truncated: 20 bytes, shorter than its own header")
    with pytest.raises(ModelLoadError, match=rf"{file} is truncated: .*download or copy the model again"):
        loader.check_weight_files(tmp_path)
    file.unlink()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="names weight files that are missing: model-00001-of-00002.safetensors, "
                                             "model-00002-of-00002.safetensors"):
        loader.check_weight_files(tmp_path)


def test_conversion_is_cached(builtin_dir, monkeypatch):
    # The fixture converted the GGUF once; a second request must not convert again.
    monkeypatch.setattr(loader, "_convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert model_folder("builtin") == builtin_dir
    assert (builtin_dir / "model.safetensors").is_file()
    assert not list(builtin_dir.parent.glob("*.tmp-*"))  # no half-written folders left


def test_interrupted_conversion_leaves_no_loadable_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path))

    def crash(gguf, out):
        (out / "config.json").write_text("{}")  # half-written
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        model_folder("builtin")
    assert list((tmp_path / "models").iterdir()) == []


def test_builtin_loads_fast_and_generates(builtin_dir):
    start = time.perf_counter()
    model = load_model("builtin")
    elapsed = time.perf_counter() - start
    print(f"cached built-in load: {elapsed:.2f} s")
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert next(model.parameters()).dtype == torch.float32
    tok = load_tokenizer("builtin")
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "5" in text, text  # the dequantised weights are the real model, not noise


def test_gguf_file_path_loads_same_weights(builtin_dir):
    by_file = model_folder(str(builtin_gguf_path()))
    assert by_file == builtin_dir


def test_chat_template_round_trip(tokenizer):
    messages = [{"role": "user", "content": "Compute 17 * 3."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nCompute 17 * 3.<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text, add_special_tokens=False) == list(ids)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id is not None
    assert tokenizer.padding_side == "left"


def test_tiny_model_shares_tokenizer_and_is_seeded(tokenizer, tiny_model_dir):
    a, b = make_tiny_model(tokenizer, seed=3), make_tiny_model(tokenizer, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.config.vocab_size == len(tokenizer) and a.config.model_type == "llama"
    assert sum(p.numel() for p in a.parameters()) < 5e6
    tiny = load_model(tiny_model_dir)
    logits = tiny(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, len(tokenizer))
    assert load_tokenizer(tiny_model_dir).get_vocab() == tokenizer.get_vocab()
