"""A KV cache that writes into preallocated buffers instead of concatenating.

transformers' ``DynamicLayer`` grows with ``torch.cat`` at every decode step, copying the
whole cache each time: on a CPU that copy took 40% of a decode step for 64 rows of
SmolLM2-135M. Here each layer owns a (B, H, capacity, D) buffer; a step writes its new
key/value in place and hands attention a view of the filled part. Dropping finished rows
moves only the rows that fill their slots (see ``batch_select_indices``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's cache with room for ``capacity`` positions."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = key_states.new_empty(b, h, self.capacity, d)
        self._v = value_states.new_empty(b, value_states.shape[1], self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({self.length} + {n})")
        self._k[:, :, self.length:self.length + n] = key_states
        self._v[:, :, self.length:self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def restore(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Start from (B, H, capacity, D) buffers whose first ``length`` positions are filled (a
        conversation's earlier turns, kept by the engine)."""
        self._k, self._v, self.length = keys, values, length
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep (or repeat) rows ``indices``.

        When rows only leave — each row ``i`` of the result is row ``i`` or a row beyond the
        result's end (the engine fills a finished row's slot with a row from the end) — the
        few rows that move are copied in place and the buffer is viewed shorter. Otherwise
        the filled positions of the selected rows are gathered into a new buffer.
        """
        if not self.is_initialized:
            return
        m = len(indices)
        moved = (indices != torch.arange(m, device=indices.device)).nonzero().squeeze(-1)
        if m <= self._k.shape[0] and bool((indices[moved] >= m).all()):
            if len(moved):
                src = indices[moved]
                self._k[moved, :, : self.length] = self._k[src, :, : self.length]
                self._v[moved, :, : self.length] = self._v[src, :, : self.length]
            self._k, self._v = self._k[:m], self._v[:m]
        else:
            k = self._k.new_empty(m, *self._k.shape[1:])
            v = self._v.new_empty(m, *self._v.shape[1:])
            k[:, :, : self.length] = self._k[indices, :, : self.length]
            v[:, :, : self.length] = self._v[indices, :, : self.length]
            self._k, self._v = k, v
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self._k.shape[0]).repeat_interleave(repeats))

    def reset(self) -> None:
        self.length, self._k, self._v = 0, None, None
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._views()


class RowsView(PreallocatedLayer):
    """Rows [lo, hi) of ``whole``'s buffers, which hold ``rows`` rows: a forward over those rows
    writes into them. The first write allocates ``whole``'s buffers if nothing has (their head
    count, head size and dtype are the model's keys' and values', known only then)."""

    def __init__(self, whole: PreallocatedLayer, lo: int, hi: int, rows: int):
        super().__init__(whole.capacity)
        self.whole, self.lo, self.hi, self.rows = whole, lo, hi, rows
        if whole.is_initialized:
            self.restore(whole._k[lo:hi], whole._v[lo:hi], whole.length)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        whole, (_, h, _, d), (_, hv, _, dv) = self.whole, key_states.shape, value_states.shape
        whole.restore(key_states.new_empty(self.rows, h, whole.capacity, d),
                      value_states.new_empty(self.rows, hv, whole.capacity, dv), 0)
        self.restore(whole._k[self.lo:self.hi], whole._v[self.lo:self.hi], 0)


def row_chunks(cache: Cache, rows: int, step: int):
    """(lo, hi, a cache over rows [lo, hi) of ``cache``) for consecutive chunks of ``step`` rows;
    ``cache`` itself when one chunk takes every row or its layers are not ``PreallocatedLayer``.
    Call ``advance(cache, n)`` after forwards of ``n`` tokens over every chunk."""
    if step >= rows or not all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
        yield 0, rows, cache
        return
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        yield lo, hi, Cache(layers=[RowsView(layer, lo, hi, rows) for layer in cache.layers])


def advance(cache: Cache, n: int) -> None:
    """Count ``n`` more filled positions in every layer, written through ``row_chunks`` views."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer) and layer.is_initialized:
            layer.length += n
            layer._views()


def supports_preallocated(config) -> bool:
    """Plain full-attention decoders only; sliding-window or hybrid models keep transformers' cache."""
    layer_types = getattr(config, "layer_types", None)
    no_sliding = getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)
    return (layer_types is None or set(layer_types) == {"full_attention"}) and no_sliding


def make_cache(config, capacity: int) -> Cache:
    if supports_preallocated(config):
        return Cache(layers=[PreallocatedLayer(capacity) for _ in range(config.num_hidden_layers)])
    return DynamicCache(config=config)
