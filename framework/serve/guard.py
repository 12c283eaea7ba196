"""Who may drive the server from a browser: the Host and Origin checks, and CORS only when asked.

Without an API key, a web page the user opens could otherwise drive the server: by DNS rebinding (a
name of the page's own, later pointed at 127.0.0.1, so the browser sends Host: evil.example) or by a
cross-origin "simple" POST (text/plain, no preflight), which the browser sends and whose effect
happens even though the page cannot read the answer. So:

- without --api-key, a Host that is not the bound address, an IP literal (a rebinding attack needs a
  name) or a loopback name is refused with 403;
- a request that carries an Origin other than its own is refused with 403 unless --cors names that
  origin (browsers send Origin on every cross-origin request, and on no request of a non-browser
  client), whatever the key;
- CORS headers are sent only for the --cors origins (starlette's CORSMiddleware, around this one).
"""

from __future__ import annotations

import ipaddress

from starlette.middleware.cors import CORSMiddleware

from .errors import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def parse_origins(values: list[str] | None) -> list[str]:
    """--cors given several times or as a comma list, each origin without a trailing slash."""
    out: list[str] = []
    for value in values or []:
        out += [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
    return out


def host_name(host_header: str) -> str:
    """The name of a Host header without its port: 'a.b:80' -> 'a.b', '[::1]:80' -> '::1'."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(name: str, bound: str) -> bool:
    name = name.lower().rstrip(".")
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or name == bound.lower():
        return True
    return _is_ip(name) and (bound in WILDCARD_BINDS or _is_ip(bound))


class Guard:
    """The Host check (only without a key) and the Origin check, before anything else reads the request."""

    def __init__(self, app, bound_host: str, api_key: str | None, origins: list[str]):
        self.app, self.bound, self.check_host, self.origins = app, bound_host, api_key is None, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        refusal = self._refusal(host, headers.get("origin"), scope.get("scheme", "http"))
        if refusal:
            return await refusal.response()(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, host: str, origin: str | None, scheme: str) -> ApiError | None:
        if self.check_host and not host_allowed(host_name(host), self.bound):
            return ApiError(403, f"the Host header '{host}' is neither this server's address ({self.bound}) nor a "
                            f"loopback name; without --api-key only those are served (a web page could otherwise "
                            f"drive the server by DNS rebinding): connect by the bound address or "
                            f"127.0.0.1/localhost, or start the server with --api-key", code="host_not_allowed",
                            type="permission_error")
        if origin is None or origin.rstrip("/") == f"{scheme}://{host}" or "*" in self.origins \
                or origin.rstrip("/") in self.origins:
            return None
        allowed = ", ".join(self.origins) if self.origins else "none"
        return ApiError(403, f"a cross-origin request from '{origin}' is refused (origins allowed: {allowed}); "
                        f"start the server with --cors {origin} to let that page use it", code="origin_not_allowed",
                        type="permission_error")


def add_guards(app, bound_host: str, api_key: str | None, origins: list[str]) -> None:
    """CORS inside, the Guard outside (middleware added last runs first)."""
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=[
                               "X-Framework-Devices", "X-Framework-Model", "Retry-After"])
    app.add_middleware(Guard, bound_host=bound_host, api_key=api_key, origins=origins)
