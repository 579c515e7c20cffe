"""Typed config: schema (defaults), recipes (YAML), loading with overrides, validation."""

from rlvr.config.loader import DEFAULT_RECIPE, known_keys, load_config, parse_overrides, to_yaml
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import ConfigError, validate

__all__ = ["ConfigError", "DEFAULT_RECIPE", "RLVRConfig", "known_keys", "load_config", "parse_overrides",
           "to_yaml", "validate"]
