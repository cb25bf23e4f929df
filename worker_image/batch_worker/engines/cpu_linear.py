"""Prepacked oneDNN linear layers for encoders on CPU, with the feed-forward GELU fused in.

On CPU a plain ``nn.Linear`` re-lays out its weight for oneDNN on every call, writes the bias into the
output before the matmul, and BERT's feed-forward then runs GELU as a separate pass over a
``(tokens, 4 x hidden)`` tensor. PyTorch ships the kernels that avoid all three, the ones its own
compiler (``torch.compile`` with inductor's ``freezing``) emits for CPU: ``mkldnn._reorder_linear_weight``
packs a weight once, and ``mkldnn._linear_pointwise`` runs the matmul with bias and activation fused.
Calling them directly gets that speed without a compile step (about 20 s per process on the
development machine). Measured there, 8,192 bf16 tokens of MiniLM: the 384->1536 linear + GELU
15-31 ms -> 11 ms; the 1536->384 and 384->384 linears 15-20% faster (``make bench-attention``).

These ops are private to PyTorch (``torch.ops.mkldnn``), so :func:`fast_linear_supported` probes them
against ``F.linear`` at load and the engine keeps the model as it is if the probe fails.

Whether packing pays depends on the host and the layer shape: a day later on the same development VM
the 384->384 linear ran at 0.83x ``F.linear`` packed while the feed-forward ones ran 1.2x. With an
:class:`~batch_worker.engines.cpu_tuning.OnlineChoice` (the engine passes one), each layer becomes a
:class:`TunedLinear` that keeps both forms and, per layer shape, uses the faster one measured on the
first forward passes.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from batch_worker.engines.cpu_tuning import OnlineChoice

log = logging.getLogger(__name__)

PACK_BATCH_HINT = 8192
"""Rows (tokens) per call that the weight layout is packed for: the CPU token budget
(``AUTO_TOKEN_BUDGET['cpu']``). Other sizes still run correctly (measured the same speed at 256-25,600)."""

PROBE_TOLERANCE = 0.05
"""Max abs difference, relative to the output's max abs value, that the probe accepts between the fused
op and ``F.linear`` (+ GELU) on random inputs: bf16 rounding is about 0.008 relative."""


class PackedLinear(nn.Module):
    """``y = act(x @ W.T + b)`` with ``W`` prepacked for oneDNN; ``act`` is ``none`` or ``gelu``.

    Args:
        linear: the layer to replace (its weight is packed, its bias kept as is).
        activation: ``none``, ``gelu`` (exact, erf) or ``gelu_tanh``.

    Input ``(..., in_features)`` and output ``(..., out_features)`` in the layer's dtype (bf16 or fp32).
    ``weight`` keeps the dtype and nominal shape ``(out_features, in_features)`` for code that inspects
    them, but holds oneDNN's packed layout: its values are not ``W``.
    """

    def __init__(self, linear: nn.Linear, activation: str = "none") -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.attr, self.algorithm = {"none": ("none", ""), "gelu": ("gelu", "none"),
                                     "gelu_tanh": ("gelu", "tanh")}[activation]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_BATCH_HINT)
        self.register_buffer("weight", packed, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.attr, [], self.algorithm)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, activation={self.attr}"


class TunedLinear(PackedLinear):
    """A :class:`PackedLinear` that also keeps the plain weight and, per layer shape
    ``(in_features, out_features, activation)``, runs whichever of the packed op and ``F.linear`` (+GELU)
    ``choice`` found faster on this host (:class:`~batch_worker.engines.cpu_tuning.OnlineChoice`,
    shared by all layers of a model). Once the shape is decided the unused weight is dropped.

    Args:
        linear: the layer to replace.
        activation: as :class:`PackedLinear`.
        choice: the model's shared choice among ``packed`` and ``stock``.
    """

    CANDIDATES = ("packed", "stock")

    def __init__(self, linear: nn.Linear, activation: str, choice: OnlineChoice) -> None:
        super().__init__(linear, activation)
        self.activation = activation
        self.choice = choice
        self.key = f"{self.in_features}x{self.out_features}{'' if activation == 'none' else '+' + activation}"
        self.register_buffer("stock_weight", linear.weight.detach(), persistent=False)

    def _stock(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.stock_weight, self.bias)
        if self.activation == "none":
            return y
        return F.gelu(y, approximate="tanh" if self.activation == "gelu_tanh" else "none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name, timed = self.choice.next(self.key)
        if not timed and self.stock_weight is not None and name == "packed":
            self.stock_weight = None  # decided: free the form this host does not use
        elif not timed and self.weight is not None and name == "stock":
            self.weight = None
        if not timed:
            return super().forward(x) if name == "packed" else self._stock(x)
        work = x.numel() // self.in_features * self.in_features * self.out_features
        return self.choice.run(self.key, work, {"packed": lambda: super(TunedLinear, self).forward(x),
                                                "stock": lambda: self._stock(x)})


def fast_linear_supported(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build runs :class:`PackedLinear` in ``dtype`` and matches ``F.linear`` (+GELU)
    within :data:`PROBE_TOLERANCE`. Never raises: any error means unsupported (logged)."""
    if dtype not in (torch.bfloat16, torch.float32) or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        layer = nn.Linear(64, 96).to(dtype)
        x = torch.randn(3, 5, 64, generator=gen).to(dtype)
        with torch.inference_mode():
            for activation, ref in (("none", layer(x)), ("gelu", F.gelu(layer(x)))):
                got = PackedLinear(layer, activation)(x)
                err = (got.float() - ref.float()).abs().max() / ref.float().abs().max()
                if got.shape != ref.shape or not bool(err <= PROBE_TOLERANCE):
                    log.warning("packed oneDNN linear disagrees with F.linear (%s): not used", activation)
                    return False
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.warning("packed oneDNN linear unavailable (%s): not used", exc)
        return False
    return True


def _fusable_gelu(act: nn.Module) -> str | None:
    """``gelu``/``gelu_tanh`` when ``act`` is a GELU that oneDNN's fused op computes identically."""
    if isinstance(act, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate)
    fn = getattr(act, "act", None)
    if type(act).__name__ == "GELUActivation" and fn is F.gelu:
        return "gelu"  # transformers' exact GELU (ACT2FN["gelu"])
    if (type(act).__name__ == "GELUTanh" and getattr(fn, "func", None) is F.gelu
            and getattr(fn, "keywords", None) == {"approximate": "tanh"}):
        return "gelu_tanh"  # transformers' ACT2FN["gelu_pytorch_tanh"]
    return None


def pack_linears(model: nn.Module, choice: OnlineChoice | None = None) -> dict[str, int]:
    """Replace every ``nn.Linear`` of ``model`` (in place, on CPU) with a :class:`PackedLinear`, or a
    :class:`TunedLinear` sharing ``choice`` when one is given (``TunedLinear.CANDIDATES``).

    Where a module holds ``dense`` (a Linear) followed by a GELU ``intermediate_act_fn`` (the feed-forward
    of BERT, RoBERTa, XLM-R, ELECTRA, MPNet), the GELU is fused into the packed layer and the activation
    becomes ``nn.Identity``. Returns ``{"packed": n_linear_layers, "fused_gelu": n_fused}``.
    """
    fused = 0
    for module in list(model.modules()):
        dense, act = getattr(module, "dense", None), getattr(module, "intermediate_act_fn", None)
        kind = _fusable_gelu(act) if isinstance(dense, nn.Linear) and isinstance(act, nn.Module) else None
        if kind:
            module.dense = PackedLinear(dense, kind) if choice is None else TunedLinear(dense, kind, choice)
            module.intermediate_act_fn = nn.Identity()
            fused += 1
    packed = fused
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child) if choice is None else TunedLinear(child, "none", choice))
                packed += 1
    return {"packed": packed, "fused_gelu": fused}


def pack_for_cpu(model: nn.Module, device: str, dtype: torch.dtype,
                 choice: OnlineChoice | None = None) -> dict[str, int]:
    """:func:`pack_linears` (with ``choice``) when ``device`` is ``cpu`` and :func:`fast_linear_supported`
    (``dtype``); else the model is left alone and both counts are 0."""
    if device != "cpu" or not fast_linear_supported(dtype):
        return {"packed": 0, "fused_gelu": 0}
    return pack_linears(model, choice)
