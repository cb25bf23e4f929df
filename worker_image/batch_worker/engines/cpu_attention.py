"""Batch-chunked attention for encoders on CPU, registered through transformers' ``AttentionInterface``.

PyTorch's CPU kernel behind ``scaled_dot_product_attention`` (``_scaled_dot_product_flash_attention_for_cpu``)
runs at 50-130 GFLOP/s for MiniLM's 32-wide heads on the 2-core development machine, against 800+ for
the model's linear layers: in a profile of one chunk it took 29% of the time for 4% of the FLOPs. The
plain formulation (``baddbmm`` for scaled scores plus padding bias, ``softmax``, ``bmm``) ran it
1.5-2.1x faster at every padded length from 32 to 512 tokens (batches of 8,192 tokens, bf16;
``make bench-attention``), provided the score tensor of each step
stays cache-sized: materialising it for the whole batch (25 MB at 64 x 128 tokens) made it slower than
the fused kernel, as every step then streamed through memory and large fresh allocations page-faulted.
So rows are taken :data:`CHUNK_BYTES` of scores at a time.

Anything this path does not cover (causal or cross-length attention, grouped heads, boolean or
per-query masks, dropout, very long rows) is handed to transformers' own SDPA function unchanged.
GPUs keep SDPA, and so do float32 and emulated bf16 on CPU, where this form measured no faster (and
slower from 512 tokens): the engine selects it only for bf16 on CPUs that run bf16 natively
(:func:`batch_worker.engines.encoder.select_attention`).

Which form wins depends on the host and the sequence length: on the development VM the numbers above
did not hold a day later (1.1-1.4x at 32-64 tokens, 0.6x at 128-512 with 1 MiB of L2 per core), and on
an AMX host the fast path lost most of its margin (issue #22). So the engine registers it with an
:class:`AttentionPlan`: per power-of-two length class, the first calls rotate through SDPA and chunked
attention at two step sizes derived from this host's L2 (:func:`host_step_bytes`), and the fastest is
kept (:class:`batch_worker.engines.cpu_tuning.OnlineChoice`). Without a plan (``register()``) every
chunkable call is chunked at :data:`CHUNK_BYTES`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from batch_contract.hostinfo import cache_bytes, host_facts

from batch_worker.engines.cpu_tuning import OnlineChoice
from batch_worker.stats import THREADS_ENV

ATTENTION_NAME = "batch_worker_chunked"
"""The ``attn_implementation`` name this module registers (attention and mask functions)."""

CHUNK_BYTES = 4 << 20
"""Target size of one step's score tensor (rows x heads x length x length x itemsize), bytes, without an
:class:`AttentionPlan` or where the L2 size is unknown. 1-4 MB measured best for 32-512-token rows on
the 2-core development VM (1 MiB L2 per core); larger steps lose the cache."""

STEP_MULTIPLES = (1, 4)
"""Chunked-attention step sizes an :class:`AttentionPlan` tries, as multiples of
:func:`host_step_bytes`: one L2 per thread, and 4x that (on the development VM 4 MiB steps beat 1 MiB
ones at 32-128 tokens with 1 MiB of L2: fewer, larger ``bmm`` calls split better over the threads)."""

MIN_LENGTH_CLASS = 16
"""Smallest sequence-length class of the plan; classes are powers of two (16, 32, ..., 1024)."""

MAX_ROW_SCORE_BYTES = 32 << 20
"""Above this size of a single row's scores (12 heads x 1,182 tokens in bf16) SDPA is used: glibc
serves allocations over 32 MB with fresh mmaps (its largest dynamic mmap threshold), so each step
would page-fault its whole score tensor, and flash attention never materialises it."""


def padding_bias_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> torch.Tensor | None:
    """Mask function for :data:`ATTENTION_NAME` (transformers' ``AttentionMaskInterface`` signature).

    For a plain bidirectional (encoder) mask: ``None`` when no row has padding, else an additive bias of
    shape ``(batch, 1, 1, kv_length)`` in ``dtype``: 0 for real tokens, ``finfo(dtype).min`` for padding
    (``attention_mask`` is the boolean ``(batch, kv_length)`` padding mask, True = real token). Any other
    mask (causal, offsets, custom mask functions) is built by transformers' ``sdpa_mask`` as a 4-D
    boolean, which :func:`chunked_attention_forward` hands to SDPA.
    """
    from transformers.masking_utils import bidirectional_mask_function, sdpa_mask

    plain = mask_function is bidirectional_mask_function and not q_offset and not kv_offset
    if not plain or (attention_mask is not None and attention_mask.shape != (batch_size, kv_length)):
        return sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
            mask_function=mask_function, attention_mask=attention_mask, **kwargs,
        )
    if attention_mask is None or bool(attention_mask.all()):
        return None
    bias = torch.zeros((batch_size, 1, 1, kv_length), dtype=dtype, device=attention_mask.device)
    return bias.masked_fill_(~attention_mask.bool()[:, None, None, :], torch.finfo(dtype).min)


def _chunkable(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
               dropout: float, kwargs: dict[str, Any]) -> bool:
    """Whether :func:`chunked_attention_forward` computes this call itself (see the module docstring)."""
    batch, heads, q_len, _ = query.shape
    if query.device.type != "cpu" or dropout or getattr(module, "is_causal", False) or kwargs.get("is_causal"):
        return False
    if key.shape[1] != heads or key.shape[2] != q_len or kwargs.get("position_bias") is not None:
        return False
    if mask is not None and (mask.dtype == torch.bool or mask.shape != (batch, 1, 1, q_len)):
        return False
    return heads * q_len * q_len * query.element_size() <= MAX_ROW_SCORE_BYTES


def host_step_bytes(threads: int | None = None) -> int:
    """Base step of chunked attention on this host, bytes: the L2 size per core (sysfs, via
    :func:`batch_contract.hostinfo.host_facts`) times the intra-op threads (``threads``, else the
    runner's ``BATCH_WORKER_THREADS`` cap, which is applied after load, else ``torch.get_num_threads()``),
    so each thread's share of a step's score tensor fits its own L2; :data:`CHUNK_BYTES` where the L2
    size is unknown."""
    l2 = cache_bytes(host_facts(), 2)
    cap = os.environ.get(THREADS_ENV, "").strip()
    threads = threads or (int(cap) if cap.isdigit() and int(cap) > 0 else torch.get_num_threads()) or 1
    return int(l2 * threads) if l2 else CHUNK_BYTES


def length_class(length: int) -> int:
    """The plan's class of a padded sequence length: the next power of two, at least
    :data:`MIN_LENGTH_CLASS` (so 17-32 tokens share a choice, 33-64 the next)."""
    return max(MIN_LENGTH_CLASS, 1 << (max(length, 1) - 1).bit_length())


@dataclass
class AttentionPlan:
    """How :func:`chunked_attention_forward` picks an implementation on this host.

    Attributes:
        steps: chunked candidates, name -> step bytes (``chunked_<KiB>k``).
        choice: the per-length-class :class:`~batch_worker.engines.cpu_tuning.OnlineChoice` among
            ``sdpa`` and the ``steps`` names; its ``chosen`` (class -> name) goes into the marker.
    """

    steps: dict[str, int]
    choice: OnlineChoice = field(init=False)

    def __post_init__(self) -> None:
        self.choice = OnlineChoice(("sdpa", *self.steps))

    @classmethod
    def for_host(cls, threads: int | None = None) -> AttentionPlan:
        """The plan with :data:`STEP_MULTIPLES` x :func:`host_step_bytes` as its chunked candidates."""
        base = host_step_bytes(threads)
        return cls({f"chunked_{base * m >> 10}k": base * m for m in STEP_MULTIPLES})

    def info(self) -> dict[str, Any]:
        """Engine-info fields: ``attention_steps`` (name -> bytes) and ``attention_choice`` (the live
        length class -> chosen name dict, filled as classes are decided)."""
        return {"attention_steps": dict(self.steps), "attention_choice": self.choice.chosen}


_PLAN: AttentionPlan | None = None


def _chunked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
             scale: float, step_bytes: int) -> torch.Tensor:
    """Chunked attention of ``(batch, heads, length, head_dim)`` inputs, ``step_bytes`` of scores per
    step; returns ``(batch, length, heads, head_dim)``, contiguous."""
    batch, heads, length, head_dim = query.shape
    step = max(1, step_bytes // (heads * length * length * query.element_size()))
    out = torch.empty((batch, length, heads, head_dim), dtype=query.dtype, device=query.device)
    for start in range(0, batch, step):
        rows = slice(start, start + step)
        n = min(step, batch - start)
        q = query[rows].reshape(n * heads, length, head_dim)
        k = key[rows].reshape(n * heads, length, head_dim)
        v = value[rows].reshape(n * heads, length, head_dim)
        if attention_mask is None:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)
        else:
            bias = attention_mask[rows].expand(n, heads, 1, length).reshape(n * heads, 1, length)
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
        probs = torch.softmax(scores, dim=-1)
        out[rows] = torch.bmm(probs, v).view(n, heads, length, head_dim).transpose(1, 2)
    return out


def chunked_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for ``query``/``key``/``value`` of shape ``(batch, heads, length, head_dim)``.

    Returns ``(output, None)`` with ``output`` of shape ``(batch, length, heads, head_dim)``, contiguous,
    like transformers' SDPA function. ``attention_mask`` is :func:`padding_bias_mask`'s additive bias or
    ``None``; ``scaling`` defaults to ``head_dim ** -0.5``. Calls outside :func:`_chunkable` go to SDPA.
    With an :class:`AttentionPlan` registered, the plan's choice for the length class runs (SDPA or
    chunked at one of its step sizes); without one, chunked at :data:`CHUNK_BYTES`.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _chunkable(module, query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, length, head_dim = query.shape
    scale = scaling if scaling is not None else head_dim**-0.5
    plan = _PLAN
    if plan is None:
        return _chunked(query, key, value, attention_mask, scale, CHUNK_BYTES), None
    impls = {name: (lambda s=step: _chunked(query, key, value, attention_mask, scale, s))
             for name, step in plan.steps.items()}
    impls["sdpa"] = lambda: sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scale)[0]
    out = plan.choice.run(length_class(length), batch * heads * length * length * head_dim, impls)
    return out, None


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
           plan: AttentionPlan | None) -> torch.Tensor:
    """Bidirectional attention without transformers (the native BERT path,
    :mod:`batch_worker.engines.native_bert`): ``query``/``key``/``value`` of shape
    ``(batch, heads, length, head_dim)``, ``bias`` ``None`` or the additive padding bias
    ``(batch, 1, 1, length)`` in the inputs' dtype (:func:`padding_bias_mask`'s form). Returns
    ``(batch, length, heads, head_dim)``, contiguous. With ``plan`` the plan's choice for the length class
    runs (SDPA or chunked at one of its steps, as in :func:`chunked_attention_forward`); without one, or
    for rows too long to chunk (:data:`MAX_ROW_SCORE_BYTES`), ``torch``'s SDPA."""
    batch, heads, length, head_dim = query.shape
    scale = head_dim**-0.5

    def sdpa() -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scale)
        return out.transpose(1, 2).contiguous()

    if plan is None or heads * length * length * query.element_size() > MAX_ROW_SCORE_BYTES:
        return sdpa()
    impls = {name: (lambda s=step: _chunked(query, key, value, bias, scale, s)) for name, step in plan.steps.items()}
    impls["sdpa"] = sdpa
    return plan.choice.run(length_class(length), batch * heads * length * length * head_dim, impls)


def register(plan: AttentionPlan | None = None) -> str:
    """Register :data:`ATTENTION_NAME` with transformers (idempotent) and make ``plan`` the process's
    plan (``None``: always chunked at :data:`CHUNK_BYTES`); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    global _PLAN
    _PLAN = plan
    AttentionInterface.register(ATTENTION_NAME, chunked_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, padding_bias_mask)
    return ATTENTION_NAME
