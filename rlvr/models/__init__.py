"""Model loading (HF folder, GGUF file, the built-in default) and the tiny test model."""

from rlvr.models.loader import (
    ModelLoadError,
    builtin_gguf_path,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    model_folder,
    resolve_model_source,
)
from rlvr.models.tiny import make_tiny_model, save_tiny_model

__all__ = ["ModelLoadError", "builtin_gguf_path", "load_model", "load_model_and_tokenizer", "load_tokenizer",
           "make_tiny_model", "model_folder", "resolve_model_source", "save_tiny_model"]
