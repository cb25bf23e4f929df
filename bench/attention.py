"""CPU fast-path micro-benchmark: the encoder's attention and linear kernels against stock PyTorch.

Shapes are all-MiniLM-L6-v2's (hidden 384, 12 heads of 32, feed-forward 1536) in batches of one CPU
token budget (``AUTO_TOKEN_BUDGET['cpu']`` = 8,192 tokens: 256 rows of 32 tokens ... 16 rows of 512),
in bfloat16 where the CPU runs it natively, else float32. In one process, interleaved, best of
``--repeats`` per contender:

* attention: transformers' SDPA function (PyTorch's fused CPU kernel) vs
  :func:`batch_worker.engines.cpu_attention.chunked_attention_forward`, with a padding bias on all but
  the first row, per padded length;
* linear: ``F.linear`` (+ ``F.gelu`` for the feed-forward input) vs
  :class:`batch_worker.engines.cpu_linear.PackedLinear`, per layer shape.

The last line printed is one JSON object: ``attention_speedup`` and ``linear_speedup`` (baseline time /
fast-path time, per shape), their minima, ``dtype`` and ``cpu_cores``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "worker_image")]

import hostbench  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from batch_contract.engine_config import AUTO_TOKEN_BUDGET  # noqa: E402
from batch_worker.engines import cpu_attention, cpu_linear  # noqa: E402
from batch_worker.engines.encoder import cpu_supports_bf16  # noqa: E402
from torch import nn  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import bidirectional_mask_function  # noqa: E402

HIDDEN, HEADS, FFN = 384, 12, 1536
LENGTHS = (32, 64, 128, 256, 512)


def best_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time (ms) of each callable over ``repeats`` interleaved rounds, after one warm-up call."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


def attention_case(length: int, dtype: torch.dtype, repeats: int) -> float:
    """SDPA time / chunked time for one padded length."""
    rows = max(1, AUTO_TOKEN_BUDGET["cpu"] // length)
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(rows, HEADS, length, HIDDEN // HEADS, generator=gen).to(dtype) for _ in range(3))
    real = torch.ones(rows, length, dtype=torch.bool)
    real[1:, -(length // 8) :] = False
    bias = cpu_attention.padding_bias_mask(rows, length, length, mask_function=bidirectional_mask_function,
                                           attention_mask=real, dtype=dtype)
    module = nn.Module()
    with torch.inference_mode():
        t = best_ms({"sdpa": lambda: sdpa_attention_forward(module, q, k, v, bias),
                     "chunked": lambda: cpu_attention.chunked_attention_forward(module, q, k, v, bias)}, repeats)
    print(f"attention {rows} x {length}: sdpa {t['sdpa']:.2f} ms, chunked {t['chunked']:.2f} ms", file=sys.stderr)
    return t["sdpa"] / t["chunked"]


def linear_case(n_in: int, n_out: int, gelu: bool, dtype: torch.dtype, repeats: int) -> float:
    """``F.linear`` (+GELU) time / :class:`PackedLinear` time for one layer shape."""
    torch.manual_seed(n_in + n_out)
    layer = nn.Linear(n_in, n_out).to(dtype)
    packed = cpu_linear.PackedLinear(layer, "gelu" if gelu else "none")
    x = torch.randn(AUTO_TOKEN_BUDGET["cpu"], n_in).to(dtype)
    act = F.gelu if gelu else (lambda y: y)
    with torch.inference_mode():
        t = best_ms({"linear": lambda: act(F.linear(x, layer.weight, layer.bias)), "packed": lambda: packed(x)}, repeats)
    print(f"linear {n_in}->{n_out}{' +gelu' if gelu else ''}: {t['linear']:.2f} ms, packed {t['packed']:.2f} ms",
          file=sys.stderr)
    return t["linear"] / t["packed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    hostbench.start()
    dtype = torch.bfloat16 if cpu_supports_bf16() else torch.float32
    if not cpu_linear.fast_linear_supported(dtype):
        raise SystemExit(f"packed oneDNN linear is not supported here in {dtype}")
    attention = {str(n): round(attention_case(n, dtype, args.repeats), 3) for n in LENGTHS}
    linear = {
        f"{i}->{o}{'+gelu' if g else ''}": round(linear_case(i, o, g, dtype, args.repeats), 3)
        for i, o, g in ((HIDDEN, HIDDEN, False), (HIDDEN, FFN, True), (FFN, HIDDEN, False))
    }
    print(json.dumps({
        "dtype": str(dtype).removeprefix("torch."),
        "tokens_per_batch": AUTO_TOKEN_BUDGET["cpu"],
        "attention_speedup": attention,
        "attention_speedup_min": min(attention.values()),
        "linear_speedup": linear,
        "linear_speedup_min": min(linear.values()),
        "cpu_cores": os.cpu_count(),
        "host": hostbench.finish(),
    }))


if __name__ == "__main__":
    main()
