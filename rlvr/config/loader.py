"""Load a config: schema defaults <- YAML file <- ``key=value`` overrides, then validate.

OmegaConf does the merging, type conversion and ``${...}`` interpolation. Before merging,
every user key is checked against the schema here, so an unknown key is reported with
where it came from (the file or the command line) and the nearest known key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import ConfigError, validate

RECIPES_DIR = Path(__file__).parent
DEFAULT_RECIPE = RECIPES_DIR / "grpo.yaml"


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        return args[0]
    return tp


def known_keys(cls: type = RLVRConfig, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of the schema mapped to its type (nested sections included)."""
    out: dict[str, Any] = {}
    for name, tp in _field_types(cls).items():
        key = f"{prefix}{name}"
        tp = _unwrap_optional(tp)
        out[key] = tp
        if dataclasses.is_dataclass(tp):
            out.update(known_keys(tp, key + "."))
    return out


def _check_keys(user: dict[str, Any], source: str, cls: type = RLVRConfig, prefix: str = "") -> None:
    """Raise on the first key of ``user`` the schema does not have, naming the nearest one."""
    types = _field_types(cls)
    for name, value in user.items():
        key = f"{prefix}{name}"
        if name not in types:
            all_keys = list(known_keys())
            near = difflib.get_close_matches(key, all_keys, n=1, cutoff=0.6)
            if not near:  # a key put under the wrong section: match on the last part
                near = [k for k in all_keys if k.rsplit(".", 1)[-1] == name]
            hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
            raise ConfigError(f"unknown config key {key!r} (from {source}){hint}")
        tp = _unwrap_optional(types[name])
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config key {key!r} (from {source}) is a section; give its sub-keys, "
                    f"e.g. {key}.{next(iter(_field_types(tp)))}=..., not the value {value!r}"
                )
            _check_keys(value, source, tp, key + ".")
        elif typing.get_origin(tp) is list and isinstance(value, str):
            user[name] = [value]  # verl accepts `data.train_files=one.parquet` for a list key


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[x,y]"]`` -> nested dict, values parsed as YAML scalars/lists."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. data.train_batch_size=16)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} sets a sub-key of {part!r}, which was given a value")
        node[parts[-1]] = value
    return nested


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, not a {type(data).__name__}")
    return data


def load_config(config_file: str | Path | None = None, overrides: Iterable[str] = ()) -> RLVRConfig:
    """Schema defaults, then the recipe (``grpo.yaml`` unless ``config_file``), then overrides."""
    path = Path(config_file).expanduser() if config_file else DEFAULT_RECIPE
    layers = [(_read_yaml(path), f"file {str(path)!r}"), (parse_overrides(overrides), "the command line")]
    merged = OmegaConf.structured(RLVRConfig)
    for data, source in layers:
        _check_keys(data, source)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        except OmegaConfBaseException as err:
            raise ConfigError(_explain(err, source)) from None
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_explain(err, "the config")) from None
    validate(cfg)
    return cfg


def _explain(err: OmegaConfBaseException, source: str) -> str:
    key = getattr(err, "full_key", None) or "?"
    first = str(err).splitlines()[0]
    return f"config key {key!r} (from {source}): {first}"


def to_yaml(cfg: RLVRConfig) -> str:
    """The resolved config as YAML (what ``rlvr config show`` prints and runs save)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
