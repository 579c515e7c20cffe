"""Where step metrics go; ``trainer.logger`` lists any of:

- ``console``: one compact line per step (through tqdm, so the progress bar stays at the bottom);
- ``jsonl``: ``metrics.jsonl`` in the run directory, one record per step (``rlvr plot`` reads it);
- ``tensorboard``: event files in ``<run_dir>/tensorboard`` (``tensorboard --logdir runs``);
- ``wandb``: Weights & Biases under ``<run_dir>/wandb``. Online when wandb finds an API key
  where it looks for one (``WANDB_API_KEY``, the netrc entry ``wandb login`` writes, wandb's
  settings file); with none, or with ``WANDB_MODE=offline``, an offline run for ``wandb sync``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from tqdm import tqdm

from rlvr.config.validate import LOGGER_BACKENDS  # the config checks them at load; Tracking again, for direct use
from rlvr.trainer.checkpoint import replace_text

# (metric, label, format) shown on the console line, in order, when present
CONSOLE_FIELDS = (
    ("critic/score/mean", "reward", "{:.3f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/kl_loss", "kl", "{:.5f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/grad_norm", "grad", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("timing_s/step", "step_s", "{:.1f}"),
)

# (metric, label): counts of what went wrong, on the console line when not zero
WARNING_FIELDS = (
    ("reward/num_invalid", "invalid rewards"),
    ("reward/num_errors", "reward errors"),
    ("reward/num_timeouts", "reward timeouts"),
    ("training/dropped_groups", "dropped groups"),
    ("training/zero_variance_groups", "groups without signal"),
    ("actor/grad_norm_nonfinite", "skipped steps"),
    ("rollout/server_retries", "server retries"),
    ("val-aux/reward/num_invalid", "invalid validation rewards"),
    ("val-aux/reward/num_errors", "validation reward errors"),
    ("val-aux/reward/num_timeouts", "validation reward timeouts"),
)


class Tracking:
    def __init__(self, backends: list[str], run_dir: str | Path | None, progress_bar: bool = True,
                 project: str = "rlvr", experiment: str = "run", config: dict | None = None):
        unknown = [b for b in backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown backends {unknown}; choose from {list(LOGGER_BACKENDS)}")
        self.backends = list(backends)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.progress_bar = progress_bar
        self._jsonl = self._tensorboard = self._wandb = None
        self._wandb_args = (self.run_dir or Path("."), project, experiment, config)
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if "jsonl" in self.backends and self.run_dir is not None:
            self._jsonl = open(self.run_dir / "metrics.jsonl", "a")
        if "tensorboard" in self.backends:
            self._tensorboard = self._summary_writer()

    def _summary_writer(self, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str((self.run_dir or Path(".")) / "tensorboard"), purge_step=purge_step)

    def _wandb_run(self, rewind_to: int | None = None):
        """The W&B run, started on first use (so a resumed run can start as a rewind)."""
        if self._wandb is None and "wandb" in self.backends:
            self._wandb = _start_wandb(*self._wandb_args, rewind_to=rewind_to)
        return self._wandb

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._jsonl is not None:
            record = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tensorboard is not None:
            for key, value in metrics.items():
                self._tensorboard.add_scalar(key, float(value), step)
            self._tensorboard.flush()
        if self._wandb_run() is not None:
            self._wandb.log({k: float(v) for k, v in metrics.items()}, step=step)
        if "console" in self.backends:
            tqdm.write(console_line(metrics, step))

    def rewind(self, step: int) -> None:
        """Drop records after ``step`` in every backend (a resumed run logs those steps again):
        the jsonl file is rewritten, TensorBoard purges later events, W&B rewinds the run."""
        if self._jsonl is not None:
            self._jsonl.close()
            path = self.run_dir / "metrics.jsonl"
            replace_text(path, "".join(line + "\n" for line in read_records(path, upto=step)))
            self._jsonl = open(path, "a")
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = self._summary_writer(purge_step=step + 1)
        if "wandb" in self.backends and self._wandb is None:
            self._wandb_run(rewind_to=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_records(path: Path, upto: int | None = None) -> list[str]:
    """The lines of a metrics.jsonl (those with step <= ``upto``). A torn last line (the
    process was killed mid-write) is dropped; a damaged line before it is an error."""
    lines = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    kept = []
    for i, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # torn by a kill mid-write: that step is logged again after the resume
            raise ValueError(f"{path}, line {number}: not a JSON record ({line[:80]!r}); fix or delete the line") from None
        if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}, line {number}: not a metrics record (a JSON object with an integer 'step'): "
                             f"{line[:80]!r}; fix or delete the line")
        if upto is None or record["step"] <= upto:
            kept.append(line)
    return kept


WANDB_ID_FILE = "wandb_run_id.txt"


def _start_wandb(run_dir: Path, project: str, experiment: str, config: dict | None, rewind_to: int | None = None):
    """A new W&B run (its id kept in the run directory), or, resuming at step ``rewind_to``, the
    saved run rewound to that step. W&B rewinds only on its server: an offline run cannot be
    rewound, so a resumed offline run starts a new offline run (said on the console)."""
    import os

    try:
        import wandb
    except ImportError:
        raise ValueError("trainer.logger includes wandb but the wandb package is not installed: "
                         "pip install 'rlvr[wandb]' (or drop wandb from trainer.logger)") from None
    kwargs: dict = {}
    offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun")
    if "WANDB_MODE" not in os.environ and wandb_credentials() is None:
        # wandb.init would stop to ask for a key (or fail without a terminal): an offline run instead
        tqdm.write("[rlvr] W&B: no API key found (WANDB_API_KEY, `wandb login`'s netrc entry, wandb's settings): "
                   f"writing an offline run under {run_dir / 'wandb'} (`wandb sync` uploads it)")
        kwargs["mode"], offline = "offline", True
    (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
    id_file = run_dir / WANDB_ID_FILE
    if rewind_to is not None and id_file.exists():
        if offline:
            tqdm.write(f"[rlvr] W&B: an offline run cannot be rewound; steps after {rewind_to} continue in a new "
                       f"offline run (the earlier one, {id_file.read_text().strip()}, keeps its records)")
        else:
            kwargs["resume_from"] = f"{id_file.read_text().strip()}?_step={rewind_to}"
    run = wandb.init(project=project, name=experiment, dir=str(run_dir), config=config or {},
                     settings=wandb.Settings(silent=True, console="off"), **kwargs)
    id_file.write_text(run.id)
    return run


def wandb_credentials() -> str | None:
    """Where wandb will find an API key, looked up in wandb's own order, or None: the
    ``WANDB_API_KEY`` (or ``WANDB_IDENTITY_TOKEN_FILE``) variable, the netrc entry of the W&B host
    (``$NETRC``, ``~/.netrc``, ``~/_netrc``; ``wandb login`` writes it), the ``api_key`` of wandb's
    settings files (``$WANDB_CONFIG_DIR/settings`` or ``~/.config/wandb/settings``, then
    ``./wandb/settings``). The host is ``WANDB_BASE_URL``, the settings' ``base_url``, or api.wandb.ai."""
    import configparser
    import netrc
    import os
    from urllib.parse import urlsplit

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
    settings: dict[str, str] = {}
    for path in (config_dir / "settings", Path("wandb") / "settings"):  # the workspace file wins
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        if parser.has_section("default"):
            settings.update(parser["default"])
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or settings.get("base_url") or "https://api.wandb.ai").netloc
    candidates = [Path(os.environ["NETRC"]).expanduser()] if os.environ.get("NETRC") else \
        [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    path = next((c for c in candidates if c.is_file()), None)
    if path is not None and host:
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            entry = None
        if entry and entry[2]:
            return str(path)
    if settings.get("api_key"):
        return "wandb settings"
    return None


def _plain(value):
    value = float(value)
    return value if math.isfinite(value) else str(value)


def console_line(metrics: dict[str, float], step: int) -> str:
    """``step 3 | reward 0.412 | ... | val acc 0.53`` from the metrics present."""
    parts = [f"step {step}"]
    for key, label, fmt in CONSOLE_FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    for key, label in WARNING_FIELDS:  # what went wrong this step: shown only when it happened
        if metrics.get(key):
            parts.append(f"{label} {metrics[key]:g}")
    for key, value in sorted(metrics.items()):
        if key.startswith("val-core/"):
            parts.append(f"{key.removeprefix('val-core/')} {value:.3f}")
    return " | ".join(parts)
