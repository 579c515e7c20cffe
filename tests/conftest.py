"""Shared fixtures: the built-in model's converted folder and a tiny model with its tokenizer."""

import pytest

from rlvr.models import load_tokenizer, model_folder, save_tiny_model


@pytest.fixture(scope="session")
def builtin_dir():
    """The built-in SmolLM2 as a safetensors folder (converted from GGUF on first use)."""
    return model_folder("builtin")


@pytest.fixture(scope="session")
def tokenizer(builtin_dir):
    return load_tokenizer(builtin_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, builtin_dir):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer_path=str(builtin_dir))
