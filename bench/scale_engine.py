"""The engine ``bench/scale.py`` runs shards with: the real encoder engine (its model directory, model
digest and resolved settings, so the result fingerprint and the marker are what a real run writes) that
never loads its model and answers each row with a label and a score computed from the text.

Not shipped: a benchmark's stand-in for the model, so that 40M rows fit the disk and the time of a
development machine while every other part of the worker (reader, validation, writer, ledger, attempt
records, progress, marker) is the real one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from batch_contract.schemas import part_schema
from batch_contract.tokens import TokenCounts
from batch_worker.engines.base import ChunkOutput, ChunkRows, LoadedModel
from batch_worker.engines.encoder import EncoderEngine

LABELS = ("negative", "neutral", "positive")


class BenchEngine(EncoderEngine):
    """:class:`EncoderEngine` with ``load``/``prepare``/``process`` replaced: no tokenizer, no model.

    ``process`` returns, per row: ``n_tokens`` = characters // 4 + 1 (int32), ``truncated`` = more than
    2,048 characters, ``label`` one of :data:`LABELS` by text length, ``score`` in [0, 1) (float32).
    """

    def load(self) -> LoadedModel:
        """The model digest and the classification part schema; nothing is loaded."""
        return LoadedModel(self.model_digest(), {"engine": "bench-scale", "model_dir": str(self.model_dir)},
                           part_schema("classification"), max_length=512)

    def prepare(self, rows: ChunkRows) -> ChunkRows:
        """Identity (no tokenizer)."""
        return rows

    def process(self, prepared: ChunkRows, should_stop: Callable[[], bool]) -> ChunkOutput:
        """One output row per input row of the chunk (see the class docstring)."""
        lengths = pc.utf8_length(pa.array(prepared.texts, pa.string())).to_numpy(zero_copy_only=False)
        n_tokens = (lengths // 4 + 1).astype(np.int32)
        if self.on_rows_done:
            self.on_rows_done(len(prepared))
        table = pa.table({
            "id": pa.array(prepared.ids, pa.string()),
            "n_tokens": pa.array(n_tokens),
            "truncated": pa.array(lengths > 2048),
            "label": pa.array(np.array(LABELS, dtype=object)[lengths % 3], pa.string()),
            "score": pa.array(((lengths % 97) / 97.0).astype(np.float32)),
        })
        tokens = int(n_tokens.sum())
        return ChunkOutput(table=table, tokens=TokenCounts(real=tokens, padded=tokens), batches=1,
                           stage_seconds={"inference": 0.0})
