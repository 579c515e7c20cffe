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

A folder belongs to one process at a time: ``lock_run_folder`` takes an exclusive ``flock`` on
``<run dir>/.rlvr.lock`` (holding the pid, and the settings a resume must share) for the whole run,
and a second ``rlvr train`` that would write there is refused with that pid. The kernel drops the
lock when its process dies, so a lock file left by ``kill -9`` blocks nothing. A run with other
settings still goes to ``<dir>-2``, also while the first is loading and has written no
``config.yaml`` yet: until then the settings in its lock stand for it.

Where verl differs: verl writes every run with the same ``default_local_dir`` into one folder
(checkpoints overwritten, logs appended); rlvr never writes into another run's folder.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from rlvr.config import ConfigError
from rlvr.config.schema import RLVRConfig
from rlvr.trainer import checkpoint

RECORD = ("config.yaml", "metrics.jsonl", "checkpoints")  # what makes a folder a run's
MAX_SUFFIX = 1000




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
    view = _attributes(saved)  # each key through its getter: a setting the run does not read is None there too
    values = {}
    for key, getter in checkpoint.COMPATIBILITY_KEYS.items():
        try:
            values[key] = getter(view)
        except (AttributeError, TypeError):  # a key an older rlvr did not record is not compared, as at resume
            pass
    return values


def _attributes(node: Any) -> Any:
    """A config.yaml's mapping read by attribute, as the compatibility getters read an RLVRConfig."""
    if isinstance(node, dict):
        return SimpleNamespace(**{str(k): _attributes(v) for k, v in node.items()})
    return [_attributes(v) for v in node] if isinstance(node, list) else node


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.loads(json.dumps(a, default=str)) == json.loads(json.dumps(b, default=str))


def _why_not(folder: Path, config: RLVRConfig) -> str | None:
    """Why this run cannot write into ``folder``; raises when a live process holds it and it is this
    run's folder: free for it, or holding these settings with no checkpoint yet (a run still starting)."""
    if folder.exists() and not folder.is_dir():
        return "is a file"
    reason = why_not_here(folder, config)
    if reason in (None, NO_CHECKPOINT_YET):
        holder = lock_holder(folder)
        if holder is not None:
            raise _in_use(folder, holder.pid)
    return reason


NO_CHECKPOINT_YET = "holds a run with these settings but no checkpoint to resume from"


def why_not_here(folder: Path, config: RLVRConfig) -> str | None:
    """Why this run cannot write into ``folder`` (None: it can). A run still loading there, with no
    record written yet, is judged by the settings its lock holds, as its config.yaml would be."""
    on_disk = holds_a_run(folder)
    loading = None if on_disk else lock_holder(folder)
    if not on_disk and (loading is None or loading.settings is None):
        return None  # free, or locked with no settings written yet: the caller refuses that as in use
    holds = "holds" if loading is None else f"is in use by process {loading.pid}, loading"
    mode = config.trainer.resume_mode
    if mode == "disable":
        return f"{holds} another run (trainer.resume_mode=disable starts a new one)"
    if mode != "auto":
        return f"{holds} a run, and this one resumes from {mode}"
    saved = saved_compatibility(folder) if loading is None else loading.settings
    if saved is None:
        return "holds a run whose config.yaml cannot be read"
    now = {key: value for key, value in checkpoint.compatibility(config).items() if key in saved}
    if not _same(saved, now):
        differ = [k for k in now if not _same({k: saved.get(k)}, {k: now[k]})]
        return f"{holds} another run (its {', '.join(differ)} differ from this one's)"
    if checkpoint.latest_checkpoint(folder / "checkpoints") is None:
        return NO_CHECKPOINT_YET
    return None


LOCK_NAME = ".rlvr.lock"


def _in_use(folder: Path, pid: str) -> ConfigError:
    return ConfigError(f"{folder} is in use by process {pid or '(pid not yet written)'} (its lock: "
                       f"{folder / LOCK_NAME}): a run folder belongs to one process. Wait for that run to end, stop "
                       f"it (Ctrl-C, or kill {pid or 'PID'}; it saves its step and the same command resumes), or give "
                       "this run another trainer.experiment_name")


@dataclasses.dataclass
class Holder:
    """The live process holding a folder's lock: its pid ("" while being written) and the settings
    a resume must share that it recorded there (None: none recorded)."""

    pid: str
    settings: dict[str, Any] | None


def lock_holder(folder: Path) -> Holder | None:
    """Who holds ``folder``'s lock, when a live process does (None: free). Probes without creating
    anything: another run's folder is never written."""
    try:
        handle = open(folder / LOCK_NAME)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return parse_lock(handle.read())
        return None  # closing the file releases the probe's lock


def parse_lock(text: str) -> Holder:
    """A lock file's text: the pid on its first line, the settings as JSON on its second."""
    pid, _, settings = text.partition("\n")
    try:
        recorded = json.loads(settings) if settings.strip() else None
    except json.JSONDecodeError:  # a line half written: as if none were
        recorded = None
    return Holder(pid.strip(), recorded if isinstance(recorded, dict) else None)


class RunFolderLock:
    """An exclusive flock on ``<folder>/.rlvr.lock`` with this process's pid in it and ``settings``
    (what a resume must share) beside it: a second run started while this one loads, before its
    config.yaml exists, reads them there. ``release`` removes the file (and the folder, when this run
    made it and wrote nothing else)."""

    def __init__(self, folder: Path, settings: dict[str, Any] | None = None):
        self.folder, self.path = folder, folder / LOCK_NAME
        self.made_folder = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file in the way, a parent that takes no folders (/proc/x)
            if err.errno in checkpoint.DISK_ERRNOS:
                raise  # the disk's refusal: the command's own message says where to write instead
            raise ConfigError(f"trainer.default_local_dir={folder}: cannot make the run folder ({err.strerror}: "
                              f"{err.filename}); set it to a folder that exists or can be made") from None
        while True:
            handle = open(self.path, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = parse_lock(handle.read())
                handle.close()
                raise _in_use(folder, holder.pid) from None
            # the file may have been removed by a run that ended between our open and our lock: then
            # this lock is on a file no one else can see, so take the one at the path again
            try:
                same = os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            handle.close()
        handle.truncate(0)
        recorded = "" if settings is None else json.dumps(settings, default=str) + "\n"
        handle.write(f"{os.getpid()}\n{recorded}")  # one write: a reader sees the pid with its settings
        handle.flush()
        self.handle = handle

    def release(self) -> None:
        if self.handle is None:
            return
        self.path.unlink(missing_ok=True)  # while still locked: no other run can hold this file
        self.handle.close()
        self.handle = None
        if self.made_folder:
            try:
                self.folder.rmdir()  # only if empty: a run stopped before it wrote anything
            except OSError:
                pass

    def __enter__(self) -> "RunFolderLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_folder(folder: Path, config: RLVRConfig | None = None) -> RunFolderLock:
    """Lock ``folder`` for this process (made if missing), or raise naming the pid that holds it;
    ``config``'s settings a resume must share are recorded in the lock for the runs that start
    while this one loads."""
    return RunFolderLock(folder, None if config is None else checkpoint.compatibility(config))


def claim_run_folder(config: RLVRConfig) -> RLVRConfig:
    """``config`` with ``trainer.default_local_dir`` (and the paths under it) set to the folder this
    run may write to; removes what a save cut short left in it. A folder this run would write to
    (or the running run's, before its first checkpoint) that another process holds is refused."""
    raw = config.trainer.default_local_dir.rstrip("/") or "/"
    wanted = Path(raw).expanduser()
    folder, suffix, first_reason = wanted, 1, None
    while (reason := _why_not(folder, config)):
        first_reason = first_reason or reason
        suffix += 1
        if suffix > MAX_SUFFIX:
            raise ConfigError(f"{wanted}-2 ... {wanted}-{MAX_SUFFIX} all hold other runs: set "
                              "trainer.experiment_name or trainer.default_local_dir")
        folder = wanted.with_name(f"{wanted.name}-{suffix}")
    checkpoints = folder / "checkpoints"
    for stale in sorted([*checkpoints.glob(".tmp-global_step_*"), *checkpoints.glob(".pruned-global_step_*")]):
        shutil.rmtree(stale, ignore_errors=True)
        what = "a save cut short" if stale.name.startswith(".tmp-") else "a removal of an old checkpoint cut short"
        if stale.exists():  # a read-only disk: say so, not that it went
            print(f"[rlvr] could not remove {stale} ({what})", flush=True)
        else:
            print(f"[rlvr] removed {stale}: {what} (the checkpoints beside it are complete)", flush=True)
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
