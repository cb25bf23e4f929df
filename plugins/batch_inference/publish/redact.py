"""Error text of database drivers with the connection string taken out.

psycopg and SQLAlchemy may quote the connection string they were given (``missing "=" after "..." in
connection info string``), and a URI carries its password; publish passes driver messages on only
through :func:`redact`.
"""

from __future__ import annotations

import re
import urllib.parse

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s,;\"]+)", re.IGNORECASE)
_KEYWORD = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")
_QUOTED = re.compile(r"\"([^\"]*)\"")
PUBLIC_KEYS = ("host", "hostaddr", "port", "dbname", "user")
"""libpq keywords whose values may stay in a quoted fragment of a message (where it failed)."""
SECRET_KEYS = ("password", "sslpassword")
"""libpq keywords whose values are removed wherever they occur in a message."""


def _parts(dsn: str) -> tuple[set[str], set[str]]:
    """``(secrets, public)``: password forms of ``dsn`` and the values that may be shown."""
    secrets: set[str] = set()
    public: set[str] = set()
    if "://" in dsn:
        try:
            url = urllib.parse.urlsplit(dsn)
            for value in (url.password,):
                if value:
                    secrets |= {value, urllib.parse.unquote(value)}
            public |= {v for v in (url.hostname, str(url.port or ""), url.username, url.path.lstrip("/")) if v}
        except ValueError:
            pass
        pairs = urllib.parse.parse_qsl(dsn.partition("?")[2])
    else:
        pairs = [(key, value.strip("'")) for key, value in _KEYWORD.findall(dsn)]
    for key, value in pairs:
        if key in SECRET_KEYS:
            secrets.add(value)
        elif key in PUBLIC_KEYS:
            public.add(value)
    return {s for s in secrets if s}, public - secrets - {""}


def redact(text: str, dsn: str | None) -> str:
    """``text`` on one line, without ``dsn``, its password (plain and URL-decoded), any ``scheme://...``
    URI, any ``password=...`` and any double-quoted fragment of ``dsn`` other than its host, port,
    database or user name.

    Args:
        text: a driver's error message.
        dsn: the connection string the driver was given (``None``: only the generic rules apply).
    """
    out = " ".join(text.split())
    secrets, public = _parts(dsn) if dsn else (set(), set())
    for secret in sorted({dsn or "", *secrets} - {""}, key=len, reverse=True):
        out = out.replace(secret, "***")
    out = _URI.sub("<uri>", out)
    out = _PASSWORD_KV.sub(r"\1***", out)

    def quoted(match: re.Match[str]) -> str:
        inner = match.group(1)
        if not any(c.isalnum() for c in inner) or inner in public or not dsn or inner not in dsn:
            return match.group(0)
        return '"***"'

    return _QUOTED.sub(quoted, out)
