"""Safe by default: what a browser page, a DNS-rebinding page or a crash can get out of the server.

* Host (DNS rebinding): a page on attacker.example whose name is re-pointed at 127.0.0.1 talks to the server with
  `Host: attacker.example`. Allowed are `localhost` (and its subdomains' loopback name `*.localhost`), any IP literal
  (rebinding needs a name: a page on an IP is that IP's own origin), the bound host, and what `--allowed-hosts` adds
  (a name, `.example.com` for it and its subdomains, or `*` for any). Refused: 400 `host_not_allowed`.
* Origin (cross-origin requests): a browser sends `Origin` with every cross-origin request and with every POST. A
  request with an Origin not in `--allowed-origins` (`*` allows any) is refused with 403 `origin_not_allowed`; an
  allowed one gets CORS answers (preflight included), so a page the operator named can call the API.
* Content type: a POST body must be `application/json`. A browser can send text/plain or form bodies cross-origin
  without asking first; JSON needs a CORS preflight, which the Origin rule answers. Refused: 415. An empty POST
  (vLLM's `POST /ping`) has no body to check.
* Error ids: an unexpected exception is logged with its traceback under an id; the client gets the id only
  ("internal error, id err-..."), never exception text, paths or host names.

The checks run in one pure ASGI middleware (streams and disconnects pass through untouched), in front of every route.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
from dataclasses import dataclass, field

log = logging.getLogger("leapdecode.serve")

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "authorization, content-type, x-request-id"


def error_id() -> str:
    """A fresh id to quote: the client gets it, the log has it beside the details."""
    return "err-" + secrets.token_hex(6)


def host_name(host_header: str) -> str:
    """The name part of a Host header value ('[::1]:8000' -> '::1', 'a.b:80' -> 'a.b'), lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass
class Security:
    """The server's Host and Origin allow-lists (see the module's doc), and whether a chat request may bring its own
    chat template (vLLM's --trust-request-chat-template: a template is code the server runs, in Jinja's sandbox)."""

    bound_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    trust_request_chat_template: bool = False
    _hosts: set = field(init=False, repr=False)

    def __post_init__(self):
        self.allowed_hosts = tuple(h.strip().lower() for h in self.allowed_hosts if h.strip())
        self.allowed_origins = tuple(o.strip().rstrip("/").lower() for o in self.allowed_origins if o.strip())
        self._hosts = {*LOCAL_NAMES, host_name(self.bound_host)}

    def host_allowed(self, host_header: str | None) -> bool:
        if host_header is None or "*" in self.allowed_hosts:
            return True  # no Host at all: not a browser (every browser sends one)
        name = host_name(host_header)
        if name in self._hosts or name.endswith(".localhost") or _is_ip(name):
            return True
        return any(name == h or (h.startswith(".") and (name.endswith(h) or name == h[1:])) for h in self.allowed_hosts)

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        return "*" in self.allowed_origins or origin in self.allowed_origins


def _error(status: int, message: str, code: str, extra_headers=()) -> tuple[int, list, bytes]:
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra_headers]
    return status, headers, body


class SecurityMiddleware:
    """Host, Origin and content-type checks and CORS answers in front of `app`; `on_refused(path, status)` counts
    refusals (the handlers never see them). `instance`: the x-leapdecode-instance header every answer carries."""

    def __init__(self, app, security: Security, instance: str = "", on_refused=None):
        self.app, self.security, self.on_refused = app, security, on_refused
        self.instance = (b"x-leapdecode-instance", instance.encode()) if instance else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        cors = []
        refused = None
        if not self.security.host_allowed(headers.get("host")):
            log.warning("refused a request for host %r (not in --allowed-hosts)", headers.get("host"))
            refused = _error(
                400, "the Host header names a host this server does not serve (see --allowed-hosts)", "host_not_allowed"
            )
        elif origin is not None and not self.security.origin_allowed(origin):  # "null" (an opaque origin) too
            log.warning("refused a cross-origin request from %r (not in --allowed-origins)", origin)
            refused = _error(403, "cross-origin requests are not allowed (see --allowed-origins)", "origin_not_allowed")
        else:
            if origin is not None:
                cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]
            if scope["method"] == "OPTIONS" and origin is not None:
                preflight = [
                    *cors,
                    (b"access-control-allow-methods", CORS_METHODS.encode()),
                    (b"access-control-allow-headers", CORS_HEADERS.encode()),
                    (b"access-control-max-age", b"600"),
                    (b"content-length", b"0"),
                ]
                return await self._answer(send, 204, preflight, b"")
            empty = headers.get("content-length") == "0"  # nothing to read (a POST /ping)
            if scope["method"] == "POST" and not empty and not _is_json(headers.get("content-type", "")):
                refused = _error(
                    415,
                    "the request body must be JSON, sent with 'Content-Type: application/json'",
                    "invalid_content_type",
                )
        if refused is not None:
            status, extra, body = refused
            if self.on_refused is not None:
                self.on_refused(scope.get("path", ""), status)
            await _drain(receive)
            return await self._answer(send, status, [*extra, *cors], body)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *cors, *([self.instance] if self.instance else [])]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _answer(self, send, status: int, headers: list, body: bytes) -> None:
        if self.instance:
            headers = [*headers, self.instance]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def _drain(receive, limit: int = 64 * 1024 * 1024) -> None:
    """Read (and drop) the body of a refused request, so the client sees the answer rather than a reset."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            return


def authorize(api_key: str | None, request) -> None:
    """APIError(401) unless the request carries `Authorization: Bearer <api_key>` (nothing to check without a key)."""
    if api_key is None:
        return
    from .protocol import APIError

    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(
            401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'", code="invalid_api_key"
        )
