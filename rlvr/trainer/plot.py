"""``rlvr plot RUN_DIR``: PNG curves from ``metrics.jsonl``, one file per panel plus a grid.

Panels: reward (``critic/score/mean``), validation accuracy (``val-core/*/reward/mean@1``),
response length (``response_length/mean``), KL (``actor/kl_loss``, else the KL-in-reward
penalty), entropy (``actor/entropy``) and step time (``timing_s/step``). A panel whose
metric the run never logged is drawn empty with a note, so the grid keeps its layout.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.trainer.tracking import read_records

PANELS = {
    "reward": ("training reward (mean score)", ["critic/score/mean"]),
    "val_accuracy": ("validation accuracy (greedy)", None),  # every val-core/*/reward/mean@1
    "response_length": ("response length (tokens)", ["response_length/mean"]),
    "kl": ("KL to the reference", ["actor/kl_loss", "actor/reward_kl_penalty"]),
    "entropy": ("policy entropy", ["actor/entropy"]),
    "step_time": ("time per step (s)", ["timing_s/step"]),
}


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: plot a run directory written with trainer.logger including jsonl")
    return [json.loads(line) for line in read_records(path)]  # a torn last line (killed run) is skipped


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def _draw(ax, records: list[dict], title: str, keys: list[str] | None) -> None:
    if keys is None:
        keys = sorted({k for r in records for k in r if k.startswith("val-core/") and k.endswith("/mean@1")})
    drawn = False
    for key in keys:
        steps, values = series(records, key)
        if steps:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
            drawn = True
    ax.set_title(title)
    ax.set_xlabel("step")
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``<name>.png`` per panel and ``curves.png`` (all panels) into ``out_dir`` (default RUN_DIR/plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir).expanduser()
    records = read_metrics(run_dir)
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, keys) in PANELS.items():
        fig, ax = plt.subplots(figsize=(5, 3.5))
        _draw(ax, records, title, keys)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
        written.append(out / f"{name}.png")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, keys) in zip(axes.flat, PANELS.values()):
        _draw(ax, records, title, keys)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)
    return [out / "curves.png", *written]
