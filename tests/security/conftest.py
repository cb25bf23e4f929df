"""The attack suite (``make test-security``): every test here is one attack through the real path it uses,
and passes only when the attack is refused.

Fixtures:

* ``planted`` - :class:`Planted`: secret strings planted in connections, Variables and env vars of the
  deployment under attack, and :meth:`Planted.forms` of each (plain, reversed, base64, hex, URL-quoted),
  so a secret rendered backwards or encoded to slip past log masking is still found.
* ``no_secrets`` - ``no_secrets(*things)``: scans files, directories (recursively, every byte) and
  strings for every planted form; fails the test naming where a secret was found, and records the count
  for the summary.

At the end of the session the controller writes ``build/security/summary.json``:
``{"attacks_tried", "attacks_refused", "secrets_found_in_outputs", "classes": {module: [tried, refused]}}``;
``make test-security`` prints it as its last line. An attack is a test of this directory that ran (not
skipped); refused means it passed. ``secrets_found_in_outputs`` sums what ``no_secrets`` found.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_helpers import REPO_ROOT

SUMMARY = REPO_ROOT / "build" / "security" / "summary.json"
SECRET_HITS = "secrets_found"


@dataclass(frozen=True)
class Planted:
    """Secrets planted in the deployment under attack (none is a real credential).

    Attributes:
        conn_password: the password of every connection the attacks plant.
        variable: the value of a planted Airflow Variable.
        env: the value of a planted environment variable of the Airflow worker.
        key_mark: a marker inside a planted service-account key.
    """

    conn_password: str = "PlantedConnPassw0rd-5d2e"
    variable: str = "planted-variable-value-41bb"
    env: str = "planted-env-secret-7c1a9e"
    key_mark: str = "PLANTEDPRIVATEKEYb64Zm9vYmFy"

    def secrets(self) -> list[str]:
        return [self.conn_password, self.variable, self.env, self.key_mark]

    def forms(self) -> list[bytes]:
        """Every secret as plain, reversed, upper-case, base64, hex and URL-quoted bytes."""
        out: list[bytes] = []
        for secret in self.secrets():
            raw = secret.encode()
            out += [raw, raw[::-1], raw.upper(), base64.b64encode(raw), raw.hex().encode(),
                    urllib.parse.quote(secret, safe="").encode()]
        return out


@pytest.fixture(scope="session")
def planted() -> Planted:
    return Planted()


def _hits(thing: str | bytes | Path, forms: list[bytes]) -> list[str]:
    if isinstance(thing, Path):
        paths = [thing] if thing.is_file() else [p for p in thing.rglob("*") if p.is_file()] if thing.exists() else []
        return [f"{p}: {f.decode()[:12]}..." for p in paths for f in forms if f in p.read_bytes()]
    data = thing.encode(errors="surrogateescape") if isinstance(thing, str) else thing
    return [f"<text>: {f.decode()[:12]}..." for f in forms if f in data]


@pytest.fixture
def no_secrets(planted: Planted, record_property: Callable[[str, object], None]) -> Callable[..., None]:
    """``no_secrets(*things)``: fail when a planted secret (any of :meth:`Planted.forms`) is in one of the
    files, directory trees or strings given."""
    found: list[str] = []

    def check(*things: str | bytes | Path | Iterable[Path]) -> None:
        hits: list[str] = []
        for thing in things:
            items = list(thing) if isinstance(thing, list | tuple | set) else [thing]
            for item in items:
                hits += _hits(item, planted.forms())
        found.extend(hits)
        record_property(SECRET_HITS, len(found))
        assert not hits, f"planted secrets found: {hits[:10]}"

    return check


_RESULTS: dict[str, dict[str, object]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect each attack's outcome (runs on the xdist controller too: reports are forwarded)."""
    if "tests/security/" not in report.nodeid.replace("\\", "/"):
        return
    entry = _RESULTS.setdefault(report.nodeid, {"ran": False, "failed": False, "secrets": 0})
    if report.when == "call" or (report.when == "setup" and report.failed):
        entry["ran"] = True
    if report.failed:
        entry["failed"] = True
    for name, value in report.user_properties:
        if name == SECRET_HITS:
            entry["secrets"] = max(int(entry["secrets"]), int(value))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or not _RESULTS:  # xdist worker: the controller writes
        return
    classes: dict[str, list[int]] = {}
    for nodeid, entry in _RESULTS.items():
        if not entry["ran"]:
            continue
        module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
        tried_refused = classes.setdefault(module, [0, 0])
        tried_refused[0] += 1
        tried_refused[1] += 0 if entry["failed"] else 1
    summary = {
        "attacks_tried": sum(c[0] for c in classes.values()),
        "attacks_refused": sum(c[1] for c in classes.values()),
        "secrets_found_in_outputs": sum(int(e["secrets"]) for e in _RESULTS.values()),
        "classes": dict(sorted(classes.items())),
    }
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary) + "\n")
