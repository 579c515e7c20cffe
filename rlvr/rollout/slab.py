"""The engine core's KV cache: one slab of rows that requests join and leave between decode steps.

Every running row has a slot (a batch row) in per-layer buffers of shape (R, H, C, D). All rows
share the column count ``length`` (a decode step writes one column for every row, as
``PreallocatedLayer`` does), and each row's own context is where its key mask is 1:

    row 0  . . a a a a a a      a row admitted early: its prompt, then its tokens
    row 1  . . . . . b b b      a row admitted later, right-aligned to the current length
           ^ holes (mask 0): attention gives them weight 0

Admitting rows writes their prefilled keys and values into free slots, right-aligned at the
current length (the running rows move right first when a new prompt is longer). Finished rows
leave as in the batch engine (the few rows beyond the running count move into their slots).
When a decode step would pass the last column, ``make_room`` right-aligns every row's own
columns (dropping the holes), and grows the buffers only if that is not enough. A paged cache
(vLLM's blocks) would avoid those copies but needs an attention kernel that reads pages; on a
CPU, SDPA over one dense buffer is the fast path, and the copies are rare (amortised by growing
to twice what is needed).

Models whose cache is not ``PreallocatedLayer`` (sliding windows, hybrids) do not use the slab:
the core admits their requests only when nothing runs (batches, as before).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from rlvr.rollout.kv_cache import PreallocatedLayer


class Slab:
    """Per-layer (R, H, C, D) key and value buffers, ``rows`` of them running, ``length`` columns
    filled; ``cache`` is the transformers ``Cache`` a forward writes into (views of the running
    rows)."""

    def __init__(self, num_layers: int):
        self.layers = [PreallocatedLayer(0) for _ in range(num_layers)]
        self.cache = Cache(layers=self.layers)
        self.base_k: list[torch.Tensor] = []
        self.base_v: list[torch.Tensor] = []
        self.rows = 0
        self.length = 0

    @property
    def row_capacity(self) -> int:
        return self.base_k[0].shape[0] if self.base_k else 0

    @property
    def capacity(self) -> int:
        return self.base_k[0].shape[2] if self.base_k else 0

    def _views(self) -> None:
        for layer, k, v in zip(self.layers, self.base_k, self.base_v):
            layer._k, layer._v = k[:self.rows], v[:self.rows]
            layer.capacity, layer.length = k.shape[2], self.length
            layer.dtype, layer.device, layer.is_initialized = k.dtype, k.device, True
            layer._views()

    def sync_length(self) -> None:
        """Read back the column count after a forward wrote into the layers."""
        self.length = self.layers[0].length

    def _reallocate(self, rows: int, columns: int, like_k: list[torch.Tensor], like_v: list[torch.Tensor]) -> None:
        """New buffers of (rows, H, columns, D); the running rows' filled columns copied over."""
        new_k = [k.new_zeros(rows, k.shape[1], columns, k.shape[-1]) for k in like_k]
        new_v = [v.new_zeros(rows, v.shape[1], columns, v.shape[-1]) for v in like_v]
        if self.base_k and self.rows:
            n = min(self.length, columns)
            for dst, src in zip(new_k + new_v, self.base_k + self.base_v):
                dst[:self.rows, :, :n] = src[:self.rows, :, :n]
        self.base_k, self.base_v = new_k, new_v

    def admit(self, keys: list[torch.Tensor], values: list[torch.Tensor], source_rows: torch.Tensor,
              source_mask: torch.Tensor, running_mask: torch.Tensor, max_rows: int,
              columns_ahead: int) -> torch.Tensor:
        """Give slots to ``len(source_rows)`` new rows, row i copying row ``source_rows[i]`` of the
        prefilled ``keys``/``values`` ((U, H, P, D) per layer, key mask ``source_mask`` (U, P)).
        ``running_mask`` is the running rows' (rows, length) key mask; ``columns_ahead`` the
        columns still to be written (the longest budget left). -> the key mask of all rows."""
        b, P = len(source_rows), source_mask.shape[1]
        if self.rows and max(self.length, P) + columns_ahead > self.capacity:
            # drop the holes before growing: under steady traffic rows always run and the shared
            # column count only grows (growing alone took a server to 24 GB)
            running_mask = self.make_room(running_mask, columns_ahead)
        if self.rows and P > self.length:  # a longer prompt: the running rows move right
            running_mask = self.shift_right(P - self.length, running_mask)
        L = max(self.length, P) if self.rows else P
        need_rows, need_cols = self.rows + b, L + columns_ahead
        if need_rows > self.row_capacity or need_cols > self.capacity:
            # rows grow by doubling (up to max_rows) while others run; the first rows get their count
            rows = need_rows if not self.rows else max(need_rows, min(max_rows, 2 * self.row_capacity))
            self._reallocate(rows, max(need_cols, self.capacity), keys, values)
        idx = source_rows.to(keys[0].device)
        for base, src in zip(self.base_k + self.base_v, keys + values):
            base[self.rows:self.rows + b, :, L - P:L] = src[idx, :, :P]
            if L > P:  # holes stay finite: a masked key still meets a 0 weight in attention
                base[self.rows:self.rows + b, :, :L - P] = 0
        new_mask = torch.cat([source_mask.new_zeros(b, L - P), source_mask[source_rows.to(source_mask.device)]], dim=1)
        mask = torch.cat([running_mask, new_mask], dim=0) if self.rows else new_mask
        self.rows, self.length = need_rows, L
        self._views()
        return mask

    def shift_right(self, d: int, mask: torch.Tensor) -> torch.Tensor:
        """Move the running rows' columns ``d`` to the right (holes on the left) -> their new mask."""
        if self.length + d > self.capacity:
            self._reallocate(self.row_capacity, self.length + d, self.base_k, self.base_v)
        for base in self.base_k + self.base_v:
            base[:self.rows, :, d:d + self.length] = base[:self.rows, :, :self.length].clone()
            base[:self.rows, :, :d] = 0
        self.length += d
        self._views()
        return torch.cat([mask.new_zeros(self.rows, d), mask], dim=1)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep running rows ``rows`` (the engine's ``fill_finished_slots``: each row i of the
        result is row i or one beyond the result's end), moving only the rows that fill holes."""
        m = len(rows)
        moved = (rows != torch.arange(m, device=rows.device)).nonzero().squeeze(-1)
        if len(moved):
            src = rows[moved]
            for base in self.base_k + self.base_v:
                base[moved, :, :self.length] = base[src, :, :self.length]
        self.rows = m
        if m == 0:
            self.length = 0
        self._views()

    def make_room(self, mask: torch.Tensor, columns_ahead: int) -> torch.Tensor:
        """Before a decode step that would pass the last column: right-align every row's own
        columns (holes dropped) and grow if that is not enough -> the new key mask."""
        counts = mask.sum(dim=1)  # (rows,)
        L = int(counts.max())
        columns = max(self.capacity, L + 2 * columns_ahead)  # slack: the next compaction is columns_ahead steps away at least
        # each row's own columns in order, right-aligned at L: gather index (rows, L)
        order = torch.argsort(mask, dim=1, stable=True)  # holes (0) first, then own columns, in order
        index = order[:, -L:] if L else order[:, :0]
        new_mask = torch.gather(mask, 1, index)
        idx = index.to(self.base_k[0].device)
        keep = new_mask.to(idx.device)[:, None, :, None]
        bases = []
        for base in self.base_k + self.base_v:
            H, D = base.shape[1], base.shape[-1]
            gathered = torch.gather(base[:self.rows, :, :self.length], 2, idx[:, None, :, None].expand(self.rows, H, L, D))
            target = base if columns <= base.shape[2] else base.new_zeros(base.shape[0], H, columns, D)
            target[:self.rows, :, :L] = gathered * keep.to(base.dtype)  # holes read as 0
            bases.append(target)
        n = len(self.base_k)
        self.base_k, self.base_v = bases[:n], bases[n:]
        self.length = L
        self._views()
        return new_mask

    def row_context(self, row: int, mask_row: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One row's own keys and values, (H, n, D) per layer (a kept turn)."""
        columns = mask_row.bool().to(self.base_k[0].device)
        return ([k[row, :, :self.length][:, columns] for k in self.base_k],
                [v[row, :, :self.length][:, columns] for v in self.base_v])

    def release(self) -> None:
        self.base_k, self.base_v, self.rows, self.length = [], [], 0, 0
        for layer in self.layers:
            layer.reset()
