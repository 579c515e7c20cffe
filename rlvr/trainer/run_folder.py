"""A run folder holds one run: its ``config.yaml``, ``metrics.jsonl``, ``checkpoints/`` and
rollout dumps, and nothing of any other run.

``claim_run_folder`` picks the folder a run writes to before anything is written:
``trainer.default_local_dir`` when it holds no run, or holds this very run and the run resumes
there (``resume_mode=auto``, the settings a resume must share unchanged, a checkpoint to resume
from); otherwise the first of ``<dir>-2``, ``<dir>-3``, ... that qualifies, said on the console.
So the quick start's GRPO, RLOO and LoRA commands each get a folder, ``resume_mode=disable``
starts a new folder instead of overwriting the checkpoints and appending to the record of the
run before it, and running the same command again still resumes where that run stopped.
Temporary folders of a save cut short (``.tmp-global_step_*``) are removed from the folder a run
resumes in, before it starts.

Where verl differs: verl writes every run with the same ``default_local_dir`` into one folder
(checkpoints overwritten, logs appended); rlvr never writes into another run's folder.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import ConfigError
from rlvr.config.schema import RLVRConfig
from rlvr.trainer import checkpoint

RECORD = ("config.yaml", "metrics.jsonl", "checkpoints")  # what makes a folder a run's
MAX_SUFFIX = 1000


MISSING = object()


def holds_a_run(folder: Path) -> bool:
    return any((folder / name).exists() for name in RECORD)


def saved_compatibility(folder: Path) -> dict[str, Any] | None:
    """The settings a resume must share, as the run in ``folder`` recorded them in its config.yaml
    (None: no readable config.yaml)."""
    try:
        saved = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(saved, dict):
        return None
    values = {}
    for key in checkpoint.COMPATIBILITY_KEYS:
        node = saved
        for part in key.split("."):
            node = node.get(part, MISSING) if isinstance(node, dict) else MISSING
        if node is not MISSING:  # a key an older rlvr did not record is not compared, as at resume
            values[key] = node
    return values


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.loads(json.dumps(a, default=str)) == json.loads(json.dumps(b, default=str))


def why_not_here(folder: Path, config: RLVRConfig) -> str | None:
    """Why this run cannot write into ``folder`` (None: it can)."""
    if not holds_a_run(folder):
        return None
    mode = config.trainer.resume_mode
    if mode == "disable":
        return "holds another run (trainer.resume_mode=disable starts a new one)"
    if mode != "auto":
        return f"holds a run, and this one resumes from {mode}"
    saved = saved_compatibility(folder)
    if saved is None:
        return "holds a run whose config.yaml cannot be read"
    now = {key: value for key, value in checkpoint.compatibility(config).items() if key in saved}
    if not _same(saved, now):
        differ = [k for k in now if not _same({k: saved.get(k)}, {k: now[k]})]
        return f"holds another run (its {', '.join(differ)} differ from this one's)"
    if checkpoint.latest_checkpoint(folder / "checkpoints") is None:
        return "holds a run with these settings but no checkpoint to resume from"
    return None


def claim_run_folder(config: RLVRConfig) -> RLVRConfig:
    """``config`` with ``trainer.default_local_dir`` (and the paths under it) set to the folder this
    run may write to; removes what a save cut short left in it."""
    raw = config.trainer.default_local_dir.rstrip("/") or "/"
    wanted = Path(raw).expanduser()
    folder, suffix, first_reason = wanted, 1, None
    while (reason := "is a file" if folder.exists() and not folder.is_dir() else why_not_here(folder, config)):
        first_reason = first_reason or reason
        suffix += 1
        if suffix > MAX_SUFFIX:
            raise ConfigError(f"{wanted}-2 ... {wanted}-{MAX_SUFFIX} all hold other runs: set "
                              "trainer.experiment_name or trainer.default_local_dir")
        folder = wanted.with_name(f"{wanted.name}-{suffix}")
    for stale in sorted((folder / "checkpoints").glob(".tmp-global_step_*")):
        shutil.rmtree(stale, ignore_errors=True)
        print(f"[rlvr] removed {stale}: a save cut short (the checkpoints beside it are complete)", flush=True)
    if folder == wanted:
        return config
    print(f"[rlvr] {wanted} {first_reason}: this run writes to {folder}", flush=True)
    return moved(config, config.trainer.default_local_dir, f"{raw}-{suffix}")


def moved(config: RLVRConfig, old: str, new: str) -> RLVRConfig:
    """``config`` with every trainer path to write under ``old`` (the run folder, the rollout dumps) under ``new``."""
    old = old.rstrip("/")
    changes = {}
    for field in dataclasses.fields(config.trainer):
        if field.name == "resume_mode":  # a checkpoint to read (possibly in that folder), not a place to write
            continue
        value = getattr(config.trainer, field.name)
        if isinstance(value, str) and (value.rstrip("/") == old or value.startswith(old + "/")):
            changes[field.name] = new + value.rstrip("/")[len(old):]
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, **changes))
