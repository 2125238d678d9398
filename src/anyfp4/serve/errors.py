"""Every refusal of the server as an OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``
with its HTTP status; a malformed request is a 400, never a crash."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


class ApiError(Exception):
    """A request refused with ``status`` (raised by the routes, answered by the handler below)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code)


def _param(loc) -> str | None:
    """pydantic's error location (``("body", "messages", 0, "role")``) as ``messages[0].role``."""
    text = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """The first of pydantic's errors in one line, and the parameter it names."""
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    param = _param(tuple(first.get("loc", ())))
    if param is None:  # the body itself: missing, or not an object
        return "the request body must be a JSON object", None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return (f"{param}: {message}" if param else message), param


async def _validation_failed(request: Request, error: RequestValidationError) -> JSONResponse:
    message, param = validation_message(list(error.errors()))
    return error_response(400, message, param)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return error.response()


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    return error_response(error.status_code, str(error.detail), headers=getattr(error, "headers", None))


async def _internal_error(request: Request, error: Exception) -> JSONResponse:
    # the traceback goes to the log (uvicorn prints it); the client gets one line
    return error_response(500, f"internal error: {type(error).__name__}", code="internal_error")


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
