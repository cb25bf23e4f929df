"""OpenAI batch output and error files, line by line (stdlib only).

An output-file line is ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"},
"error": null}``, the body shaped like the endpoint's own response (``chat.completion``,
``text_completion`` or an embeddings ``list``), ``usage`` included. An error-file line is
``{"id", "custom_id", "response": {"status_code": 400, "request_id", "body": {"error": {...}}},
"error": {"code", "message"}}``: a line rejected before the run (:class:`batch_contract.openai_batch.
Rejection`) or a dead-letter row of the run (its ``reason`` is the code, its ``detail`` the message).

Ids are derived, not random: ``batch_req_<hash>`` of (batch id, custom id) and a ``request_id`` of
(batch id, line), so downloading a file twice gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from batch_contract.enums import DeadLetterReason
from batch_contract.openai_batch import CHAT, COMPLETIONS, EMBEDDINGS

ERROR_STATUS = 400
"""``response.status_code`` of an error-file line: every rejection and dead letter is a request the
server refuses or cannot complete as asked (OpenAI answers such requests with 400)."""


def _digest(*parts: str, n: int = 24) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:n]


def request_line_id(batch_id: str, custom_id: str | None, line: int) -> str:
    """``batch_req_<24 hex>``: the line's ``id`` (stable for one batch and custom id, or for one batch and
    line when ``custom_id`` is ``None``; the two never collide)."""
    key = (custom_id,) if custom_id is not None else ("\x00line", str(line))
    return f"batch_req_{_digest(batch_id, *key)}"


def request_id(batch_id: str, custom_id: str | None) -> str:
    """``req_<24 hex>``: the response's ``request_id``."""
    return f"req_{_digest('request', batch_id, custom_id or '')}"


def usage(prompt_tokens: int, completion_tokens: int | None) -> dict[str, int]:
    """OpenAI ``usage`` (tokens); embeddings have no ``completion_tokens`` (``None``)."""
    if completion_tokens is None:
        return {"prompt_tokens": int(prompt_tokens), "total_tokens": int(prompt_tokens)}
    return {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
            "total_tokens": int(prompt_tokens) + int(completion_tokens)}


def response_body(url: str, model: str, custom_id: str, created: int, row: Mapping[str, Any],
                  batch_id: str) -> dict[str, Any]:
    """The endpoint's response body for one result row.

    Args:
        url: the batch's endpoint.
        model: the model name the request gave.
        custom_id / batch_id: for the body's ``id``.
        created: Unix seconds (the run's end) for ``created``.
        row: a part-file row: LLM rows ``output_text``, ``output_json``, ``finish_reason``,
            ``prompt_tokens``, ``output_tokens``; encoder rows ``embedding`` (floats) and ``n_tokens``.

    Raises:
        ValueError: ``url`` is not an endpoint served.
    """
    if url == EMBEDDINGS:
        return {"object": "list", "model": model,
                "data": [{"object": "embedding", "index": 0, "embedding": [float(x) for x in row["embedding"]]}],
                "usage": usage(row["n_tokens"], None)}
    text = row.get("output_json") or row.get("output_text") or ""
    use = usage(row["prompt_tokens"], row["output_tokens"])
    if url == CHAT:
        return {"id": f"chatcmpl-{_digest(batch_id, custom_id)}", "object": "chat.completion", "created": created,
                "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                             "logprobs": None, "finish_reason": row["finish_reason"]}],
                "usage": use}
    if url == COMPLETIONS:
        return {"id": f"cmpl-{_digest(batch_id, custom_id)}", "object": "text_completion", "created": created,
                "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                             "finish_reason": row["finish_reason"]}], "usage": use}
    raise ValueError(f"endpoint {url!r} is not served")


def output_line(batch_id: str, url: str, model: str, created: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """One output-file object for a result row (``row["id"]`` is the custom id)."""
    cid = row["id"]
    return {"id": request_line_id(batch_id, cid, -1), "custom_id": cid,
            "response": {"status_code": 200, "request_id": request_id(batch_id, cid),
                         "body": response_body(url, model, cid, created, row, batch_id)},
            "error": None}


def error_line(batch_id: str, custom_id: str | None, line: int, code: str, message: str) -> dict[str, Any]:
    """One error-file object: a rejected line or a dead-letter row (``code``: its reason)."""
    err = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    # a later line repeating a custom id is its own request: its id is the line's, not the custom id's
    key = None if code == DeadLetterReason.OPENAI_DUPLICATE_CUSTOM_ID.value else custom_id
    return {"id": request_line_id(batch_id, key, line), "custom_id": custom_id,
            "response": {"status_code": ERROR_STATUS, "request_id": request_id(batch_id, custom_id or f"#{line}"),
                         "body": {"error": err}},
            "error": {"code": code, "message": message}}


def jsonl(objects: Sequence[Mapping[str, Any]]) -> bytes:
    """Objects as JSONL bytes (UTF-8, one compact object a line, each ending in ``\\n``)."""
    return b"".join(json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for o in objects)
