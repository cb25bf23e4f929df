"""Token counters of a chunk, an attempt or a shard: one value, one list of counters.

Stdlib only (both sides import this module).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

KEY_PREFIX = "tokens_"
"""Prefix of the counters' keys in records and marker JSON (``real`` is written ``tokens_real``)."""


@dataclass(frozen=True)
class TokenCounts:
    """Tokenizer tokens processed (all counts are tokens, >= 0 as the engines report them).

    Attributes:
        real: non-pad input tokens (sum of the rows' ``n_tokens``).
        padded: input tokens processed including padding (encoder; the LLM engine reports ``real``).
        prompt / cached / output: LLM accounting: prompt tokens, those served from the prefix cache,
            generated tokens (0 for encoders).
    """

    real: int = 0
    padded: int = 0
    prompt: int = 0
    cached: int = 0
    output: int = 0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        """Counter-wise sum."""
        if not isinstance(other, TokenCounts):
            return NotImplemented
        return TokenCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def to_dict(self) -> dict[str, int]:
        """``{"tokens_real": ..., "tokens_padded": ..., "tokens_prompt": ..., "tokens_cached": ...,
        "tokens_output": ...}``: the keys records and markers hold them under."""
        return {KEY_PREFIX + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenCounts:
        """The counters under :meth:`to_dict`'s keys in ``data`` (absent keys are 0; other keys are
        ignored, so a whole marker or attempt record dict may be passed)."""
        return cls(**{f.name: data.get(KEY_PREFIX + f.name, 0) for f in fields(cls)})
