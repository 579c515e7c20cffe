"""DataProto: the one batch object that every stage of a training step passes on.

A DataProto holds three things, as in verl's protocol:

- ``batch``: a dict of tensors that all share the first (batch) dimension;
- ``non_tensor_batch``: a dict of numpy object arrays of the same length (strings,
  token-id lists, dicts: anything that is not a rectangular tensor);
- ``meta_info``: a plain dict for the whole batch (sampling settings, timings, flags).

Departures from verl: ``batch`` is a plain ``dict[str, Tensor]`` checked by
``check_consistency`` instead of a ``TensorDict``; every length mismatch names the key
and both lengths; ``union`` also refuses conflicting ``meta_info`` values.

Standard keys and shapes (bs = number of rows, P = prompt length, R = response length,
all prompt tensors left-padded, all response tensors right-padded):

=====================  ==========  ============================================================
key                    shape       meaning
=====================  ==========  ============================================================
input_ids              (bs, P+R)   prompt then response token ids (only P before rollout)
attention_mask         (bs, P+R)   1 on real tokens, 0 on padding
position_ids           (bs, P+R)   positions counted over real tokens (cumsum of the mask - 1)
prompts                (bs, P)     the left-padded prompt ids, as given to the rollout
responses              (bs, R)     sampled token ids, right-padded
response_mask          (bs, R)     1 on tokens the loss sees (0 on padding and tool output)
rollout_log_probs      (bs, R)     log-probs of the sampled tokens under the rollout engine
train_mask             (bs, R)     response_mask less what the update must not see (groups dropped for an
                                   invalid reward, tokens rollout correction rejected); absent: response_mask
rollout_is_weights     (bs, R)     rollout correction's importance weights pi_old / pi_rollout
old_log_probs          (bs, R)     log-probs under the actor before the update (PPO's pi_old)
ref_log_prob           (bs, R)     log-probs under the frozen reference policy
entropys               (bs, R)     per-token entropy of the actor's distribution
values                 (bs, R)     critic values (GAE only)
token_level_scores     (bs, R)     reward-function score on each response's last valid token
sample_scores          (bs,)       the reward functions' score before overlong shaping (DAPO's filter)
rm_scores              (bs, R)     reward-model score on the last valid token
token_level_rewards    (bs, R)     scores minus the KL penalty (when use_kl_in_reward)
advantages             (bs, R)     advantage per token, zero outside response_mask
returns                (bs, R)     return per token (advantage + value for GAE)
uid                    (bs,)       non-tensor: group id, one per prompt, shared by its n samples
episode_sample         (bs,)       non-tensor: 0 on an episode's first sample, k on its k-th split sample (an
                                   agent that rewrote its context: ``episode_rows``); absent: one sample each
raw_prompt_ids         (bs,)       non-tensor: list[int] prompt ids without padding
raw_prompt             (bs,)       non-tensor: the chat messages (when data.return_raw_chat)
data_source            (bs,)       non-tensor: selects the reward function
reward_model           (bs,)       non-tensor: dict with ``ground_truth`` (and ``style``)
extra_info             (bs,)       non-tensor: dict with ``index`` and task-specific fields
pad_token_id           -           meta_info: the pad id in a rollout's token ids (set by the engine;
                                   batches of different widths are padded with it when joined)
=====================  ==========  ============================================================
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

__all__ = ["DataProto", "DataProtoError", "concat_rollouts"]

PROMPT_RESPONSE_KEYS = ("input_ids", "attention_mask", "position_ids")  # (bs, P+R)
TOKEN_ID_KEYS = ("input_ids", "prompts", "responses")  # padded with the pad token


class DataProtoError(ValueError):
    """A DataProto operation received data it cannot combine (lengths, keys, values)."""


def _as_object_array(key: str, value: Any) -> np.ndarray:
    """Convert a list/array to a 1-D numpy object array, keeping nested lists intact."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        return value
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.astype(object)
    if isinstance(value, (list, tuple)):
        out = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):  # element-wise: np.array would split nested lists
            out[i] = item
        return out
    if isinstance(value, np.ndarray):
        raise DataProtoError(
            f"non-tensor key {key!r} must be 1-D (one entry per row), got shape {value.shape}"
        )
    raise DataProtoError(
        f"key {key!r} has type {type(value).__name__}; DataProto takes tensors, numpy arrays or lists"
    )


def _index_array(idx: Any, length: int) -> np.ndarray:
    """Turn a slice, list, bool mask or tensor of indices into a numpy int array."""
    if isinstance(idx, slice):
        return np.arange(length)[idx]
    if isinstance(idx, torch.Tensor):
        idx = idx.detach().cpu().numpy()
    idx = np.asarray(idx)
    if idx.dtype == bool:
        if idx.shape != (length,):
            raise DataProtoError(f"boolean index has shape {idx.shape}, batch has {length} rows")
        return np.nonzero(idx)[0]
    return idx.astype(np.int64).reshape(-1)


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape:
            return False
        return all(_values_equal(x, y) for x, y in zip(a, b))
    try:
        eq = a == b
        return bool(eq) if not isinstance(eq, (np.ndarray, torch.Tensor)) else bool(np.all(eq))
    except Exception:  # objects that cannot be compared are treated as different
        return False


def merge_meta_info(parts: Sequence["DataProto"]) -> dict[str, Any]:
    """The parts' ``meta_info`` merged as verl's ``concat`` does: a key set by several parts must
    have one value; ``metrics`` (a dict per worker, or a list of them) are gathered from every
    part into one dict of lists, ``{name: [value of part 0, value of part 1, ...]}``."""
    merged: dict[str, Any] = {}
    gathered: list[dict] = []
    for i, part in enumerate(parts):
        for key, value in part.meta_info.items():
            if key == "metrics":
                if value is not None:
                    gathered.extend(value if isinstance(value, list) else [value])
            elif key in merged and not _values_equal(merged[key], value):
                raise DataProtoError(f"concat: meta_info[{key!r}] is {merged[key]!r} in an earlier part but "
                                     f"{value!r} in part {i}; parts must agree on every non-metric meta_info key")
            else:
                merged.setdefault(key, value)
    if gathered:
        metrics: dict[str, list] = {}
        for entry in gathered:
            for name, value in entry.items():
                metrics.setdefault(name, []).append(value)
        merged["metrics"] = metrics
    return merged


@dataclass
class DataProto:
    """A batch of rows: tensors, non-tensor arrays and batch-wide meta information."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.batch = dict(self.batch or {})
        self.non_tensor_batch = {
            k: _as_object_array(k, v) for k, v in (self.non_tensor_batch or {}).items()
        }
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        """Build from separate tensor and non-tensor dicts."""
        for key, value in (tensors or {}).items():
            if not isinstance(value, torch.Tensor):
                raise DataProtoError(
                    f"tensors[{key!r}] is a {type(value).__name__}, not a torch.Tensor; "
                    "pass it in non_tensors instead"
                )
        return cls(batch=tensors or {}, non_tensor_batch=non_tensors or {}, meta_info=meta_info or {})

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> "DataProto":
        """Build from one dict, sorting tensors into ``batch`` and the rest into ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, non_tensors, meta_info)

    # ---------------------------------------------------------------- inspection
    def __len__(self) -> int:
        for value in self.batch.values():
            return int(value.shape[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def check_consistency(self) -> None:
        """Raise if any key's first dimension differs from the batch length."""
        lengths: dict[str, int] = {}
        for key, value in self.batch.items():
            if not isinstance(value, torch.Tensor):
                raise DataProtoError(f"batch[{key!r}] is a {type(value).__name__}, not a torch.Tensor")
            if value.dim() == 0:
                raise DataProtoError(f"batch[{key!r}] is a scalar; batch tensors need a batch dimension")
            lengths[key] = int(value.shape[0])
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim != 1:
                raise DataProtoError(f"non_tensor_batch[{key!r}] must be a 1-D numpy array")
            if key in lengths:
                raise DataProtoError(f"key {key!r} is in both batch and non_tensor_batch")
            lengths[key] = int(value.shape[0])
        if len(set(lengths.values())) > 1:
            first_key, first_len = next(iter(lengths.items()))
            for key, n in lengths.items():
                if n != first_len:
                    raise DataProtoError(
                        f"length mismatch: {key!r} has {n} rows but {first_key!r} has {first_len}"
                    )

    def keys(self) -> list[str]:
        return list(self.batch) + list(self.non_tensor_batch)

    def __contains__(self, key: str) -> bool:
        return key in self.batch or key in self.non_tensor_batch

    def require(self, *keys: str, stage: str = "this stage") -> None:
        """Raise a clear error naming the missing keys a stage needs."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise DataProtoError(
                f"{stage} needs key(s) {missing} in the DataProto; it has {sorted(self.keys())}"
            )

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in self.batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={list(self.non_tensor_batch)}, meta_info={list(self.meta_info)})"
        )

    # ---------------------------------------------------------------- selection
    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A new DataProto with only the named keys (None keeps all of that kind)."""
        batch = self._pick(self.batch, batch_keys, "batch")
        non_tensor = self._pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = self._pick(self.meta_info, meta_info_keys, "meta_info")
        out = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        if deepcopy:
            out = DataProto(
                batch={k: v.clone() for k, v in out.batch.items()},
                non_tensor_batch=copy.deepcopy(out.non_tensor_batch),
                meta_info=copy.deepcopy(out.meta_info),
            )
        return out

    @staticmethod
    def _pick(source: dict, keys: Sequence[str] | None, where: str) -> dict:
        if keys is None:
            return dict(source)
        missing = [k for k in keys if k not in source]
        if missing:
            raise DataProtoError(f"{where} has no key(s) {missing}; it has {sorted(source)}")
        return {k: source[k] for k in keys}

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one."""
        out = self.select(batch_keys or [], non_tensor_batch_keys or [], meta_info_keys or [])
        for key in batch_keys or []:
            del self.batch[key]
        for key in non_tensor_batch_keys or []:
            del self.non_tensor_batch[key]
        for key in meta_info_keys or []:
            del self.meta_info[key]
        return out

    def select_idxs(self, idxs: Any) -> "DataProto":
        """Rows at the given indices (list, numpy array, tensor or boolean mask)."""
        idx = _index_array(idxs, len(self))
        if idx.size and (idx.max() >= len(self) or idx.min() < -len(self)):
            raise DataProtoError(f"row index {int(idx.max())} out of range for a batch of {len(self)}")
        tidx = torch.from_numpy(idx)
        return DataProto(
            batch={k: v[tidx.to(v.device)] for k, v in self.batch.items()},
            non_tensor_batch={k: v[idx] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> "DataProto":
        """Rows ``start:end:step``; views of the tensors, no copy."""
        s = slice(start, end, step)
        return DataProto(
            batch={k: v[s] for k, v in self.batch.items()},
            non_tensor_batch={k: v[s] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def __getitem__(self, item: Any) -> Any:
        """``dp["key"]`` gives a column; ``dp[i]`` a one-row DataProto; slices and index arrays rows."""
        if isinstance(item, str):
            if item in self.batch:
                return self.batch[item]
            if item in self.non_tensor_batch:
                return self.non_tensor_batch[item]
            raise KeyError(f"DataProto has no key {item!r}; it has {sorted(self.keys())}")
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (int, np.integer)):
            n = len(self)
            if not -n <= int(item) < n:
                raise IndexError(f"row {int(item)} out of range for a batch of {n}")
            return self.select_idxs([int(item) % n])
        return self.select_idxs(item)

    # ---------------------------------------------------------------- combination
    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s keys into this one (in place, returned). Shared keys must agree."""
        if len(self) and len(other) and len(self) != len(other):
            raise DataProtoError(f"cannot union a DataProto of {len(self)} rows with one of {len(other)} rows")
        for where, mine, theirs in (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        ):
            for key, value in theirs.items():
                if key in mine and not _values_equal(mine[key], value):
                    raise DataProtoError(
                        f"union conflict on {where}[{key!r}]: both sides have the key with different "
                        "values; pop it from one side first or rename it"
                    )
            for key, value in theirs.items():
                mine.setdefault(key, value)
        self.check_consistency()
        return self

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` when interleaved, ``abab`` when not."""
        if repeat_times < 1:
            raise DataProtoError(f"repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            batch = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            batch = {k: v.repeat(repeat_times, *([1] * (v.dim() - 1))) for k, v in self.batch.items()}
            non_tensor = {k: np.tile(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive pieces of ``split_size`` rows (the last may be shorter)."""
        if split_size < 1:
            raise DataProtoError(f"split_size must be >= 1, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    def chunk(self, chunks: int) -> list["DataProto"]:
        """``chunks`` equal pieces; the batch length must divide evenly (as verl requires)."""
        if chunks < 1 or len(self) % chunks:
            raise DataProtoError(
                f"cannot chunk a batch of {len(self)} rows into {chunks} equal pieces; "
                f"the row count must be a multiple of {chunks}"
            )
        return self.split(len(self) // chunks) if len(self) else [self.slice(0, 0) for _ in range(chunks)]

    @staticmethod
    def concat(data: Iterable["DataProto"]) -> "DataProto":
        """Rows of all parts in order; keys must match. ``meta_info`` is merged as verl merges it
        (see ``merge_meta_info``): every part's keys, conflicts refused, metrics gathered."""
        parts = list(data)
        if not parts:
            raise DataProtoError("concat needs at least one DataProto")
        keys = (sorted(parts[0].batch), sorted(parts[0].non_tensor_batch))
        for i, part in enumerate(parts[1:], start=1):
            if (sorted(part.batch), sorted(part.non_tensor_batch)) != keys:
                raise DataProtoError(
                    f"concat: part {i} has keys {sorted(part.keys())} but part 0 has {sorted(parts[0].keys())}"
                )
        batch = {}
        for key in keys[0]:
            tensors = [p.batch[key] for p in parts]
            widths = {t.shape[1:] for t in tensors}
            if len(widths) > 1:
                raise DataProtoError(f"concat: {key!r} has different trailing shapes {sorted(map(tuple, widths))}")
            batch[key] = torch.cat(tensors, dim=0)
        non_tensor = {k: np.concatenate([p.non_tensor_batch[k] for p in parts]) for k in keys[1]}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=merge_meta_info(parts))

    def reorder(self, indices: Any) -> None:
        """Permute the rows in place (``indices`` must be a permutation of the rows)."""
        idx = _index_array(indices, len(self))
        if sorted(idx.tolist()) != list(range(len(self))):
            raise DataProtoError(f"reorder needs a permutation of 0..{len(self) - 1}, got {idx.tolist()[:10]}...")
        picked = self.select_idxs(idx)
        self.batch, self.non_tensor_batch = picked.batch, picked.non_tensor_batch

    def to(self, device: str | torch.device) -> "DataProto":
        """Move the tensors to ``device`` (in place, returned)."""
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    # ---------------------------------------------------------------- persistence
    def save_to_disk(self, path: str | Path) -> None:
        """Write the whole DataProto to one file (torch.save; tensors moved to CPU)."""
        payload = {
            "batch": {k: v.detach().cpu() for k, v in self.batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(path)  # a crash mid-write never leaves a truncated file under `path`

    @classmethod
    def load_from_disk(cls, path: str | Path) -> "DataProto":
        """Read a file written by ``save_to_disk`` (trusted files only: it unpickles)."""
        payload = torch.load(Path(path), weights_only=False)
        return cls(payload["batch"], payload["non_tensor_batch"], payload["meta_info"])


def concat_rollouts(parts: Sequence[DataProto], pad_id: int | None = None) -> DataProto:
    """``DataProto.concat`` of rollout batches whose prompt and response widths differ (each
    batch is padded to its own longest: generation batches, or the ranks of a worker group):
    prompts are left-padded and responses right-padded to the widest part first, following the
    standard layout above, so the result is what one batch of all the rows would have been.
    Position ids continue across response padding; masks and per-token values are 0 there.
    ``pad_id`` defaults to the parts' ``meta_info["pad_token_id"]``; it is needed only when the
    widths differ."""
    widths = [(p.batch["input_ids"].shape[1] - p.batch["responses"].shape[1], p.batch["responses"].shape[1])
              for p in parts]
    P, R = max(w[0] for w in widths), max(w[1] for w in widths)
    if pad_id is None and any(w != (P, R) for w in widths):
        pad_id = next((p.meta_info["pad_token_id"] for p in parts if p.meta_info.get("pad_token_id") is not None),
                      None)
        if pad_id is None:
            raise DataProtoError(f"rollouts of response widths {[w[1] for w in widths]} (prompt widths "
                                 f"{[w[0] for w in widths]}) cannot be joined without the pad id: the rollout "
                                 "must set meta_info['pad_token_id']")
    return DataProto.concat([_pad_rollout(part, P, R, pad_id) for part in parts])


def _pad_rollout(data: DataProto, P: int, R: int, pad_id: int) -> DataProto:
    r = data.batch["responses"].shape[1]
    p = data.batch["input_ids"].shape[1] - r
    if (p, r) == (P, R):
        return data
    batch = {}
    for key, value in data.batch.items():
        fill = pad_id if key in TOKEN_ID_KEYS else 0
        if value.dim() < 2:
            batch[key] = value
        elif key in PROMPT_RESPONSE_KEYS:
            left = torch.nn.functional.pad(value[:, :p], (P - p, 0), value=fill)
            right = torch.nn.functional.pad(value[:, p:], (0, R - r), value=fill)
            if key == "position_ids" and R > r:  # keep counting after the last response position
                right[:, r:] = value[:, -1:] + torch.arange(1, R - r + 1, device=value.device)
            batch[key] = torch.cat([left, right], dim=1)
        elif key == "prompts":
            batch[key] = torch.nn.functional.pad(value, (P - p, 0), value=fill)
        else:  # (bs, R) response-shaped
            batch[key] = torch.nn.functional.pad(value, (0, R - r), value=fill)
    return DataProto(batch=batch, non_tensor_batch=dict(data.non_tensor_batch), meta_info=dict(data.meta_info))


def loss_mask(data: DataProto) -> torch.Tensor:
    """The tokens that carry loss: ``train_mask`` where the trainer wrote one (the response's
    model tokens less the groups it dropped and the tokens rollout correction rejected), else
    ``response_mask``."""
    return data.batch["train_mask"] if "train_mask" in data.batch else data.batch["response_mask"]


# ---------------------------------------------------------------- split episodes
EPISODE_SAMPLE = "episode_sample"


def episode_rows(data: DataProto) -> np.ndarray | None:
    """(bs,) the episode (the row of the batch the rollout was sent) of each sample, or None when
    every episode is one sample. An agent whose calls stop extending each other (it rewrote its
    context) gives several samples for one episode, contiguous and in order (``episode_sample``
    0, 1, ...)."""
    column = data.non_tensor_batch.get(EPISODE_SAMPLE)
    if column is None:
        return None
    first = np.asarray(column, dtype=np.int64) == 0
    if first.all():
        return None
    if len(first) and not first[0]:
        raise DataProtoError(f"{EPISODE_SAMPLE}: the first row is an episode's sample {column[0]}, not its first (0)")
    return np.cumsum(first) - 1


def final_samples(data: DataProto) -> np.ndarray:
    """(bs,) bool: each episode's last sample (its final context: what a reward function scores)."""
    rows = episode_rows(data)
    if rows is None:
        return np.ones(len(data), dtype=bool)
    return np.append(rows[1:] != rows[:-1], True)


def expand_to_samples(batch: DataProto, samples: DataProto) -> DataProto:
    """``batch`` (one row per episode) with each row repeated for each of its episode's samples in
    ``samples``, so the two can be joined (``union``)."""
    rows = episode_rows(samples)
    if rows is None:
        return batch
    if rows[-1] + 1 != len(batch):
        raise DataProtoError(f"the rollout returned samples of {rows[-1] + 1} episodes for a batch of {len(batch)} rows")
    return batch.select_idxs(rows)
