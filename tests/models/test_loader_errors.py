"""A model path that cannot load is one message naming what is missing or damaged: a folder
without weights or without a tokenizer, a .gguf file that is not GGUF or is cut short. Each was
a transformers/gguf traceback (issue 47, §2)."""

import shutil

import pytest

from rlvr.models.loader import ModelLoadError, load_model, load_tokenizer


def copy_without(src, dst, *patterns):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*patterns))
    return dst


def test_a_folder_without_weights_is_named(tiny_model_dir, tmp_path):
    folder = copy_without(tiny_model_dir, tmp_path / "m", "*.safetensors", "*.safetensors.index.json")
    with pytest.raises(ModelLoadError, match=rf"model folder '{folder}' has no weights \(model\.safetensors"):
        load_model(folder)


def test_a_folder_without_a_tokenizer_is_named(tiny_model_dir, tmp_path):
    folder = copy_without(tiny_model_dir, tmp_path / "m", "tokenizer*", "vocab*", "merges*", "special_tokens*")
    with pytest.raises(ModelLoadError, match=rf"model folder '{folder}' has no tokenizer .*tokenizer_path"):
        load_tokenizer(folder)


def test_a_gguf_file_that_is_not_gguf_is_named(tmp_path):
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"\x00\x01not a model at all" * 10)
    with pytest.raises(ModelLoadError, match=rf"{junk} is not a GGUF file: it does not start with GGUF's magic"):
        load_tokenizer(junk)


def test_a_gguf_file_cut_short_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "cache"))
    cut = tmp_path / "model.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00")  # the magic and a version, then nothing
    with pytest.raises(ModelLoadError, match=rf"{cut} could not be read as GGUF \(.*\); it is damaged or cut short"):
        load_tokenizer(cut)
    assert not any((tmp_path / "cache" / "models").glob("model*"))  # no half-converted folder left


def test_lora_target_modules_that_match_nothing_name_the_modules_there_are(tiny_model_dir):
    """peft's own error ('Target modules {...} not found in the base model') came as a traceback
    and listed nothing to choose from; the tiny Llama's linear layers are q/k/v/o_proj,
    gate/up/down_proj and lm_head."""
    from rlvr.config import ConfigError
    from rlvr.models.lora import apply_lora

    with pytest.raises(ConfigError, match=r"target_modules \['qkv'\] match no module of the model; its linear "
                                          r"layers are \['down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', "
                                          r"'q_proj', 'up_proj', 'v_proj'\]"):
        apply_lora(load_model(tiny_model_dir), 4, 8, ["q_proj", "qkv"])
