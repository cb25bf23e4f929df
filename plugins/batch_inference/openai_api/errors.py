"""OpenAI-style error bodies for the Files + Batches API: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal of the API, Airflow's own 401/403 of a missing or invalid token included, is answered in
this shape, so the ``openai`` client raises its usual typed errors (``AuthenticationError``,
``PermissionDeniedError``, ``NotFoundError``, ``BadRequestError``...) with the message.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

TYPE_OF_STATUS = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
                  404: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
                  422: "invalid_request_error"}
CODE_OF_STATUS = {401: "invalid_api_key", 403: "forbidden", 404: "not_found", 413: "file_too_large"}


class ApiError(HTTPException):
    """A refusal with an OpenAI ``code`` and ``param`` (the field at fault, or ``None``)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(status, message)
        self.code = code
        self.param = param


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The JSON body of a refusal with HTTP ``status``."""
    return {"error": {"message": message, "type": TYPE_OF_STATUS.get(status, "api_error"), "param": param,
                      "code": code if code is not None else CODE_OF_STATUS.get(status)}}


async def http_exception_handler(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler: any :class:`HTTPException` (``ApiError`` or Airflow's) as an OpenAI error body."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None)
    message = detail if isinstance(detail, str) else str(detail if detail is not None else exc)
    body = error_body(status, message, getattr(exc, "code", None), getattr(exc, "param", None))
    return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))


async def validation_handler(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler: a request that does not match a route's declared fields, as a 400 error body."""
    errors = getattr(exc, "errors", lambda: [])()
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return JSONResponse(error_body(400, f"invalid request: {first.get('msg', 'malformed')}", "invalid_request",
                                   param), status_code=400)
