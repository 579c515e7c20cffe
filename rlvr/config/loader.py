"""Load a config: schema defaults <- the GRPO recipe <- a YAML file <- overrides, then validate.

OmegaConf does the merging, type conversion and ``${...}`` interpolation. Before merging,
every user key is checked against the schema here, so an unknown key is reported with
where it came from (the file or the command line) and the nearest known key.

A verl user's habits carry over: Hydra-style ``+key=value`` and ``++key=value`` set a key,
``~key`` puts it back to the schema default; verl keys that have no effect in rlvr's design
are accepted with a one-line notice (``VERL_NO_EFFECT``), and verl keys that rlvr names
differently are refused with the rlvr name (``VERL_RENAMED``).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
import math
import os
import sys
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlvr.config.schema import RayInitConfig, RLVRConfig
from rlvr.config.verl_keys import (MEGATRON, MEGATRON_BACKEND, MEGATRON_LORA, TEXT_ONLY, VERL_ALIASES,
                                   VERL_GLOBAL_MICRO_BATCH, VERL_MEGATRON, VERL_MEGATRON_LORA, VERL_MULTIMODAL,
                                   VERL_NO_EFFECT, VERL_READ_AT_LOAD, VERL_RENAMED)
from rlvr.registry import import_file
from rlvr.config.validate import (ConfigError, device_notes, distillation_notes, offload_keys, on_gpu, server_notes,
                                  uses_ray, validate)

RECIPES_DIR = Path(__file__).parent
DEFAULT_RECIPE = RECIPES_DIR / "grpo.yaml"
VERL_BASE = RECIPES_DIR / "verl.yaml"  # verl's defaults: the base of a verl script instead of the GRPO recipe

# verl's keys that are not schema keys (no effect, read under rlvr's name, or renamed): rlvr/config/verl_keys.py
# ray.init's keyword arguments (ray 2.x): verl's ``ray_kwargs.ray_init.<name>`` keys are passed through to it
RAY_INIT_KWARGS = ("num_gpus", "resources", "labels", "object_store_memory", "local_mode", "ignore_reinit_error",
                   "include_dashboard", "dashboard_host", "dashboard_port", "job_config", "configure_logging",
                   "logging_level", "logging_format", "logging_config", "log_to_driver", "namespace",
                   "enable_resource_isolation", "cgroup_path", "system_reserved_cpu", "system_reserved_memory",
                   "_temp_dir", "_system_config", "_node_ip_address", "_plasma_directory")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        return args[0]
    return tp


def _entry_type(tp: Any) -> Any:
    """The section type of a key holding named sections (``dict[str, Section]``), else None."""
    if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
        return typing.get_args(tp)[1]
    return None


def known_keys(cls: type = RLVRConfig, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of the schema mapped to its type (nested sections included; the keys of
    named sections under ``*``, e.g. ``distillation.teacher_models.*.model_path``)."""
    out: dict[str, Any] = {}
    for name, tp in _field_types(cls).items():
        key = f"{prefix}{name}"
        tp = _unwrap_optional(tp)
        out[key] = tp
        if dataclasses.is_dataclass(tp):
            out.update(known_keys(tp, key + "."))
        elif _entry_type(tp) is not None:
            out.update(known_keys(_entry_type(tp), key + ".*."))
    return out


def _check_keys(user: dict[str, Any], source: str, cls: type = RLVRConfig, prefix: str = "") -> None:
    """Raise on the first key of ``user`` the schema does not have, naming the nearest one."""
    types = _field_types(cls)
    for name, value in user.items():
        key = f"{prefix}{name}"
        if name not in types:
            raise ConfigError(f"unknown config key {key!r} (from {source}){_nearest(key)}")
        tp = _unwrap_optional(types[name])
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config key {key!r} (from {source}) is a section; give its sub-keys, "
                    f"e.g. {key}.{next(iter(_field_types(tp)))}=..., not the value {value!r}"
                )
            _check_keys(value, source, tp, key + ".")
        elif _entry_type(tp) is not None:
            entry_type = _entry_type(tp)  # named entries of one section type (distillation.teacher_models)
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"config key {key!r} (from {source}) holds named sections, e.g. "
                                  f"{key}.<name>.{next(iter(_field_types(entry_type)))}=..., not {value!r}")
            for entry, sub in value.items():
                _check_keys(sub, source, entry_type, f"{key}.{entry}.")
        elif typing.get_origin(tp) is list and isinstance(value, str):
            user[name] = [value]  # verl accepts `data.train_files=one.parquet` for a list key


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``["a.b=1", "+c=[x,y]"]`` -> nested dict, values parsed as YAML scalars/lists.

    Hydra's ``+key=value`` (add) and ``++key=value`` (add or override) set the key like
    ``key=value``: every rlvr key exists in the schema, so adding and overriding coincide.
    Deletions (``~key``) are taken apart by ``split_overrides``."""
    nested: dict[str, Any] = {}
    for item in overrides:
        bare = item[2:] if item.startswith("++") else item[1:] if item.startswith("+") else item
        if "=" not in bare or bare.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. data.train_batch_size=16)")
        key, raw = bare.split("=", 1)
        try:
            value = _hydra_flow(yaml.safe_load(raw)) if raw != "" else ""
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


def _hydra_flow(value):
    """Hydra's ``{a:1,b:x}`` as Hydra reads it. YAML needs a space after a flow mapping's colon
    and reads ``{a:1}`` as the key ``"a:1"`` with no value, which would set nothing."""
    if isinstance(value, list):
        return [_hydra_flow(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, sub in value.items():
        if sub is None and isinstance(key, str) and ":" in key:
            key, text = key.split(":", 1)
            sub = yaml.safe_load(text) if text else None
        out[key] = _hydra_flow(sub)
    return out


def split_overrides(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """(assignments, keys to delete): Hydra's ``~key`` or ``~key=value`` deletes ``key``, which for
    rlvr's typed schema means: back to the schema default, whatever the recipe or file set.
    The later of a deletion and a setting of one key wins, as between two settings: a deletion
    drops the settings of its key before it, and a setting after a deletion cancels it."""
    sets, deletions = [], []
    for item in overrides:
        if item.startswith("~"):
            key = _canonical(item[1:].split("=", 1)[0].strip())
            sets = [s for s in sets if _canonical(_override_key(s)) != key]
            deletions.append(key)
        else:
            deletions = [d for d in deletions if d != _canonical(_override_key(item))]
            sets.append(item)
    return sets, deletions


def _override_key(item: str) -> str:
    """The key an override ``[+|++]key=value`` sets."""
    return item.split("=", 1)[0].strip().lstrip("+")


def _canonical(key: str) -> str:
    """rlvr's key for verl's spelling of it (``VERL_ALIASES``): deleting ``reward_model.enable``
    resets ``reward.reward_model.enable``, and a later setting of either spelling wins over it."""
    return VERL_ALIASES.get(key, key)


def _verl_only(key: str) -> bool:
    """A key of verl's that rlvr has no schema key for (no effect, read at load, renamed, Megatron's,
    image inputs, passed to ray.init), or a key under one of its sections."""
    parts = key.split(".")
    for node in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
        if node in VERL_READ_AT_LOAD or node in VERL_RENAMED or node in VERL_MEGATRON or node in VERL_MEGATRON_LORA:
            return True
        if node not in known_keys() and (_verl_entry(node) is not None or _multimodal(node, "any value")):
            return True
    return key.startswith("ray_kwargs.ray_init.")


def _delete_verl_keys(deletions: list[str], layers: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Hydra's ``~key`` on a verl key rlvr has no key for deletes it from every layer, so neither its
    notice nor its reading (a global micro-batch size) happens; nothing is reset. Returns the
    deletions left: schema keys, reset to their defaults once every layer is merged. A key that is
    neither is refused, naming the nearest schema key."""
    left = []
    for key in deletions:
        if key in known_keys():
            left.append(key)
        elif _verl_only(key):
            for data, _ in layers:
                _drop(data, key, missing_ok=True)
        else:
            raise ConfigError(f"unknown config key {key!r} (from the command line, ~{key}){_nearest(key)}")
    return left


def _flatten(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in nested.items():
        out[f"{prefix}{key}"] = value
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
    return out


def _drop(nested: dict[str, Any], dotted: str, missing_ok: bool = False) -> None:
    """Remove ``dotted`` from ``nested``; ``missing_ok``: a key (or section) it lacks is fine."""
    *parents, last = dotted.split(".")
    for part in parents:
        if missing_ok and not isinstance(nested.get(part), dict):
            return
        nested = nested[part]
    if missing_ok:
        nested.pop(last, None)
    else:
        del nested[last]


def _verl_entry(key: str) -> tuple[str, tuple | None] | None:
    """The ``VERL_NO_EFFECT`` entry of ``key``: its own, else the first pattern that matches it."""
    if key in VERL_NO_EFFECT:
        return VERL_NO_EFFECT[key]
    return next((entry for pattern, entry in VERL_NO_EFFECT.items()
                 if "*" in pattern and fnmatch.fnmatchcase(key, pattern)), None)


def _verl_walk(node: dict[str, Any], prefix: str, schema: dict[str, Any], refused: list[str],
               dropped: dict[str, list[str]], source: str) -> None:
    """Drop the no-effect keys under ``node`` (a section's entry covers its sub-keys), note refusals."""
    for name, value in list(node.items()):
        key = f"{prefix}{name}"
        if key in VERL_RENAMED:
            if isinstance(value, dict):  # sub-keys with entries of their own (read, or no effect) go first
                _verl_walk(value, key + ".", schema, [], dropped, source)
            if value != {}:
                refused.append(f"{key!r} (from {source}) is verl's name; rlvr's is {VERL_RENAMED[key]}")
            else:
                del node[name]
            continue
        entry = None if key in schema else _verl_entry(key)
        if entry is not None:
            why, harmless = entry
            if harmless is not None and value not in harmless:
                refused.append(f"{key}={value!r} (from {source}) cannot be honoured: {why}; remove it or set "
                               f"{key}={harmless[0]!r}")
                continue
            dropped.setdefault(why, []).append(key)
            del node[name]
        elif isinstance(value, dict) and key in schema and _entry_type(schema[key]) is not None:
            for entry in value.values():  # named sections: their keys are the schema's under *
                if isinstance(entry, dict):
                    _verl_walk(entry, key + ".*.", schema, refused, dropped, source)
        elif isinstance(value, dict) and _is_section(key, schema):  # a dict-valued key's entries are its value
            _verl_walk(value, key + ".", schema, refused, dropped, source)
            if not value:  # emptied by the walk
                del node[name]


def _cannot_take(refused: list[str]) -> ConfigError:
    """One error for the verl settings refused in a layer: each with its reason."""
    if len(refused) == 1:
        return ConfigError(refused[0])
    return ConfigError(f"{len(refused)} verl settings rlvr cannot take:\n  - " + "\n  - ".join(refused))


def _verl_keys(data: dict[str, Any], source: str) -> None:
    """Refuse verl keys that rlvr names differently, or whose value asks for what rlvr does not do (all of
    them at once, each with its reason); drop verl keys that have no effect in rlvr's design and say so
    in one notice (keys that share a reason on one line: a verl script sets a dozen of them)."""
    refused = _backend_keys(data, source)
    dropped: dict[str, list[str]] = {}  # why -> the keys it explains
    _verl_walk(data, "", known_keys(), refused, dropped, source)
    if refused:
        raise _cannot_take(refused)
    if dropped:
        lines = "".join(f"\n  {', '.join(keys)}: {why}" for why, keys in dropped.items())
        print(f"[rlvr] note: verl settings (from {source}) that have no effect in rlvr:{lines}",
              file=sys.stderr, flush=True)


# markers of a chat template that renders image or video parts (Qwen2-VL's, LLaVA's, Gemma 3's)
VISION_TEMPLATE_MARKERS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "image_url", "<image>",
                           "<start_of_image>")
STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy",
                 "reward_model.strategy")


def _backend_keys(data: dict[str, Any], source: str) -> list[str]:
    """Take out of ``data`` the keys of what rlvr does not train with, each group refused in one line with
    its one reason: verl's Megatron-LM backend (``VERL_MEGATRON``, a ``strategy: megatron``, Megatron's
    LoRA section with the FSDP keys to use instead), and image or video inputs (``VERL_MULTIMODAL``, a
    chat template that renders image parts). A section's match covers its sub-keys."""
    megatron, lora, images, taken = [], [], [], []
    for key, value in _flatten(data).items():
        if any(key.startswith(t + ".") for t in taken):
            continue
        section, _, name = key.rpartition(".")
        if key in VERL_MEGATRON or key in STRATEGY_KEYS and value == "megatron":
            megatron.append(f"{key}.*" if isinstance(value, dict) else f"{key}={value}")
        elif key in VERL_MEGATRON_LORA and not isinstance(value, dict):
            megatron.append(f"{key}={value!r}")
        elif section in VERL_MEGATRON_LORA:
            rlvr_key = VERL_MEGATRON_LORA[section].get(name)
            lora.append(f"{key}={value} -> {rlvr_key}={value}" if rlvr_key else f"{key} (no FSDP counterpart)")
        elif _multimodal(key, value):
            images.append(f"{key}={value!r}")
        elif key == "actor_rollout_ref.model.custom_chat_template" and isinstance(value, str) \
                and any(marker in value for marker in VISION_TEMPLATE_MARKERS):
            images.append(f"{key}=<a template that renders image and video parts>")
        else:
            continue
        taken.append(key)
    for key in taken:
        _drop(data, key)
    refused = []
    if megatron or lora:
        sections = sorted({f"{key.rpartition('.')[0]}.*" for key in taken
                           if key.rpartition(".")[0] in VERL_MEGATRON_LORA})
        refused.append(f"{', '.join(megatron + sections)} (from {source}): {MEGATRON}"
                       + (f"; Megatron's LoRA keys become rlvr's (leaving them out would train every weight): "
                          f"{', '.join(lora)}; rlvr's target_modules takes Hugging Face module names (all-linear, "
                          "or q_proj, v_proj, ...)" if lora else ""))
    if images:
        refused.append(f"{', '.join(images)} (from {source}): {TEXT_ONLY}; remove them (a vision-language model "
                       "cannot be trained here)")
    return refused


def _multimodal(key: str, value: Any) -> bool:
    """Whether ``key=value`` asks for image or video inputs (``VERL_MULTIMODAL``)."""
    for pattern, harmless in VERL_MULTIMODAL.items():
        if key == pattern or "*" in pattern and fnmatch.fnmatchcase(key, pattern):
            return harmless is None or value not in harmless
    return False


def _verl_aliases(data: dict[str, Any], source: str, penalty_ends: list | None = None) -> None:
    """Move verl's spelling of a key rlvr reads (``VERL_ALIASES``) onto rlvr's key, with one notice.
    Both spellings in one layer with different values are refused (neither would be what the user meant).
    verl's ``max_resp_len`` is kept in ``penalty_ends`` with its layer: ``load_config`` checks it
    against data.max_response_length as every layer leaves it."""
    flat = _flatten(data)
    end, limit = flat.get("reward_model.reward_kwargs.max_resp_len"), flat.get("data.max_response_length")
    if end is not None and penalty_ends is not None:
        penalty_ends.append((end, source))
    if end is not None and limit is not None and end != limit:
        raise ConfigError(f"reward_model.reward_kwargs.max_resp_len={end!r} (from {source}) differs from "
                          f"data.max_response_length={limit!r}: rlvr's overlong penalty (reward.overlong_buffer) "
                          "ends at data.max_response_length; make them equal")
    moved, schema = [], known_keys()
    for verl_key, rlvr_key in VERL_ALIASES.items():
        # a section's keys move one by one; a dict-valued key (reward_kwargs: {bonus: 0.5}) moves whole
        if verl_key not in flat or isinstance(flat[verl_key], dict) and _is_section(rlvr_key, schema):
            continue
        value = flat[verl_key]
        if rlvr_key in flat and flat[rlvr_key] != value:
            raise ConfigError(f"{verl_key}={value!r} and {rlvr_key}={flat[rlvr_key]!r} (from {source}) are the same "
                              f"setting (verl's name and rlvr's) with different values; keep one")
        _drop(data, verl_key)
        node = data
        for part in rlvr_key.split(".")[:-1]:
            node = node.setdefault(part, {})
        node[rlvr_key.rsplit(".", 1)[-1]] = value
        moved.append(f"{verl_key} -> {rlvr_key}")
    _prune_empty(data, "", schema)
    if moved:
        print(f"[rlvr] note: verl keys (from {source}) read under rlvr's names: {', '.join(moved)}",
              file=sys.stderr, flush=True)


@dataclasses.dataclass
class VerlReadings:
    """verl keys whose meaning depends on keys another layer may set, taken out of each layer (``take``)
    and read once every layer is merged (``apply``): verl's global micro-batch sizes (divided by the
    device count), ``trainer.resume_from_path`` (read only with ``resume_mode=resume_path``) and the
    ``prime`` reward manager (a pool of scorers, unless the user sized reward.num_workers)."""

    micro: dict[str, tuple[Any, str]] = dataclasses.field(default_factory=dict)  # verl key -> (value, layer)
    resume_from_path: tuple[Any, str] | None = None
    prime: str | None = None  # the layer that chose reward_model.reward_manager=prime
    set_by: dict[str, str] = dataclasses.field(default_factory=dict)  # rlvr keys the user's layers set -> layer

    def take(self, data: dict[str, Any], source: str) -> None:
        flat = _flatten(data)
        for key in VERL_GLOBAL_MICRO_BATCH:
            if key in flat and not isinstance(flat[key], dict):
                self.micro[key] = (flat[key], source)
                _drop(data, key)
        if "trainer.resume_from_path" in flat:
            self.resume_from_path = (flat["trainer.resume_from_path"], source)
            _drop(data, "trainer.resume_from_path")
        for key in ("reward_model.reward_manager", "reward_manager.name"):  # verl's older and newer spelling
            if key in flat and not isinstance(flat[key], dict):
                self.prime = source if flat[key] == "prime" else None  # a later layer's choice replaces it
                if flat[key] == "prime":
                    _drop(data, key)
        _prune_empty(data, "", known_keys())

    def apply(self, cfg: RLVRConfig) -> None:
        errors = self._micro_batches(cfg)
        if errors:
            raise _cannot_take(errors)
        self._resume(cfg)
        if self.prime is not None:
            set_by = self.set_by.get("reward.num_workers")
            if set_by is None:
                cfg.reward.num_workers = PRIME_WORKERS
            print(f"[rlvr] note: reward_model.reward_manager=prime (from {self.prime}) is verl's naive scorer run in a "
                  f"pool of {PRIME_WORKERS} processes: rlvr's reward manager with reward.num_workers="
                  f"{cfg.reward.num_workers}{f' (from {set_by})' if set_by else ''}; "
                  "a row that raises or times out scores reward.failure_score (verl's 0.0), and the time limit is "
                  "reward.timeout_s (verl's pool gives each row 300 s)", file=sys.stderr, flush=True)

    def _micro_batches(self, cfg: RLVRConfig) -> list[str]:
        """verl's global micro-batch: per device = value // devices (verl divides by the data-parallel size,
        devices / Ulysses size, and rlvr has no Ulysses); refused beside the per-device key, or where the
        division leaves no row, as verl refuses both."""
        world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
        errors, read = [], []
        for key, (value, source) in self.micro.items():
            per_device = VERL_GLOBAL_MICRO_BATCH[key]
            if value is None:  # verl's default: the per-device key decides
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                errors.append(f"{key}={value!r} (from {source}) must be a whole number of rows >= 1 (verl's global "
                              f"micro-batch, divided over the devices)")
            elif per_device in self.set_by:
                errors.append(f"{key}={value} (from {source}) and {per_device}={_select(cfg, per_device)} (from "
                              f"{self.set_by[per_device]}) are one setting (verl's global micro-batch, and the "
                              "per-device one verl divides it into; verl refuses both too): keep one")
            elif value // world == 0:
                errors.append(f"{key}={value} (from {source}) is verl's global micro-batch, split over {world} "
                              f"devices (trainer.n_gpus_per_node x nnodes): {value} // {world} = 0 rows per device "
                              f"(verl refuses it too); set it to at least {world}, or set {per_device}")
            else:
                _assign(cfg, per_device, value // world)
                read.append(f"{key}={value} -> {per_device} = {value} // {world} = {value // world}")
        if read and not errors:
            devices = f"{world} device{'s' if world > 1 else ''}"
            print(f"[rlvr] note: verl's global micro-batch sizes read per device, divided by the {devices} "
                  f"(trainer.n_gpus_per_node x nnodes) as verl divides them: {'; '.join(read)}",
                  file=sys.stderr, flush=True)
        return errors

    def _resume(self, cfg: RLVRConfig) -> None:
        """verl's ``resume_mode=resume_path`` resumes from ``resume_from_path``, rlvr's resume_mode names the
        folder itself; verl ignores resume_from_path under any other mode."""
        path, source = self.resume_from_path or (None, None)
        trainer = cfg.trainer
        if trainer.resume_mode == "resume_path":
            if path is None:
                raise ConfigError("trainer.resume_mode=resume_path (verl's) resumes from trainer.resume_from_path, "
                                  "which is not set: set it to the checkpoint folder (<run dir>/checkpoints/"
                                  "global_step_<k>), or set trainer.resume_mode to that folder (rlvr's spelling)")
            trainer.resume_mode = str(path)
            print(f"[rlvr] note: trainer.resume_mode=resume_path with trainer.resume_from_path={path} (from {source}) "
                  f"read as trainer.resume_mode={path} (rlvr names the checkpoint folder in resume_mode)",
                  file=sys.stderr, flush=True)
        elif path is not None:
            print(f"[rlvr] note: trainer.resume_from_path={path} (from {source}) has no effect: verl reads it only "
                  f"with trainer.resume_mode=resume_path, and resume_mode is {trainer.resume_mode}",
                  file=sys.stderr, flush=True)


PRIME_WORKERS = 64  # verl's PrimeRewardManager: ProcessPoolExecutor(max_workers=64)


def _select(cfg: RLVRConfig, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _assign(cfg: RLVRConfig, key: str, value: Any) -> None:
    *path, name = key.split(".")
    setattr(_select(cfg, ".".join(path)), name, value)


def _prune_empty(node: dict[str, Any], prefix: str, schema: dict[str, Any]) -> None:
    """Remove the sections that moving keys out of left empty (not schema keys, whose {} is a value)."""
    for name, value in list(node.items()):
        if isinstance(value, dict) and _is_section(f"{prefix}{name}", schema):
            _prune_empty(value, f"{prefix}{name}.", schema)
            if not value:
                del node[name]


def _is_section(key: str, schema: dict[str, Any]) -> bool:
    """A section of keys (a schema section, or one that is not rlvr's), not a dict-valued key whose {} is a value."""
    return key not in schema or dataclasses.is_dataclass(schema[key])


def _ray_init_keys(data: dict[str, Any], source: str) -> None:
    """verl passes ``ray_kwargs.ray_init`` to ``ray.init`` whole; rlvr reads ``address``, ``num_cpus`` and
    ``runtime_env`` by name and carries ray.init's other keyword arguments in ``ray_init.kwargs``."""
    ray_init = (data.get("ray_kwargs") or {}).get("ray_init")
    if not isinstance(ray_init, dict):
        return
    named = set(_field_types(RayInitConfig))
    for name in [n for n in ray_init if n not in named]:
        if name not in RAY_INIT_KWARGS:
            near = difflib.get_close_matches(name, [*named, *RAY_INIT_KWARGS], n=1)
            raise ConfigError(f"ray_kwargs.ray_init.{name} (from {source}) is not a keyword argument of ray.init"
                              + (f"; did you mean {near[0]!r}?" if near else ""))
        ray_init.setdefault("kwargs", {})[name] = ray_init.pop(name)


def _fully_async_keys(data: dict[str, Any], source: str, merged=None) -> bool:
    """verl's fully-async recipe spells async training ``async_training.*``; rlvr reads it onto
    its one mechanism (``trainer.v1.trainer_mode``, ``colocate_async.num_warmup_batches``) and
    says so, or refuses what that mechanism cannot hold, with the reason. Keys left out take verl's
    defaults (``use_rollout_log_probs`` true, ``trigger_parameter_sync_step`` 4); ``merged`` is the
    config of the earlier layers (where the actor's mini-batch may be set). -> whether it chose
    trainer.v1.trainer_mode (the layer did not set it): ``load_config`` then checks the choice
    against hybrid_engine as every layer leaves it."""
    section = data.pop("async_training", None)
    if section is None:
        return False
    where = f"(from {source})"
    if not isinstance(section, dict):
        raise ConfigError(f"async_training {where} must be a section (verl's fully-async recipe keys)")
    refused = {
        "require_batches": (1, "a step trains data.train_batch_size prompts; set that instead"),
        "partial_rollout": (False, "rlvr loads new weights between two generations, never during one, so no "
                                   "request spans two weight versions"),
        "compute_prox_log_prob": (False, "the update's pi_old is recomputed by the actor for every step"),
        "use_trainer_do_validate": (False, "validation runs on the rollout engine, after the batches queued before it"),
    }
    unknown = sorted(set(section) - set(refused) - {"staleness_threshold", "checkpoint_engine", "use_rollout_log_probs",
                                                    "trigger_parameter_sync_step"})
    if unknown:
        raise ConfigError(f"async_training.{unknown[0]} {where}: not a key of verl's fully-async recipe that rlvr "
                          f"reads; rlvr's async keys are trainer.v1.trainer_mode and "
                          f"trainer.v1.colocate_async.num_warmup_batches")
    for key, (allowed, why) in refused.items():
        if key in section and section[key] != allowed:
            raise ConfigError(f"async_training.{key}={section[key]!r} {where} cannot be honoured: {why}; remove it "
                              f"or set it to {allowed!r}")
    use_rollout_log_probs = section.get("use_rollout_log_probs", True)  # verl's default
    if use_rollout_log_probs:  # pi_old = the rollout's log-probs: verl's bypass mode
        data.setdefault("algorithm", {}).setdefault("rollout_correction", {}).setdefault("bypass_mode", True)
    steps_note = _updates_between_loads(data, section, where, merged)
    staleness = section.get("staleness_threshold", 1)
    if not isinstance(staleness, (int, float)) or staleness < 0:
        raise ConfigError(f"async_training.staleness_threshold={staleness!r} {where} must be a number >= 0")
    ahead = math.ceil(staleness)
    hybrid = (data.get("actor_rollout_ref") or {}).get("hybrid_engine")
    if hybrid is None:  # this layer does not say: the earlier layers do
        hybrid = True if merged is None else OmegaConf.select(merged, "actor_rollout_ref.hybrid_engine")
    mode = "colocate_async" if hybrid else "separate_async"
    trainer = data.setdefault("trainer", {})
    v1 = trainer.setdefault("v1", {})
    chosen = "trainer_mode" not in v1
    v1.setdefault("trainer_mode", mode)
    v1.setdefault("colocate_async", {}).setdefault("num_warmup_batches", ahead)
    print(f"[rlvr] note: async_training {where} (verl's fully-async recipe) read as trainer.v1.trainer_mode="
          f"{v1['trainer_mode']}, trainer.v1.colocate_async.num_warmup_batches="
          f"{v1['colocate_async']['num_warmup_batches']}: whole batches generated ahead (staleness_threshold "
          f"{staleness} rounded up), on a fixed schedule"
          + ("; async_training.checkpoint_engine has no effect: the weights go to a rollout pool by "
             "actor_rollout_ref.rollout.checkpoint_engine (a broadcast per version sent)"
             if "checkpoint_engine" in section else "")
          + ("; use_rollout_log_probs=true" + ("" if "use_rollout_log_probs" in section else " (verl's default)")
             + " read as algorithm.rollout_correction.bypass_mode=true (pi_old is the rollout's log-probs)"
             if use_rollout_log_probs else "") + steps_note, file=sys.stderr, flush=True)
    return chosen


def _updates_between_loads(data: dict[str, Any], section: dict[str, Any], where: str, merged) -> str:
    """verl's fully-async trainer takes an optimizer step per ppo_mini_batch_size prompts and loads the
    rollout's weights every ``trigger_parameter_sync_step`` (K) of them; it reads no data.train_batch_size.
    rlvr loads after every step, so a step is K mini-batches: data.train_batch_size = K x ppo_mini_batch_size.
    Returns the notice's clause."""
    given = "trigger_parameter_sync_step" in section
    trigger = section.get("trigger_parameter_sync_step", 4)  # verl's default
    if isinstance(trigger, bool) or not isinstance(trigger, int) or trigger < 1:
        raise ConfigError(f"async_training.trigger_parameter_sync_step={trigger!r} {where} must be an integer >= 1 "
                          "(optimizer steps between two weight loads)")
    mini = _flatten(data).get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if mini is None and merged is not None:
        mini = OmegaConf.select(merged, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if not isinstance(mini, int) or mini < 1:
        raise ConfigError(f"async_training {where}: verl's fully-async trainer updates per "
                          "actor_rollout_ref.actor.ppo_mini_batch_size prompts; set it (>= 1)")
    batch = data.setdefault("data", {})
    before = batch.get("train_batch_size")
    batch["train_batch_size"] = trigger * mini
    default = "" if given else " (verl's default)"
    return (f"; trigger_parameter_sync_step={trigger}{default}: {trigger} "
            f"updates of ppo_mini_batch_size={mini} prompts between two weight loads, read as "
            f"data.train_batch_size={trigger * mini}"
            + (f" (the {before} given is not read by verl's fully-async trainer)"
               if before is not None and before != trigger * mini else ""))


def _rollout_is_keys(data: dict[str, Any], source: str) -> None:
    """rlvr's first spelling, ``algorithm.rollout_is`` (true/false), ``rollout_is_level`` and
    ``rollout_is_threshold``, read onto verl's ``algorithm.rollout_correction`` with a note."""
    algo = data.get("algorithm")
    if not isinstance(algo, dict) or not {"rollout_is", "rollout_is_level", "rollout_is_threshold"} & set(algo):
        return
    enabled, level = algo.pop("rollout_is", None), algo.pop("rollout_is_level", None)
    threshold = algo.pop("rollout_is_threshold", None)
    if enabled is not None and not isinstance(enabled, bool):
        raise ConfigError(f"algorithm.rollout_is={enabled!r} (from {source}) is rlvr's older switch, true or false; "
                          "name the level in algorithm.rollout_correction.rollout_is (token, sequence, geometric)")
    correction = algo.setdefault("rollout_correction", {})
    moved = []
    if enabled is not None:
        correction["rollout_is"] = (level or "token") if enabled else None
        moved.append(f"rollout_is={correction['rollout_is'] or 'null'}")
    elif level is not None:
        correction.setdefault("rollout_is", level)
        moved.append(f"rollout_is={level}")
    if threshold is not None:
        correction["rollout_is_threshold"] = threshold
        moved.append(f"rollout_is_threshold={threshold}")
    print(f"[rlvr] note: algorithm.rollout_is* (from {source}) read as algorithm.rollout_correction: "
          f"{', '.join(moved) or 'nothing set'}", file=sys.stderr, flush=True)


def _nearest(key: str) -> str:
    all_keys = list(known_keys())
    near = difflib.get_close_matches(key, all_keys, n=1, cutoff=0.6)
    if not near:  # a key put under the wrong section: match on the last part
        near = [k for k in all_keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
    return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""


def recipe_path(name: str | Path) -> Path:
    """A YAML file, or the name of a recipe shipped in rlvr/config (``grpo``, ``dapo``, ...)."""
    path = Path(name).expanduser()
    if not path.exists() and path.suffix == "" and (RECIPES_DIR / f"{name}.yaml").is_file():
        return RECIPES_DIR / f"{name}.yaml"
    return path


def import_custom_modules(entries: Iterable[str]) -> None:
    """Import each file or module of ``custom_modules`` (once), so its registrations exist. Every
    process that receives a config calls it (the driver at load, the Ray TaskRunner and workers)."""
    for entry in entries:
        path = Path(entry).expanduser()
        try:
            if path.suffix == ".py":
                if not path.is_file():
                    raise ConfigError(f"custom_modules: {str(path)!r} does not exist")
                import_file(path, "rlvr_custom")
            else:
                importlib.import_module(entry)
        except ConfigError:
            raise
        except Exception as err:
            raise ConfigError(f"custom_modules: importing {entry!r} failed: {type(err).__name__}: {err}") from None


def _missing(path: Path) -> str:
    """A config that is not there; a bare name (``--config dapoo``) gets the nearest shipped recipe."""
    if path.suffix or len(path.parts) > 1:
        return f"config file {str(path)!r} does not exist"
    recipes = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    near = difflib.get_close_matches(path.name, recipes, n=1, cutoff=0.6)
    return (f"{str(path)!r} is neither a file nor a shipped recipe{f'; did you mean {near[0]}?' if near else ''} "
            f"(recipes: {', '.join(recipes)})")


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(_missing(path))
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, not a {type(data).__name__}")
    return data


def load_config(config_file: str | Path | None = None, overrides: Iterable[str] = (), *, base: str | None = None,
                device_hint: str | None = None) -> RLVRConfig:
    """Schema defaults, then a base: the GRPO recipe (``grpo.yaml``), or verl's defaults (``verl.yaml``)
    for a verl script; then ``config_file`` (a partial file changes only what it sets; a recipe name
    like ``dapo`` finds a shipped recipe); then the overrides; ``~key`` overrides restore schema
    defaults last.

    ``base``: ``grpo`` or ``verl``; None chooses verl's when ``config_file`` is ``verl`` or a YAML of
    verl's shape (a Hydra ``defaults`` list naming ``ppo_trainer``), else the GRPO recipe.
    ``device_hint``: ``cuda`` when the command plans a GPU (``rlvr plan --device-memory-gb``), so that
    ``trainer.device=auto`` resolves to it on a machine without one."""
    sets, deletions = split_overrides(overrides)
    file_layer, verl_shaped = None, False
    if config_file:
        path = recipe_path(config_file)
        data = _read_yaml(path)
        verl_shaped = _hydra_keys(data, f"file {str(path)!r}")
        if path.resolve() == VERL_BASE.resolve():
            verl_shaped = True
        elif path.resolve() != DEFAULT_RECIPE.resolve():
            file_layer = (data, f"file {str(path)!r}")
    if base is None:
        base = "verl" if verl_shaped else "grpo"
    if base not in ("grpo", "verl"):
        raise ConfigError(f"base {base!r}: choose grpo (rlvr's recipe) or verl (verl's defaults)")
    base_path = VERL_BASE if base == "verl" else DEFAULT_RECIPE
    layers = [(_read_yaml(base_path), f"{'verl defaults' if base == 'verl' else 'the recipe'} {str(base_path)!r}")]
    recipes = {0} if base == "grpo" else set()  # layers that are rlvr's shipped recipes (their run length gives way)
    if file_layer:
        if path.resolve().parent == RECIPES_DIR.resolve():
            recipes.add(len(layers))
        layers.append(file_layer)
    deletions = _delete_verl_keys(deletions, layers)  # before the command line: a later setting wins
    layers.append((parse_overrides(sets), "the command line"))
    merged = OmegaConf.structured(RLVRConfig)
    defaults = OmegaConf.structured(RLVRConfig)
    set_by: dict[str, tuple[str, bool]] = {}  # run-length key -> the layer that set it, and whether a recipe
    engine_set_by = [source for data, source in layers
                     if "checkpoint_engine" in (data.get("actor_rollout_ref") or {}).get("rollout", {})]
    async_chosen_at = None  # the layer whose async_training chose trainer.v1.trainer_mode
    penalty_ends: list = []  # verl's reward_model.reward_kwargs.max_resp_len, with its layer
    readings = VerlReadings()  # verl keys whose meaning needs every layer: read once they are merged
    for i, (data, source) in enumerate(layers):
        if "trainer_mode" in ((data.get("trainer") or {}).get("v1") or {}):
            async_chosen_at = None  # set by hand: kept
        if _fully_async_keys(data, source, merged):
            async_chosen_at = i
        _rollout_is_keys(data, source)
        readings.take(data, source)
        _verl_aliases(data, source, penalty_ends)
        _verl_keys(data, source)
        _ray_init_keys(data, source)
        _check_keys(data, source)
        if i > 0:  # the base's settings are defaults, not the user's
            readings.set_by.update((key, source) for key in _flatten(data))
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        except OmegaConfBaseException as err:
            raise ConfigError(_explain(err, source)) from None
        merged = _one_run_length(data, source, i in recipes, merged, defaults, set_by)
        merged = _ppo_group_size(data, source, merged)
    if base == "verl":
        _clip_ratio_notice(merged, readings.set_by)
    for end, source in penalty_ends:  # another layer's (verl.yaml's 512) may set the response length
        limit = OmegaConf.select(merged, "data.max_response_length")
        if end != limit:
            raise ConfigError(f"reward_model.reward_kwargs.max_resp_len={end!r} (from {source}) differs from "
                              f"data.max_response_length={limit!r}: rlvr's overlong penalty (reward.overlong_buffer) "
                              "ends at data.max_response_length; make them equal")
    if async_chosen_at is not None:  # a later layer may have set hybrid_engine: the mode follows it
        mode = "colocate_async" if OmegaConf.select(merged, "actor_rollout_ref.hybrid_engine") else "separate_async"
        if OmegaConf.select(merged, "trainer.v1.trainer_mode") != mode:
            OmegaConf.update(merged, "trainer.v1.trainer_mode", mode, merge=False)
            print(f"[rlvr] note: async_training read as trainer.v1.trainer_mode={mode}: actor_rollout_ref.hybrid_engine "
                  "is set by a later layer", file=sys.stderr, flush=True)
    for key in deletions:
        OmegaConf.update(merged, key, OmegaConf.select(defaults, key), merge=False)
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_explain(err, "the config")) from None
    # files by absolute path: Ray's TaskRunner and workers import them again, from their own folder
    cfg.custom_modules = [os.path.abspath(Path(e).expanduser()) if e.endswith(".py") else e for e in cfg.custom_modules]
    import_custom_modules(cfg.custom_modules)
    readings.apply(cfg)
    resolve_device(cfg, device_hint)
    resolve_precision(cfg)
    resolve_strategy(cfg)
    resolve_rollout_mode(cfg)
    resolve_critic_batches(cfg)
    resolve_rollout_correction(cfg)
    resolve_ray_address(cfg)
    validate(cfg)
    _check_tools(cfg)
    for note in distillation_notes(cfg) + server_notes(cfg) + device_notes(cfg):
        print(f"[rlvr] note: {note}", file=sys.stderr, flush=True)
    if engine_set_by and cfg.actor_rollout_ref.rollout.mode == "async":
        print(f"[rlvr] note: actor_rollout_ref.rollout.checkpoint_engine (from {', '.join(engine_set_by)}) has no "
              "effect with rollout.mode=async: the servers get the weights by actor_rollout_ref.rollout.server."
              "weight_sync (docs/servers.md)", file=sys.stderr, flush=True)
    elif engine_set_by and cfg.actor_rollout_ref.hybrid_engine:
        print(f"[rlvr] note: actor_rollout_ref.rollout.checkpoint_engine (from {', '.join(engine_set_by)}) has no "
              "effect with hybrid_engine=true: the engine shares the actor's process and gets the weights in place "
              "(vLLM: streamed one tensor at a time); it sets the broadcast to a rollout pool of its own "
              "(hybrid_engine=false)", file=sys.stderr, flush=True)
    return cfg


def _check_tools(cfg: RLVRConfig) -> None:
    """The tools YAML's classes import and are tools (verl's mapped to rlvr's, or refused by name), before
    anything loads: ``rlvr plan`` and ``--explain`` see what training would."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.enable and mt.tool_config_path:
        from rlvr.tools.config import load_tools

        load_tools(mt.tool_config_path, instantiate=False)
    if mt.enable and mt.interaction_config_path:
        from rlvr.tools.interaction import load_interactions

        load_interactions(mt.interaction_config_path, build=False)  # built once, by the trainer


def _hydra_keys(data: dict[str, Any], source: str) -> bool:
    """A YAML of verl's shape (``--config-path``/``--config-name``) carries Hydra's own keys: ``hydra``
    (search paths and run folders, Hydra's business) is dropped with a notice, and the ``defaults`` list
    may name verl's ``ppo_trainer`` (and ``_self_``): returns whether it does, which makes verl's defaults
    the base. Another entry would compose a config group rlvr does not have: refused."""
    hydra, entries = data.pop("hydra", None), data.pop("defaults", None)
    if hydra is None and entries is None:
        return False
    if not isinstance(entries, (list, type(None))):
        raise ConfigError(f"defaults (from {source}) must be Hydra's defaults list, e.g. [ppo_trainer, _self_]")
    other = [e for e in entries or [] if e not in ("ppo_trainer", "_self_")]
    megatron = [e for e in other if "megatron" in str(e)]  # ppo_megatron_trainer, {actor@...: megatron_actor}
    if megatron:
        raise ConfigError(f"defaults (from {source}) entry {megatron[0]!r} composes verl's Megatron config: "
                          f"{MEGATRON_BACKEND}; name ppo_trainer (verl's FSDP defaults) instead and drop the Megatron "
                          f"keys (*.megatron.*; {MEGATRON_LORA})")
    if other:
        raise ConfigError(f"defaults (from {source}) entry {other[0]!r}: rlvr composes no Hydra config groups; "
                          "verl's ppo_trainer (its defaults) and _self_ are the entries it reads; put the group's "
                          "keys in this file")
    verl = "ppo_trainer" in (entries or [])
    named = [key for key, value in (("hydra", hydra), ("defaults", entries)) if value is not None]
    print(f"[rlvr] note: {' and '.join(named)} (from {source}): Hydra's own settings, no rlvr keys"
          + ("; the defaults list names verl's ppo_trainer, so verl's defaults (rlvr/config/verl.yaml) are the "
             "base" if verl else ""), file=sys.stderr, flush=True)
    return verl


def resolve_device(cfg: RLVRConfig, hint: str | None) -> None:
    """``trainer.device=auto`` is cuda wherever a GPU is present, at run time; a command that plans a GPU
    (``rlvr plan --device-memory-gb``: a device of that size is a GPU's) resolves it to cuda here, so the
    plan holds vLLM's KV cache and the precisions on the device, not in host memory."""
    if cfg.trainer.device == "auto" and hint == "cuda":
        cfg.trainer.device = "cuda"


PRECISION_KEYS = ("actor_rollout_ref.actor.dtype", "actor_rollout_ref.rollout.dtype",
                  "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype")


MIXED_PRECISION_KEYS = ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
                        "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype")
# verl's other spellings (its PrecisionType, verl/utils/torch_dtypes.py) of the precisions rlvr trains in
VERL_PRECISIONS = {"bf16": "bfloat16", "fp32": "float32", "32": "float32"}


def resolve_precision(cfg: RLVRConfig) -> None:
    """``auto`` precisions follow the device: bfloat16 compute on GPUs (verl's defaults; fp32
    master weights, optimizer state and gradient reduction stay), float32 on CPUs, where bf16
    matmuls are slower. verl's spellings of the mixed precisions (``bf16``, ``fp32``) are rlvr's
    names from here on, for every reader. The resolved config (printed and saved with every run)
    says which."""
    gpu = on_gpu(cfg)
    for key in MIXED_PRECISION_KEYS:
        value = _select(cfg, key)
        _assign(cfg, key, VERL_PRECISIONS.get(value, value))
    for key in PRECISION_KEYS:
        if _select(cfg, key) == "auto":
            _assign(cfg, key, "bfloat16" if gpu else "float32")


def resolve_strategy(cfg: RLVRConfig) -> None:
    """verl's ``strategy: fsdp`` (its default, FSDP sharding) is rlvr's fsdp2, said in a notice; ``auto``
    (a config that names no strategy) is local on one device and fsdp2 on more, where a verl script
    that sets only ``trainer.n_gpus_per_node`` gets verl's sharded default.

    On one device, verl's FSDP honours ``param_offload`` / ``optimizer_offload`` (its one-GPU LoRA
    tuning scripts set them): ``auto`` with offload on a GPU is fsdp2, which offloads too; with LoRA,
    which rlvr trains unsharded only, and on a CPU, where the model is in host memory already, it is
    local, and the offloads are turned off with a notice (``rlvr plan`` and the memory check before
    training refuse a run that does not fit without them). An explicit strategy is kept as given."""
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    actor = arr.actor
    if actor.strategy == "fsdp":
        print("[rlvr] note: actor_rollout_ref.actor.strategy=fsdp (verl's FSDP) is rlvr's fsdp2: each decoder "
              "layer, then the root, sharded with torch's FSDP2", file=sys.stderr, flush=True)
        actor.strategy = "fsdp2"
    elif actor.strategy == "auto" and trainer.n_gpus_per_node * trainer.nnodes > 1:
        actor.strategy = "fsdp2"
    elif actor.strategy == "auto":
        offloads = offload_keys(arr)
        lora = arr.model.lora_rank > 0 or cfg.algorithm.adv_estimator == "gae" and cfg.critic.model.lora_rank > 0
        if offloads and on_gpu(cfg) and not lora:
            actor.strategy = "fsdp2"
            print(f"[rlvr] note: actor_rollout_ref.{{{','.join(offloads)}}} on one device: "
                  "actor_rollout_ref.actor.strategy=fsdp2 (one shard), which offloads between phases as verl's FSDP "
                  "does on one GPU (with no offload, one device trains the model unsharded, strategy=local)",
                  file=sys.stderr, flush=True)
            return
        actor.strategy = "local"
        if offloads and (on_gpu(cfg) or trainer.device == "auto"):  # device=cpu with offload is refused
            why = ("LoRA trains unsharded (strategy=local), which keeps the parameters and the optimizer state on "
                   "the device" if on_gpu(cfg) else
                   "this machine has no CUDA device (trainer.device=auto runs on the CPU, where the model already is)")
            print(f"[rlvr] note: actor_rollout_ref.{{{','.join(offloads)}}} turned off: {why}; rlvr plan and the "
                  "memory check before training refuse a run that does not fit", file=sys.stderr, flush=True)
            actor.fsdp_config.param_offload = actor.fsdp_config.optimizer_offload = False
            arr.ref.fsdp_config.param_offload = False


def resolve_rollout_mode(cfg: RLVRConfig) -> None:
    """``rollout.mode=async`` with the hybrid engine on several GPU training ranks and no external
    servers, where rlvr would have to place replicas of its own on the ranks' GPUs (asleep through
    each update: not built): the engine runs in the training processes, as with ``mode=sync``
    (verl's example scripts set async with vLLM and TP 2 on 8 GPUs), said in a notice. Several CPU
    ranks, or GPU ranks with ``hybrid_engine=false``, start their replicas as Ray actors; any ranks
    train on servers given in ``rollout.external_server_addresses``. SGLang has no in-process
    engine: validation refuses it."""
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    rollout = arr.rollout
    if rollout.mode != "async" or rollout.name == "sglang" or rollout.external_server_addresses:
        return
    if trainer.n_gpus_per_node * trainer.nnodes > 1 and arr.hybrid_engine and trainer.device != "cpu":
        print("[rlvr] note: actor_rollout_ref.rollout.mode=async: replicas that rlvr starts on the GPUs of several "
              "training ranks (asleep through each update, as verl colocates them) are not built yet, so the engine "
              "runs in the training processes (mode=sync: the same samples, driven as one batch); for servers set "
              "actor_rollout_ref.hybrid_engine=false (replicas on GPUs of their own, rollout.n_gpus_per_node of "
              "them) or give actor_rollout_ref.rollout.external_server_addresses (docs/servers.md)",
              file=sys.stderr, flush=True)
        rollout.mode = "sync"


def resolve_rollout_correction(cfg: RLVRConfig) -> None:
    """Bypass mode's ``ppo_clip`` loss with ``rollout_is`` weights: verl computes the weights for its
    metrics only (``compute_policy_loss_bypass_mode``: "IS weights are NOT applied", the clipped ratio
    is already pi / pi_rollout, so they would count the correction twice), and so does rlvr's actor
    (``Actor._micro_loss``); a notice says so."""
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    if not (rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is is not None):
        return
    print(f"[rlvr] note: {key}.rollout_is={rc.rollout_is} with bypass_mode and loss_type=ppo_clip: as in verl, the "
          "weights are computed for the rollout_corr/ metrics only and not applied (the clipped ratio is already "
          f"pi / pi_rollout); {key}.loss_type=reinforce applies them", file=sys.stderr, flush=True)


def resolve_ray_address(cfg: RLVRConfig) -> None:
    """``ray_kwargs.ray_init.address: null`` is ray.init's: the cluster in ``RAY_ADDRESS`` (what ``ray job
    submit`` sets), else a Ray of rlvr's own on 127.0.0.1. A run on Ray reads ``RAY_ADDRESS`` here, so
    the saved config and every reader (several nodes' check, the workers' rendezvous) see the cluster;
    a one-device run trains in this process, without Ray, and says so."""
    env = os.environ.get("RAY_ADDRESS")
    ray_init = cfg.ray_kwargs.ray_init
    if not env or ray_init.address is not None:
        return
    if uses_ray(cfg):
        ray_init.address = env
        print(f"[rlvr] note: ray_kwargs.ray_init.address=null with RAY_ADDRESS={env} in the environment: the run "
              "joins that cluster, as ray.init does", file=sys.stderr, flush=True)
    else:
        print(f"[rlvr] note: RAY_ADDRESS={env} is set, but one device trains in this process, without Ray; to run "
              "on that cluster set ray_kwargs.ray_init.address=auto", file=sys.stderr, flush=True)


def resolve_critic_batches(cfg: RLVRConfig) -> None:
    """The critic's mini-batch and epochs follow the actor's unless set, as verl's
    ``critic.ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}``: a verl PPO
    script that sets only the actor's gets the same number of critic steps as under verl."""
    critic, actor = cfg.critic, cfg.actor_rollout_ref.actor
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = actor.ppo_mini_batch_size
    if critic.ppo_epochs is None:
        critic.ppo_epochs = actor.ppo_epochs


RUN_LENGTH_KEYS = ("trainer.total_epochs", "trainer.total_training_steps")


def _clip_ratio_notice(merged, set_by: dict[str, str]) -> None:
    """Under verl's base, clip_ratio_low/high are verl's 0.2 (verl.yaml), and the losses fall back to
    clip_ratio only where they are null: a clip_ratio set without them changes nothing, as in verl."""
    actor, ends = "actor_rollout_ref.actor", ("clip_ratio_low", "clip_ratio_high")
    if f"{actor}.clip_ratio" not in set_by or any(OmegaConf.select(merged, f"{actor}.{end}") is None for end in ends):
        return  # clip_ratio is the fallback of a null end: it decides there
    deciding = [f"{end}={OmegaConf.select(merged, f'{actor}.{end}')}" for end in ends if f"{actor}.{end}" not in set_by]
    if deciding:
        print(f"[rlvr] note: {actor}.clip_ratio={OmegaConf.select(merged, f'{actor}.clip_ratio')} (from "
              f"{set_by[f'{actor}.clip_ratio']}) changes nothing: as in verl, clip_ratio_low/high decide "
              f"({', '.join(deciding)}); set them to change the clip range", file=sys.stderr, flush=True)


def _one_run_length(data: dict[str, Any], source: str, recipe: bool, merged, defaults,
                    set_by: dict[str, tuple[str, bool]]):
    """The run ends at the first of ``total_epochs`` epochs and ``total_training_steps`` steps, as in
    verl, so the user's values from several layers combine as Hydra merges them. One exception: a
    layer that sets ``total_epochs`` and not ``total_training_steps`` drops the steps an rlvr recipe
    set (the GRPO recipe's 24), which would otherwise silently cut a user's ``total_epochs=15``.
    ``total_epochs`` needs no such reset: its default is verl's own 30."""
    flat = _flatten(data)
    given = [key for key in RUN_LENGTH_KEYS if key in flat]
    steps, epochs = "trainer.total_training_steps", "trainer.total_epochs"
    if given == [epochs] and set_by.get(steps, (None, False))[1]:
        value, default = OmegaConf.select(merged, steps), OmegaConf.select(defaults, steps)
        if value != default:
            print(f"[rlvr] note: {epochs}={flat[epochs]} (from {source}) sets the run length, so {steps}={value} "
                  f"(from {set_by[steps][0]}) is dropped (back to {default}); to keep both, set both (then the run "
                  "ends at the first reached, as in verl)", file=sys.stderr, flush=True)
            OmegaConf.update(merged, steps, default, merge=False)
    for key in given:
        set_by[key] = (source, recipe)
    return merged


def _ppo_group_size(data: dict[str, Any], source: str, merged):
    """The GRPO recipe's ``rollout.n=8`` is a group size. A layer that chooses PPO with a critic
    (``adv_estimator=gae``) and sets no ``rollout.n`` gets verl's default, 1, with a note: verl's PPO
    scripts set no n, and 8 responses per prompt would be 8 times verl's rollouts and updates."""
    flat = _flatten(data)
    if flat.get("algorithm.adv_estimator") != "gae" or "actor_rollout_ref.rollout.n" in flat:
        return merged
    if OmegaConf.select(merged, "actor_rollout_ref.rollout.n") != 1:
        print(f"[rlvr] note: algorithm.adv_estimator=gae (from {source}) with no rollout.n: "
              "actor_rollout_ref.rollout.n=1 (verl's default for PPO; the GRPO recipe's groups of "
              f"{OmegaConf.select(merged, 'actor_rollout_ref.rollout.n')} are dropped); set rollout.n to keep groups",
              file=sys.stderr, flush=True)
        OmegaConf.update(merged, "actor_rollout_ref.rollout.n", 1, merge=False)
    return merged


def _explain(err: OmegaConfBaseException, source: str) -> str:
    key = getattr(err, "full_key", None) or "?"
    first = str(err).splitlines()[0]
    return f"config key {key!r} (from {source}): {first}"


def to_yaml(cfg: RLVRConfig) -> str:
    """The resolved config as YAML (what ``rlvr config show`` prints and runs save)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
