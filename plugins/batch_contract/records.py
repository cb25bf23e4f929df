"""One way to write and read the contract's JSON records (markers, attempts, progress, canary, plans).

A record is a dataclass that mixes in :class:`JsonRecord`. Written: indented UTF-8 JSON of
:meth:`JsonRecord.to_dict` (:func:`batch_contract.jsonutil.pretty_json`, keys sorted unless the class
says otherwise). Read: :meth:`JsonRecord.from_json_bytes` parses the bytes, checks that they hold a JSON
object, checks its ``schema_version`` (:func:`batch_contract.version.check_schema_version`) and its
keys against the dataclass fields, then builds the record. These records have no Arrow schema
(:mod:`batch_contract.schemas` describes part and dead-letter files only): the dataclass fields are
their schema.

Stdlib + the contract only (both sides import this module).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, fields
from typing import Any, ClassVar, Self

from batch_contract.jsonutil import json_type_name, pretty_json
from batch_contract.version import check_schema_version


def parse_json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """The JSON object in ``raw``.

    Args:
        raw: UTF-8 JSON bytes (or text).
        what: the record's name for error messages (e.g. ``"shard marker"``).

    Raises:
        ValueError: ``raw`` is not valid JSON (``json.JSONDecodeError``, a ``ValueError``), or holds
            another JSON value than an object (the message names ``what`` and the type found).
    """
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object, got {json_type_name(data)}")
    return data


class JsonRecord:
    """Mixin of the contract's JSON records (the class must be a dataclass with a ``schema_version``
    field). Class settings:

    * ``RECORD_NAME``: the record's name in error messages (``"shard marker"``).
    * ``SORT_KEYS``: write keys sorted (default) or in field order (the manifest).
    * ``IGNORE_UNKNOWN``: drop keys that are not fields (a newer writer's additions) instead of
      refusing them.
    * ``MISSING_SCHEMA_VERSION``: the version assumed when the key is absent; the default ``-1`` is
      never readable, so such a record is refused.
    """

    RECORD_NAME: ClassVar[str] = "record"
    SORT_KEYS: ClassVar[bool] = True
    IGNORE_UNKNOWN: ClassVar[bool] = False
    MISSING_SCHEMA_VERSION: ClassVar[int] = -1

    def to_dict(self) -> dict[str, Any]:
        """Every field, nested dataclasses as dicts (``dataclasses.asdict``); what :meth:`to_json_bytes` writes."""
        return asdict(self)  # type: ignore[call-overload]

    def to_json_bytes(self) -> bytes:
        """Indented UTF-8 JSON of :meth:`to_dict`, newline-terminated (:func:`pretty_json`)."""
        return pretty_json(self.to_dict(), sort_keys=self.SORT_KEYS)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The record of a parsed JSON object.

        Raises:
            ValueError: unreadable ``schema_version``; a key that is not a field (unless
                ``IGNORE_UNKNOWN``); a field without a default that is absent. Messages name the
                record and the field. A class's own checks (``__post_init__``) may raise more.
        """
        check_schema_version(int(data.get("schema_version", cls.MISSING_SCHEMA_VERSION)), cls.RECORD_NAME)
        known = fields(cls)  # type: ignore[arg-type]
        names = {f.name for f in known}
        unknown = sorted(k for k in data if k not in names)
        if unknown and not cls.IGNORE_UNKNOWN:
            raise ValueError(f"{cls.RECORD_NAME}: unknown field(s) {unknown}")
        absent = [f.name for f in known if f.init and f.name not in data
                  and f.default is MISSING and f.default_factory is MISSING]
        if absent:
            raise ValueError(f"{cls.RECORD_NAME}: missing field(s) {absent}")
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json_bytes(cls, raw: bytes) -> Self:
        """The record written by :meth:`to_json_bytes` (or an older writer, see :meth:`from_dict`).

        Raises:
            ValueError: not JSON, not a JSON object, or refused by :meth:`from_dict`.
        """
        return cls.from_dict(parse_json_object(raw, cls.RECORD_NAME))
