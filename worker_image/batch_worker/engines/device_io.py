"""Host <-> device plumbing of the encoder: reused (pinned) staging buffers and on-device outputs.

The field guide's rule for GPU batch inference: never block the host on the device once per batch.
Each padded batch is written into one of two reused host buffers (page-locked on CUDA, so the copy to
the device is asynchronous), copied with ``non_blocking=True``, and the pooled outputs are scattered
into one device tensor per chunk; the host waits for the device once, when the chunk's outputs are
copied back. The host therefore pads and dispatches batch ``k+1`` while the device still runs batch
``k``. A buffer is refilled only after the device finished reading it (a CUDA event per buffer).

On CPU the same code runs with ordinary tensors and no events (every operation is synchronous there),
which is how the unit tests exercise this path without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

STAGING_SLOTS = 2
"""Host buffers in rotation: the host fills one while the device reads the other."""


@dataclass
class _Slot:
    """One host staging buffer: flat int64 storage for ids, mask and row indices, and the event that
    marks the device's last read of it (``None`` on CPU or before first use)."""

    storage: Any = None
    event: Any = None
    capacity: int = 0


@dataclass
class StagedBatch:
    """A padded batch in a staging slot: numpy views to fill. Shapes: ``input_ids``/``mask`` int64
    ``(rows, width)``, ``indices`` int64 ``(rows,)``."""

    input_ids: np.ndarray
    mask: np.ndarray
    indices: np.ndarray
    slot: int


class Staging:
    """Reused host buffers for padded batches (see the module docstring).

    Args:
        torch: the ``torch`` module (passed in so this module imports without torch).
        device: ``"cuda"`` or ``"cpu"``.
    """

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.device = device
        self.pinned = device == "cuda"
        self.slots = [_Slot() for _ in range(STAGING_SLOTS)]
        self._next = 0

    def _storage(self, slot: _Slot, n: int) -> Any:
        if slot.capacity < n:
            if slot.event is not None:
                slot.event.synchronize()
            slot.storage = self.torch.empty(max(n, 2 * slot.capacity), dtype=self.torch.int64,
                                            pin_memory=self.pinned)
            slot.capacity = int(slot.storage.numel())
            slot.event = None
        elif slot.event is not None:
            slot.event.synchronize()  # the device finished copying the previous batch out of it
        return slot.storage

    def batch(self, rows: int, width: int, pad_id: int) -> StagedBatch:
        """A slot's views for a ``(rows, width)`` batch, ids filled with ``pad_id`` and mask with 0."""
        index = self._next
        self._next = (self._next + 1) % len(self.slots)
        cells = rows * width
        flat = self._storage(self.slots[index], 2 * cells + rows).numpy()
        ids = flat[:cells].reshape(rows, width)
        mask = flat[cells : 2 * cells].reshape(rows, width)
        ids.fill(pad_id)
        mask.fill(0)
        return StagedBatch(input_ids=ids, mask=mask, indices=flat[2 * cells : 2 * cells + rows], slot=index)

    def to_device(self, staged: StagedBatch) -> tuple[Any, Any, Any]:
        """``(input_ids, mask, indices)`` tensors on the device: an asynchronous copy from the pinned slot
        on CUDA (an event records when the device is done reading it), the slot's own memory on CPU."""
        torch = self.torch
        host = [torch.from_numpy(a) for a in (staged.input_ids, staged.mask, staged.indices)]
        if self.device != "cuda":
            return host[0], host[1], host[2]
        dev = [t.to(self.device, non_blocking=True) for t in host]
        event = torch.cuda.Event()
        event.record()
        self.slots[staged.slot].event = event
        return dev[0], dev[1], dev[2]


def is_out_of_memory(exc: BaseException, torch: Any) -> bool:
    """Whether ``exc`` is the device running out of memory (``torch.OutOfMemoryError``, which CUDA's
    caching allocator raises synchronously when an allocation fails)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom)


def device_uuid(torch: Any, device: str) -> str | None:
    """NVML UUID (``GPU-...``) of the CUDA device this process uses, or ``None`` (CPU, or a torch
    without device UUIDs). NVML numbers devices physically and ignores ``CUDA_VISIBLE_DEVICES``; the
    UUID names the same device in both."""
    if device != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"
