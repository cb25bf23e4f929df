"""Canonical JSON and hashing helpers shared by the manifest, markers and fingerprints."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal objects give byte-equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(text: str | bytes) -> str:
    """Hex SHA-256 of ``text`` (UTF-8 encoded if ``str``)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def pretty_json(obj: Any, *, sort_keys: bool = True) -> bytes:
    """Indented UTF-8 JSON bytes for objects humans read (manifest, markers, reports).

    ``sort_keys=False`` keeps every mapping's own order: the manifest, whose engine config may hold a
    JSON schema whose property order is the order structured output generates the keys in.
    """
    return (json.dumps(obj, indent=2, sort_keys=sort_keys, default=str) + "\n").encode("utf-8")


def ordered_json(obj: Any) -> str:
    """Compact JSON in the object's own key order (not sorted): for hashing a value whose key order
    means something (a JSON schema's ``properties``: structured output writes keys in that order)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def json_type_name(value: Any) -> str:
    """The JSON type name of a Python value: ``null``, ``boolean``, ``integer``, ``number``, ``string``,
    ``array`` (list, tuple) or ``object`` (any mapping); for a value JSON has no type for, its Python
    type name (``bytes``, ``set``). ``bool`` is tested before ``int``: ``True`` is a boolean."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__
