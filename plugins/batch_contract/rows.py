"""Row rules shared by the planner, the worker and publish: JSONL lines, ids, text repair, duplicates.

One rule per question, so the three readers of the same input can never disagree:

* **Lines** (:func:`iter_jsonl_lines`): a JSONL row is a line that is not blank (ASCII whitespace only
  counts as blank); row numbers count non-blank lines from 0. ``\\r\\n`` endings are tolerated. A line
  longer than ``worker.max_line_bytes`` is still a row, but unreadable (:class:`OversizedLine`): the
  worker dead-letters it ``invalid_record``, matched by position.
* **Row-group size** (:func:`row_group_read_bytes`): the bytes a Parquet row group costs to read are
  the uncompressed sizes of the column chunks of the columns read, from the file's metadata.
* **Decoding** (:func:`decode_line`): a JSONL line's invalid UTF-8 bytes become lone surrogates, so the
  id and text rules below see exactly which value held them.
* **Ids** (:func:`canonical_id`): integers (not booleans) are written in decimal; strings are kept
  verbatim. A null id is ``null_id``; any other type, a string that is not valid Unicode (invalid
  UTF-8 bytes, or a lone UTF-16 surrogate such as the JSON escape ``"\\ud800"``) is ``invalid_id`` with
  no canonical form: such rows are dead letters matched by ``(source_uri, source_row)``, never by id.
  A blank string keeps its text but is ``invalid_id`` too (matched by that text).
* **Text** (:func:`repair_text`): a string value that is not valid Unicode is repaired, each bad byte
  sequence or lone surrogate becoming U+FFFD, and the row is flagged ``text_repaired``; the row is kept.
  The same repair applies to every other string a job reads (LLM template fields), recursively.
* **Duplicates** (:func:`duplicate_detail`): for each id, the first *eligible* row in input order wins;
  eligible means the row is not dead-lettered for a reason of its own (:data:`ROW_REASONS`). Every
  other eligible row with that id is a ``duplicate_id`` dead letter naming the winner's position. The
  worker applies the rule within a shard and publish across shards, so the published table does not
  depend on ``rows_per_shard``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, BinaryIO

from batch_contract.engine_config import DEFAULT_MAX_LINE_BYTES
from batch_contract.enums import DeadLetterReason

ROW_REASONS = frozenset({
    DeadLetterReason.INVALID_RECORD, DeadLetterReason.NULL_ID, DeadLetterReason.INVALID_ID,
    DeadLetterReason.NULL_TEXT, DeadLetterReason.NON_STRING_TEXT, DeadLetterReason.EMPTY_TEXT,
    *(r for r in DeadLetterReason if r.name.startswith("OPENAI_")),
})
"""Dead-letter reasons a row gets on its own, before duplicates are considered (the worker's
validation, or a refused OpenAI request line: ``batch_contract.openai_batch``). A row with one of these never competes for its id; every other row does (it is the
winner, or a ``duplicate_id``; an engine reason such as ``too_long`` applies to a winner only)."""

READ_BLOCK_BYTES = 1 << 20
"""Bytes read per call when walking JSONL lines (1 MiB): lines longer than this span several reads."""

_SURROGATE = re.compile("[\ud800-\udfff]")


class OversizedLine(bytes):
    """What :func:`iter_jsonl_lines` yields in place of a line longer than its ``max_line_bytes``: an
    empty ``bytes`` (so a caller that parses it sees an unreadable record, never a prefix that might
    parse) carrying the line's length in :attr:`length` (bytes, without the newline)."""

    length: int

    def __new__(cls, length: int) -> OversizedLine:
        line = super().__new__(cls, b"")
        line.length = length
        return line

    def __repr__(self) -> str:
        return f"OversizedLine(length={self.length})"


def iter_jsonl_lines(stream: BinaryIO, block_bytes: int = READ_BLOCK_BYTES,
                     max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """Yield ``(row, line)`` for every non-blank line of a JSONL stream, ``row`` counting from 0.

    Linear in the stream's length whatever the line lengths (a line spanning many reads is joined once);
    holds at most ``max_line_bytes`` of one line besides the current read (and its split).

    Args:
        stream: any object with ``read(n) -> bytes`` (a file, a pyarrow input stream).
        block_bytes: bytes per read.
        max_line_bytes: longest line (bytes, without its ``\n``) yielded as bytes
            (``WorkerSettings.max_line_bytes``; the default is that setting's default). A longer line
            that is not blank still counts as a row and is yielded as an :class:`OversizedLine` (empty
            bytes with its length); the blank rule is the same for it. ``None``: no limit.

    Yields:
        The row number and the raw line without its ``\n`` (bytes, possibly with a trailing ``\r``),
        or an :class:`OversizedLine`.
    """
    cap = max_line_bytes if max_line_bytes is not None else -1
    row = 0
    parts: list[bytes] = []  # pieces of the current line, at most ``cap`` bytes together
    held = 0  # bytes in ``parts``
    over = -1  # length of the current line once it is over the cap, else -1
    nonblank = False  # the over-long current line has a non-blank byte

    def add(piece: bytes) -> None:
        nonlocal held, over, nonblank
        if over >= 0:
            over += len(piece)
            nonblank = nonblank or bool(piece.strip())
        elif cap >= 0 and held + len(piece) > cap:
            over = held + len(piece)
            nonblank = any(p.strip() for p in parts) or bool(piece.strip())
            parts.clear()
            held = 0
        else:
            parts.append(piece)
            held += len(piece)

    def end() -> bytes | None:
        """The finished current line (``None`` when blank), state reset for the next one."""
        nonlocal held, over, nonblank
        if over >= 0:
            line: bytes | None = OversizedLine(over) if nonblank else None
        else:
            joined = parts[0] if len(parts) == 1 else b"".join(parts)
            line = joined if joined.strip() else None
        parts.clear()
        held, over, nonblank = 0, -1, False
        return line

    while block := stream.read(block_bytes):
        pieces = block.split(b"\n")
        last = pieces.pop()
        if pieces:
            add(pieces[0])
            line = end()
            if line is not None:
                yield row, line
                row += 1
            if cap < 0 or len(block) <= cap:  # no whole line of this block can be over the cap
                for piece in islice(pieces, 1, None):
                    if piece.strip():
                        yield row, piece
                        row += 1
            else:
                for piece in islice(pieces, 1, None):
                    if len(piece) > cap:
                        add(piece)
                        line = end()
                    else:
                        line = piece if piece.strip() else None
                    if line is not None:
                        yield row, line
                        row += 1
        add(last)
    line = end()
    if line is not None:
        yield row, line


def _leaf_count(dtype: Any) -> int:
    """Parquet leaf columns of an Arrow type (1 for a primitive; the sum over children for a nested one)."""
    n = getattr(dtype, "num_fields", 0)
    return 1 if not n else sum(_leaf_count(dtype.field(i).type) for i in range(n))


def row_group_read_bytes(metadata: Any, schema: Any, columns: Collection[str]) -> list[int]:
    """Uncompressed bytes of the ``columns`` in each row group of a Parquet file, from its metadata.

    Args:
        metadata: the file's ``pyarrow.parquet.FileMetaData``.
        schema: the file's Arrow schema (``ParquetFile.schema_arrow``), whose top-level fields own the
            file's leaf column chunks in order.
        columns: top-level column names the reader reads (absent ones count 0).

    Returns:
        One byte count per row group. When the schema's leaves do not line up with the file's column
        chunks, every column chunk counts (an over- rather than an underestimate).
    """
    wanted = set(columns)
    leaves: list[int] = []
    j = 0
    for f in schema:
        n = _leaf_count(f.type)
        if f.name in wanted:
            leaves.extend(range(j, j + n))
        j += n
    if j != metadata.num_columns:
        leaves = list(range(metadata.num_columns))
    out = []
    for g in range(metadata.num_row_groups):
        rg = metadata.row_group(g)
        out.append(sum(rg.column(k).total_uncompressed_size for k in leaves))
    return out


def count_jsonl_rows(stream: BinaryIO) -> int:
    """Number of rows (non-blank lines) in a JSONL stream, by :func:`iter_jsonl_lines`' rule."""
    return sum(1 for _ in iter_jsonl_lines(stream))


def decode_line(raw: bytes) -> str:
    """Decode one JSONL line for ``json.loads`` without losing where it was not UTF-8: each invalid byte
    becomes a lone surrogate (``surrogateescape``), so a bad byte inside the id makes the id
    ``invalid_id`` (:func:`canonical_id`), inside the text repairs only the text (:func:`repair_text`),
    and inside a column nobody reads changes nothing."""
    return raw.decode("utf-8", errors="surrogateescape")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a UTF-16 surrogate code point (``\\ud800``-``\\udfff``), which no UTF-8
    encoder accepts (JSON may carry one as an escape; Python's ``json`` decodes it verbatim)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def repair_text(value: Any) -> tuple[Any, bool]:
    """Make a text value valid Unicode, replacing what is not with U+FFFD.

    Args:
        value: a ``str``, UTF-8 ``bytes`` (a Parquet string column read as binary), or anything else.

    Returns:
        ``(value, repaired)``: a ``str`` for ``str``/``bytes`` input (``repaired`` True when a lone
        surrogate or an invalid UTF-8 sequence was replaced); any other value unchanged with False
        (validation dead-letters non-string texts).
    """
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), False
        except UnicodeDecodeError:
            return value.decode("utf-8", errors="replace"), True
    if isinstance(value, str) and has_lone_surrogate(value):
        return _SURROGATE.sub("\ufffd", value), True
    return value, False


def repair_value(value: Any) -> Any:
    """:func:`repair_text` applied to every string inside ``value`` (dicts, lists; keys included), for
    row fields other than the text (LLM template fields)."""
    if isinstance(value, str | bytes):
        return repair_text(value)[0]
    if isinstance(value, dict):
        return {repair_value(k): repair_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [repair_value(v) for v in value]
    return value


@dataclass(frozen=True)
class CanonicalId:
    """An input id in its canonical form.

    Attributes:
        id: the string form (integers in decimal, strings verbatim), or ``None`` when the row can only
            be located by position (null, wrong type, not valid Unicode).
        reason: ``None`` for a valid id, else why the row is a dead letter (``null_id``, ``invalid_id``).
        detail: human-readable reason (``""`` when valid).
    """

    id: str | None
    reason: DeadLetterReason | None = None
    detail: str = ""


def canonical_id(value: Any) -> CanonicalId:
    """The canonical form of a raw id value (see the module docstring for the rule).

    Args:
        value: the id as read: ``int``, ``str``, UTF-8 ``bytes`` (a Parquet string column read as
            binary), ``None`` or any other JSON value.
    """
    if value is None:
        return CanonicalId(None, DeadLetterReason.NULL_ID, "id is null")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return CanonicalId(None, DeadLetterReason.INVALID_ID, f"id {value!r:.200} is not valid UTF-8")
    if isinstance(value, bool) or not isinstance(value, int | str):
        return CanonicalId(None, DeadLetterReason.INVALID_ID,
                           f"id {value!r:.200} is a {type(value).__name__}, not an integer or string")
    if isinstance(value, str):
        if has_lone_surrogate(value):
            return CanonicalId(None, DeadLetterReason.INVALID_ID, f"id {value!r:.200} is not valid Unicode "
                               "(invalid UTF-8 bytes, shown as \\udcXX, or a lone UTF-16 surrogate)")
        if not value.strip():
            return CanonicalId(value, DeadLetterReason.INVALID_ID, "id is an empty or whitespace-only string")
        return CanonicalId(value)
    return CanonicalId(str(value))


def duplicate_detail(winner_uri: str, winner_row: int) -> str:
    """Detail of a ``duplicate_id`` dead letter: names the winning row by position.

    Publish builds the same text in SQL (``'duplicate of ' || uri || '#' || row || ...``); keep them equal.
    """
    return f"duplicate of {winner_uri}#{winner_row}{DUPLICATE_DETAIL_TAIL}"


DUPLICATE_DETAIL_TAIL = ", the first valid row with this id in input order (the one processed)"
"""Constant end of :func:`duplicate_detail` (publish appends it in SQL)."""
