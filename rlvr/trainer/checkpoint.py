"""Checkpoints: written whole or not at all, found again on resume, checked for compatibility.

A checkpoint is a folder ``<run_dir>/checkpoints/global_step_<k>/``:

- ``actor/``: the policy as a Hugging Face folder (safetensors + config + tokenizer), loadable
  by ``AutoModelForCausalLM.from_pretrained`` with no merge step; with LoRA the adapter in
  peft's format (``rlvr export`` merges it into the base model);
- ``actor_state.pt``: optimizer, LR scheduler and the actor's update counter;
- ``critic/`` and ``critic_state.pt`` with a critic;
- ``trainer_state.pt``: global step, data sampler state, KL controller, RNG states, and the
  config values a resumed run must share (``COMPATIBILITY_KEYS``).

It is written into ``.tmp-global_step_<k>``, every file is fsynced, and the folder is renamed
when complete (then the parent folder is fsynced), so a save killed midway, or a power loss,
leaves the previous checkpoint as the newest loadable one; a save interrupted in this process
(a second Ctrl-C) removes its temporary folder, and one left by a killed process is removed when
the next run starts in the folder (``run_folder``) or by the next save. ``latest_checkpointed_iteration.txt`` (verl's name) is
replaced atomically after the rename.

Where rlvr departs from verl: ``resume_mode=auto`` resumes from the newest complete step folder,
not from the step the tracker file names (verl's ``find_latest_ckpt_path`` reads only the
tracker). A folder appears only whole, by its rename, and the tracker is written after it, so a
tracker behind the newest folder means a save cut short between the two (or a hand edit), and
following it would train the newer steps again. When the tracker disagrees (an older step, a step
with no folder, a damaged one, text that is no step) the run says which checkpoint it resumes from
and why, and how to resume from the tracker's step instead.

A checkpoint damaged afterwards (a file truncated by a full disk or by a copy between machines, a
``torch.save`` file whose bytes changed) is refused before resuming, naming the file and the newest
earlier checkpoint that is intact.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.config import ConfigError
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import resume_mode_problem
from rlvr.errors import StopTraining
from rlvr.models.loader import safetensors_problem


class DamagedCheckpointError(ConfigError):
    """A checkpoint with a file that cannot be read whole; the message names the file and the newest
    earlier checkpoint that is intact."""


LATEST_FILE = "latest_checkpointed_iteration.txt"


class CheckpointWriteError(StopTraining):
    """The disk refused a checkpoint (full, read-only, no permission): the run stops, saying so."""


# what the disk refuses with: full, over quota, read-only, no permission, an I/O error
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


# how the writers word a refused write when they raise no OSError: torch's zip writer ('PytorchStreamWriter
# failed writing file', or 'unexpected pos' from its C++ stream after a short write), safetensors' Rust I/O error
DISK_WORDS = ("PytorchStreamWriter failed", "unexpected pos", "iostream error", "No space left on device",
              "os error 28", "Disk quota exceeded", "Read-only file system")


def disk_refused(err: BaseException) -> bool:
    """A write the disk refused: an OSError of ``DISK_ERRNOS`` anywhere in the exception's chain, or
    a writer's own wording of one (``DISK_WORDS``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            return True
        if not isinstance(err, OSError) and any(word in str(err) for word in DISK_WORDS):
            return True
        err = err.__cause__ or err.__context__
    return False


def refused_save(root: Path, step: int, err: BaseException) -> CheckpointWriteError:
    """The message for a save the disk refused: what, how much space is left, what is kept."""
    what = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
    try:
        free = f"{size(shutil.disk_usage(root if root.exists() else root.parent).free)} free on that disk"
    except OSError:
        free = "free space unknown"
    last = latest_checkpoint(root) if root.is_dir() else None
    return CheckpointWriteError(
        f"cannot save step {step} under {root}: {what} ({free}). The partial checkpoint was removed; the last "
        f"complete checkpoint is {last or 'none yet'}. free space (trainer.max_actor_ckpt_to_keep=N keeps only the "
        "newest N) or set trainer.default_local_dir to a disk with room, then run the same command again to resume")
STEP_DIR = re.compile(r"^global_step_(\d+)$")

def _has_critic(config: RLVRConfig) -> bool:
    return config.algorithm.adv_estimator == "gae"


# (key, getter): a resumed run must agree on these, or its steps would not continue the saved run
COMPATIBILITY_KEYS = {
    "actor_rollout_ref.model.path": lambda c: str(c.actor_rollout_ref.model.path),
    "data.train_files": lambda c: [str(f) for f in c.data.train_files],
    "data.train_batch_size": lambda c: c.data.train_batch_size,
    "data.seed": lambda c: c.data.seed,
    "data.shuffle": lambda c: c.data.shuffle,
    "trainer.seed": lambda c: c.trainer.seed,
    "actor_rollout_ref.rollout.seed": lambda c: c.actor_rollout_ref.rollout.seed,
    "actor_rollout_ref.actor.ppo_mini_batch_size": lambda c: c.actor_rollout_ref.actor.ppo_mini_batch_size,
    "actor_rollout_ref.actor.ppo_epochs": lambda c: c.actor_rollout_ref.actor.ppo_epochs,
    # the optimizer's saved state carries its groups' lr, weight_decay and betas (and the scheduler its
    # base_lrs): loading it puts the checkpoint's back, so another value here would be ignored unsaid
    "actor_rollout_ref.actor.optim.lr": lambda c: c.actor_rollout_ref.actor.optim.lr,
    "actor_rollout_ref.actor.optim.weight_decay": lambda c: c.actor_rollout_ref.actor.optim.weight_decay,
    "actor_rollout_ref.actor.optim.betas": lambda c: list(c.actor_rollout_ref.actor.optim.betas),
    # the critic's optimizer likewise, where a critic trains (None otherwise: never compared unequal)
    "critic.optim.lr": lambda c: c.critic.optim.lr if _has_critic(c) else None,
    "critic.optim.weight_decay": lambda c: c.critic.optim.weight_decay if _has_critic(c) else None,
    "critic.optim.betas": lambda c: list(c.critic.optim.betas) if _has_critic(c) else None,
    # the KL controller's value is saved (an adaptive one moves): a new coefficient would be overwritten
    "algorithm.kl_ctrl.type": lambda c: c.algorithm.kl_ctrl.type if c.algorithm.use_kl_in_reward else None,
    "algorithm.kl_ctrl.kl_coef": lambda c: c.algorithm.kl_ctrl.kl_coef if c.algorithm.use_kl_in_reward else None,
    "actor_rollout_ref.rollout.n": lambda c: c.actor_rollout_ref.rollout.n,
    "actor_rollout_ref.model.lora_rank": lambda c: c.actor_rollout_ref.model.lora_rank,
    "actor_rollout_ref.model.lora_alpha": lambda c: c.actor_rollout_ref.model.lora_alpha,
    "actor_rollout_ref.model.target_modules": lambda c: c.actor_rollout_ref.model.target_modules,
    "algorithm.adv_estimator": lambda c: c.algorithm.adv_estimator,
    "actor_rollout_ref.actor.use_kl_loss": lambda c: c.actor_rollout_ref.actor.use_kl_loss,
    "algorithm.use_kl_in_reward": lambda c: c.algorithm.use_kl_in_reward,
    # async: the batches generated ahead are saved with the checkpoint, as many as the mode queues
    "trainer.v1.trainer_mode": lambda c: c.trainer.v1.trainer_mode,
    "trainer.v1.colocate_async.num_warmup_batches": lambda c: (c.trainer.v1.colocate_async.num_warmup_batches
                                                               if c.trainer.v1.trainer_mode != "sync" else None),
}


def checkpoint_root(config: RLVRConfig) -> Path:
    return Path(config.trainer.default_local_dir).expanduser() / "checkpoints"


def compatibility(config: RLVRConfig) -> dict[str, Any]:
    return {key: get(config) for key, get in COMPATIBILITY_KEYS.items()}


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (temporary folders never count)."""
    steps = step_dirs(root)
    return steps[-1] if steps else None


def step_dirs(root: Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name)))
    return [p for _, p in steps]


def save(root: Path, step: int, write_parts, trainer_state: dict[str, Any], keep: int | None = None) -> Path:
    """Write a checkpoint atomically: ``write_parts(folder)`` fills a temporary folder that is
    renamed to ``global_step_<step>`` when complete; older ones beyond ``keep`` are removed."""
    final = root / f"global_step_{step}"
    tmp = root / f".tmp-global_step_{step}"
    if final.is_dir():  # this step is saved (a step folder only ever appears whole, by the rename below):
        return final    # writing it again would open a window with no complete copy of it
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-global_step_*"):  # left by saves that were killed midway
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        write_parts(tmp)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        fsync_tree(tmp)
        os.replace(tmp, final)  # from here the checkpoint is complete; only verl's pointer file may not be
        replace_text(root / LATEST_FILE, str(step), durable=True)
    except BaseException as err:  # a second Ctrl-C (or an error) mid-save: discard the partial folder, keep the others
        shutil.rmtree(tmp, ignore_errors=True)  # nothing, once renamed
        if disk_refused(err):
            raise refused_save(root, step, err) from None
        raise
    if keep is not None and keep > 0:
        for old in step_dirs(root)[:-keep]:
            prune(old)
    return final


def prune(old: Path) -> None:
    """Remove a checkpoint folder, first renamed to a name no run reads (``.pruned-global_step_k``):
    a removal cut short never leaves a step folder with files missing."""
    gone = old.with_name(f".pruned-{old.name}")
    os.replace(old, gone)
    shutil.rmtree(gone, ignore_errors=True)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def describe_saved(root: Path, path: Path, keep: int | None) -> str:
    """What a save wrote and what the run's checkpoints now take on disk, with the key that bounds it."""
    kept = step_dirs(root)
    total = sum(folder_bytes(p) for p in kept)
    bound = (f"trainer.max_actor_ckpt_to_keep={keep} keeps the newest {keep}" if keep and keep > 0 else
             "every one is kept: trainer.max_actor_ckpt_to_keep=N keeps the newest N")
    return (f"[rlvr] saved {path} ({size(folder_bytes(path))}); {len(kept)} checkpoint"
            f"{'s' if len(kept) != 1 else ''} take {size(total)} ({bound})")


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def replace_text(path: Path, text: str, durable: bool = False) -> None:
    """Write ``path`` whole or not at all (a temporary file, then a rename): a run stopped or refused
    by a full disk mid-write keeps the file it had (metrics.jsonl's history, config.yaml, the LATEST
    pointer). ``durable``: flushed to disk, the rename too."""
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text)
    if durable:
        _fsync(tmp)
    os.replace(tmp, path)
    if durable:
        _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` to disk (before the rename publishes it)."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        _fsync(path)
    _fsync(folder)


def resolve_resume(config: RLVRConfig) -> Path | None:
    """The checkpoint ``trainer.resume_mode`` asks for: auto (newest, if any), disable, or a path;
    a damaged one is refused (``check_intact``)."""
    mode = config.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        path = latest_checkpoint(checkpoint_root(config))
        refuse_verl_layout(Path(config.trainer.default_local_dir).expanduser(), path)
    else:
        problem = resume_mode_problem(mode)  # checked at load; the folder may have gone since
        if problem:
            raise ConfigError(problem)
        path = Path(mode).expanduser()
    if path is not None:
        check_intact(path, mode)
    if mode == "auto":
        notice = tracker_disagrees(checkpoint_root(config), path)
        if notice:
            print(f"[rlvr] {notice}", flush=True)
    return path


def tracker_disagrees(root: Path, newest: Path | None) -> str | None:
    """What to say when ``root``'s ``latest_checkpointed_iteration.txt`` names another step than
    ``newest``, the complete checkpoint ``resume_mode=auto`` resumes from (None: it agrees, or there
    is no tracker). The step folders decide, not the tracker (see the module docstring)."""
    tracker = root / LATEST_FILE
    try:
        text = tracker.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    resuming = (f"resuming from the newest complete checkpoint, {newest}" if newest is not None else
                "no complete checkpoint: starting from the beginning")
    if not text.isdigit():
        return f"{tracker} names no step ({text[:40]!r}); {resuming}"
    named = root / f"global_step_{int(text)}"
    if newest is not None and named.name == newest.name:
        return None
    if not named.is_dir():
        return f"{tracker} names step {int(text)}, but {named} is not there; {resuming}"
    found = missing_part(named) or damaged_file(named)
    if found is not None:
        return f"{tracker} names step {int(text)}, but {found[0]} {found[1]}; {resuming}"
    return (f"{tracker} names step {int(text)}, but a newer complete checkpoint is there: {resuming} (a step's "
            "folder appears only whole and the tracker is written after it, so a tracker behind it is a save cut "
            "short between the two, or an edit). To resume from step "
            f"{int(text)} instead, set trainer.resume_mode={named} (that run then writes to a folder of its own)")


def refuse_verl_layout(run_dir: Path, ours: Path | None) -> None:
    """verl saves ``global_step_<k>/actor/`` (sharded, per rank) in the run folder itself, beside its
    ``latest_checkpointed_iteration.txt``; rlvr saves under ``checkpoints/``. A folder of verl's
    checkpoints would otherwise get a fresh run of rlvr's written into it, from step 0, without a word."""
    if ours is not None or not run_dir.is_dir():
        return
    steps = [p for p in run_dir.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    if steps or (run_dir / LATEST_FILE).is_file():
        raise ConfigError(f"{run_dir} holds verl's checkpoints ({sorted(p.name for p in steps) or LATEST_FILE}: verl's "
                          "layout, FSDP shards per rank), which rlvr cannot resume: set trainer.default_local_dir to "
                          "another folder; to start from verl's weights, merge them into a Hugging Face folder with "
                          "verl's model merger and give it as actor_rollout_ref.model.path")


def file_problem(file: Path) -> str | None:
    """Why a checkpoint file cannot be read whole (None: it can), without loading it: a safetensors
    file's header and size; a ``torch.save`` file's zip directory, which a truncated file has lost,
    and every entry's checksum. ``torch.load`` checks none: an optimizer state with bytes changed in
    the middle loaded as NaN moments without a word. Checking reads the file once (0.35 s for the
    built-in model's 1.08 GB optimizer state, against 0.63 s for its load)."""
    if file.suffix == ".safetensors":
        return safetensors_problem(file)
    if file.suffix == ".json":  # config.json, adapter_config.json, the tokenizer's
        try:
            json.loads(file.read_bytes())
        except (OSError, ValueError) as err:
            return f"is not readable JSON ({err})"
    if file.suffix == ".pt":
        try:
            with zipfile.ZipFile(file) as archive:
                broken = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return f"is not a whole torch.save file ({err}; truncated?)"
        if broken is not None:
            return f"is damaged: its entry {broken} fails its checksum"
    return None


def damaged_file(folder: Path) -> tuple[Path, str] | None:
    """The first file of checkpoint ``folder`` that cannot be read whole, with why."""
    for file in sorted(folder.rglob("*")):
        problem = file_problem(file) if file.is_file() else None
        if problem:
            return file, problem
    return None


def actor_missing(actor: Path) -> tuple[Path, str] | None:
    """What a checkpoint's ``actor/`` lacks of the policy: its weights (or LoRA adapter), or a shard
    its ``model.safetensors.index.json`` names (a policy saved in several files)."""
    if not any(actor.glob("*.safetensors")):
        return actor, "holds no *.safetensors weights (model or LoRA adapter)"
    index = actor / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return index, f"is not a readable weight index ({type(err).__name__}: {err})"
    missing = [name for name in shards if not (actor / name).is_file()]
    if missing:
        return index, f"names {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} missing"
    return None


def missing_part(folder: Path) -> tuple[Path, str] | None:
    """The first part every checkpoint has that ``folder`` lacks (a copy cut short, a file removed by
    hand), with why: the trainer's and the actor's state, the policy's weights (or adapter), and the
    critic's two parts together."""
    for name in ("trainer_state.pt", "actor_state.pt"):
        if not (folder / name).is_file():
            return folder / name, "is missing"
    if (missing := actor_missing(folder / "actor")) is not None:
        return missing
    state, weights = (folder / "critic_state.pt").is_file(), any((folder / "critic").glob("*.safetensors"))
    if weights and not state:
        return folder / "critic_state.pt", "is missing (the critic's weights are there)"
    if state and not weights:
        return folder / "critic", "holds no *.safetensors weights (the critic's state is there)"
    return None


def check_intact(path: Path, mode: str = "auto") -> None:
    """Refuse to resume from a checkpoint with a missing or damaged file: name the file, and the
    newest earlier checkpoint of the run that is whole, with how to resume from it. Never a silent
    fallback to an older step: the steps after it would be trained again without a word."""
    found = missing_part(path) or damaged_file(path)
    if found is None:
        return
    file, problem = found
    match = STEP_DIR.match(path.name)
    earlier = [p for p in reversed(step_dirs(path.parent))
               if match and int(STEP_DIR.match(p.name).group(1)) < int(match.group(1))]
    intact = next((p for p in earlier if missing_part(p) is None and damaged_file(p) is None), None)
    message = f"cannot resume from {path}: {file} {problem}."
    if intact is None:
        message += (" No earlier checkpoint of this run is intact; start afresh with trainer.resume_mode=disable "
                    "(the new run gets a folder of its own).")
    else:
        first, last = int(STEP_DIR.match(intact.name).group(1)) + 1, int(match.group(1))
        lost = f"step {last} is" if first == last else f"steps {first}-{last} are"
        again = "run the same command again" if mode == "auto" else "run again with trainer.resume_mode=auto"
        aside = path.parent / f"damaged-{path.name}"  # a name step_dirs skips
        message += (f" The newest intact checkpoint is {intact} ({lost} trained again): move the damaged folder "
                    f"aside (mv {path} {aside}) and {again}, which resumes from the newest checkpoint; or set "
                    f"trainer.resume_mode={intact} (that run then writes to a folder of its own).")
    raise DamagedCheckpointError(message)


SAMPLER_KEYS = {"num_rows": "training rows after filtering (data.train_files, data.max_prompt_length, "
                            "data.filter_overlong_prompts, ...)",
                "batch_size": "prompts a batch (data.gen_batch_size, else data.train_batch_size)"}


def load_trainer_state(path: Path, config: RLVRConfig, sampler: dict[str, Any] | None = None) -> dict[str, Any]:
    """The saved trainer state, after checking the run is compatible with ``config`` and, given
    this run's ``sampler`` state, that its batches continue the saved run's."""
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    saved, now = state["compatibility"], compatibility(config)
    # a key the checkpoint does not record (saved by an older rlvr) is not compared
    unread = set()
    if saved.get("trainer.v1.trainer_mode") == now["trainer.v1.trainer_mode"] == "sync":
        unread.add("trainer.v1.colocate_async.num_warmup_batches")  # older checkpoints recorded it for sync runs
    differ = [f"{k}: checkpoint {saved[k]!r}, this run {now[k]!r}" for k in now
              if k in saved and k not in unread and saved[k] != now[k]]
    saved_sampler = state.get("sampler") or {}
    differ += [f"{what}: checkpoint {saved_sampler[key]!r}, this run {sampler[key]!r}"
               for key, what in SAMPLER_KEYS.items()
               if sampler is not None and key in saved_sampler and saved_sampler[key] != sampler[key]]
    if differ:
        optim = any(".optim." in line.split(":", 1)[0] for line in differ)
        raise ConfigError(f"cannot resume from {path}: the config differs from the checkpoint's in\n  - "
                          + "\n  - ".join(differ)
                          + ("\n(the saved optimizer state carries the optimizer's lr, weight_decay and betas: a "
                             "resume would go on with the checkpoint's)" if optim else "")
                          + ("\n(the KL controller's saved value would replace the new coefficient)"
                             if any(line.startswith("algorithm.kl_ctrl.") for line in differ) else "")
                          + "\nresume with the same settings, or start a new run (trainer.resume_mode=disable: "
                          "`rlvr train` gives it a folder of its own)")
    return state
