"""What a request must pass before any route sees it, in this order:

1. a Host the server answers to: bound to a loopback address, only loopback names (``localhost``,
   ``127.0.0.1``, ``[::1]``), so that a web page whose DNS name was rebound to 127.0.0.1 is refused (400);
2. the API key, when there is one, on every path but ``/health``: ``Authorization: Bearer KEY``, compared
   in constant time (401);
3. a POST body declared as JSON (415): a web page can post a form or text to another origin without asking,
   but JSON only after a CORS preflight, which this server never grants;
4. a body of at most ``max_body_bytes`` (413), read here and handed on whole.
"""

from __future__ import annotations

import hmac

from .errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
OPEN_PATHS = frozenset({"/health"})
JSON_TYPE = "application/json"


def host_name(header: str) -> str:
    """The host of a Host header, lower case, without its port (``[::1]:8000`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class RequestGuard:
    """Pure ASGI middleware (it answers refusals itself, before the app reads anything)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, allowed_hosts: frozenset[str] | None):
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)  # the first of repeated headers
        refusal = self._refusal(scope, headers)
        if refusal is None and scope["method"] == "POST":
            refusal, receive = await self._bounded_body(receive)
        if refusal is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)

    def _refusal(self, scope, headers: dict[bytes, bytes]):
        if self.allowed_hosts is not None:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                return error_response(400, f"this server answers to {', '.join(sorted(self.allowed_hosts))}, "
                                      f"not to Host {host!r}", code="invalid_host")
        if self.key is not None and scope["path"] not in OPEN_PATHS:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                return error_response(401, "a valid API key is required: Authorization: Bearer KEY",
                                      code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if scope["method"] == "POST":
            media = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
            if media != JSON_TYPE:
                return error_response(415, f"the body must be JSON, sent with Content-Type: {JSON_TYPE}",
                                      code="unsupported_media_type")
            length = headers.get(b"content-length")
            if length is not None and not length.strip().isdigit():
                return error_response(400, "the Content-Length header is not a number")
            if length is not None and int(length) > self.max_body_bytes:
                return self._too_large()
        return None

    def _too_large(self):
        return error_response(413, f"the request body is over this server's limit of {self.max_body_bytes} bytes",
                              code="request_too_large")

    async def _bounded_body(self, receive):
        """(a 413 for a body over the limit, or None; a receive that hands on the body read here)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before the whole body came
                first = message
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return self._too_large(), receive
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        handed = False

        async def replay():
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return first

        return None, replay
