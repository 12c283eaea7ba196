"""Errors as OpenAI's API words them: a status, and {"error": {message, type, param, code}}."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import ValidationError


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers, self.extra = headers or {}, extra

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_body(e: ValidationError) -> ApiError:
    """One sentence per field at fault (a union's alternatives give several errors for one field: the first
    is kept), naming the field and the value that was given."""
    errors = e.errors(include_url=False)
    if any(err["type"] == "json_invalid" for err in errors):
        detail = next(err for err in errors if err["type"] == "json_invalid").get("ctx", {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON ({detail})", code="invalid_json")
    seen, parts = [], []
    for err in errors:
        field = ".".join(str(p) for p in err["loc"] if not _is_union_branch(p))
        if field in seen:
            continue
        seen.append(field)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            parts.append(f"'{field}' is required")
        elif err["type"] == "extra_forbidden":
            parts.append(f"'{field}' is not a field this server knows (docs/serve.md lists those it takes); "
                         f"leave it out")
        elif field:
            parts.append(f"'{field}': {msg} (got {short(err.get('input'))})")
        else:
            parts.append(msg)
    return ApiError(400, "; ".join(parts[:6]), code="invalid_value", param=seen[0] or None)


def _is_union_branch(part) -> bool:
    # pydantic names the alternative of a union it tried: 'str', 'list[str]', 'constrained-str', ...
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or "-" in part)


def short(value) -> str:
    """A value as it is quoted in an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
