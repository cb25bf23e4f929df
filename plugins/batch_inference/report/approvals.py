"""Who approved a run and when: the cost report's ``approval`` section and its one-line text, from the
run's ``approval.json`` (written by the ``approve`` task, :mod:`batch_inference.approval`).

No Airflow import; the only read is :func:`read_section`'s, through the run store it is given. The cost
report (:func:`batch_inference.report.build.build_report`: JSON, HTML, Markdown and text summaries) and
the UI's run view both use :func:`read_section`, so they say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batch_contract.runstore import RunStore

DECISIONS = ("pending", "approved", "rejected", "unreadable")
"""``approval.decision`` values: the record's own three, and ``unreadable`` for an ``approval.json`` that
is not a JSON object with a known decision (the run did ask; what was answered cannot be told)."""
NOT_REQUIRED = "not required"
"""The text of a run that never asked for approval (``require_approval`` off, or nothing to approve)."""


def _user(value: Any) -> dict[str, str | None] | None:
    """``{"id", "name"}`` (strings or ``None``) of a recorded user, ``None`` for no user."""
    if not isinstance(value, Mapping):
        return None
    uid, name = value.get("id"), value.get("name")
    if uid in (None, "") and name in (None, ""):
        return None
    return {"id": None if uid in (None, "") else str(uid), "name": None if name in (None, "") else str(name)}


def _text_or_none(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def approval_section(record: Any) -> dict[str, Any] | None:
    """The report's ``approval`` section from the run's approval record.

    Args:
        record: the parsed ``approval.json`` (``batch_inference.approval.read_approval``) or ``None``
            when the run has none. Anything that is not a mapping with a known ``decision`` gives
            ``decision: "unreadable"``.

    Returns:
        ``None`` when the run never asked for approval (no record), else ``{"decision": one of
        :data:`DECISIONS`, "responded_by": {"id", "name"} | None, "responded_at": ISO-8601 | None,
        "asked_at": ISO-8601 | None, "timed_out": bool}``. ``responded_by`` is ``None`` when nobody
        answered (pending, or rejected by Airflow at the deadline: ``timed_out`` true).
    """
    if record is None:
        return None
    if not isinstance(record, Mapping) or record.get("decision") not in DECISIONS[:3]:
        return {"decision": "unreadable", "responded_by": None, "responded_at": None, "asked_at": None,
                "timed_out": False}
    timed_out = bool(record.get("timed_out"))
    return {
        "decision": str(record["decision"]),
        "responded_by": None if timed_out else _user(record.get("responded_by")),
        "responded_at": _text_or_none(record.get("responded_at")),
        "asked_at": _text_or_none(record.get("asked_at")),
        "timed_out": timed_out,
    }


def one_line(value: Any) -> str:
    """``str(value)`` as one line: characters that do not print (newlines, tabs, controls) become spaces,
    and runs of spaces one space (a recorded name or time cannot forge lines in a log)."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())


def who(user: Mapping[str, Any] | None) -> str:
    """A user as a person reads it, on one line (:func:`one_line`): ``alice``, ``Alice Smith (id 7)`` when
    the id differs from the name, ``nobody`` for ``None``."""
    if not user:
        return "nobody"
    name, uid = user.get("name"), user.get("id")
    if name and uid and uid != name:
        return f"{one_line(name)} (id {one_line(uid)})"
    return one_line(name or uid)


def approval_text(section: Mapping[str, Any] | None) -> str:
    """One line (no line break, whatever the record holds) for a page or a log: ``approved by alice at 2026-12-03T06:00:00+00:00``,
    ``rejected by bob at ...``, ``rejected: nobody answered by the run's deadline (asked ...)``,
    ``pending: asked at ..., no answer yet``, ``approval.json unreadable``, or :data:`NOT_REQUIRED`
    for ``None``.

    Args:
        section: :func:`approval_section`'s result (``report["approval"]``).
    """
    if section is None:
        return NOT_REQUIRED
    decision = section.get("decision")
    asked = one_line(section.get("asked_at") or "an unknown time")
    if decision == "pending":
        return f"pending: asked at {asked}, no answer yet"
    if decision in ("approved", "rejected"):
        if section.get("timed_out"):
            return f"{decision}: nobody answered by the run's deadline (asked at {asked})"
        at = one_line(section.get("responded_at") or "an unknown time")
        return f"{decision} by {who(section.get('responded_by'))} at {at}"
    return "approval.json unreadable"


def read_section(store: RunStore) -> dict[str, Any] | None:
    """:func:`approval_section` of the run's ``approval.json`` (``None``: the run has none); a file that is
    not JSON gives ``decision: "unreadable"`` instead of an error (the report and the page still show).

    Raises:
        OSError: the storage read failed.
    """
    try:
        record = store.approval()
    except ValueError:
        record = {"decision": "unreadable"}
    return approval_section(record)
