"""One JSON shape for every error: `{"error": code, "detail": message, ...}`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    431: "request_header_fields_too_large",
    503: "unavailable",
}


DESCRIPTIONS = {
    400: "The body is not valid JSON (or nested too deeply)",
    401: "No valid bearer token (missing, unknown, revoked or expired)",
    403: "The token's role or binding does not allow this",
    404: "No such resource",
    408: "The body stopped arriving; what came is committed (`next_offset`)",
    409: "Conflict with the stored state",
    413: "The body is over the size limit",
    415: "Unsupported content type or encoding",
    422: "Invalid parameters or body; `detail` says which and why",
    429: "Too busy: retry after `Retry-After` seconds",
    503: "Not ready, or the database is unreachable: retry after `Retry-After` seconds",
}


class ErrorBody(BaseModel):
    """What every error answer carries; some add fields (`expected_offset`, `problems`)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="A stable code such as `not_found` or `invalid_request`.")
    detail: str = Field(description="What went wrong, for people.")


def responses(
    *statuses: int, described: Mapping[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route's error statuses, all with the ErrorBody schema."""
    described = described or {}
    return {
        status: {
            "model": ErrorBody,
            "description": described.get(status, DESCRIPTIONS.get(status, "Error")),
        }
        for status in statuses
    }


class OffsetGapBody(ErrorBody):
    expected_offset: int = Field(description="The committed offset: resend from here.")


class TimeoutBody(ErrorBody):
    next_offset: int = Field(description="What was committed before the body stalled.")


RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}}

DATABASE_RETRY_AFTER_S = 2
"""What a client is told to wait while the database is unreachable: a restart takes seconds."""


def database_unavailable(exc: BaseException) -> bool:
    """The database could not be reached or dropped the connection: a transient outage.

    Such errors are no bug of the request, and retrying once the server is back succeeds:
    the pool's pre-ping replaces the dead connections, so no restart of the service is needed.
    """
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc,
        sa_exc.OperationalError
        | sa_exc.InterfaceError
        | sa_exc.DisconnectionError
        | sa_exc.TimeoutError,  # the pool's: every connection busy or being re-established
    )


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers
        self.extra = extra


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        {"error": code, "detail": detail, **extra}, status_code=status, headers=headers
    )


def _publish_error_schema(app: FastAPI) -> None:
    """Document the 422 that FastAPI adds to every route with parameters as the body we send.

    FastAPI's default describes its own `{"detail": [...]}`; `_invalid` below answers ErrorBody.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("ErrorBody", ErrorBody.model_json_schema())
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                answers = operation.get("responses", {})
                if "422" in answers and "HTTPValidationError" in str(answers["422"]):
                    answers["422"] = {
                        "description": DESCRIPTIONS[422],
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ErrorBody"}
                            }
                        },
                    }
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _where(loc: Sequence[object]) -> str:
    """`body.ts`, without pydantic's names for union members (`function-after[...]`)."""
    return ".".join(str(part) for part in loc if isinstance(part, int) or str(part).isidentifier())


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes on this path: Starlette's 405 names only the first route's."""
    routes = request.app.router.routes
    return [
        method
        for method in METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]


def install(app: FastAPI) -> None:
    _publish_error_schema(app)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_where(error['loc'])}: {error['msg']}" for error in exc.errors()]
        return error_response(422, "invalid_request", "; ".join(dict.fromkeys(problems)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = STATUS_CODES.get(exc.status_code, "error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return error_response(exc.status_code, code, str(exc.detail), headers)

    @app.exception_handler(sa_exc.SQLAlchemyError)
    async def _database(_: Request, exc: sa_exc.SQLAlchemyError) -> JSONResponse:
        if not database_unavailable(exc):
            raise exc  # a bug, not an outage: the generic 500 below
        # Ingest has committed what it could; a client resends the rest from `next_offset`.
        return error_response(
            503,
            "database_unavailable",
            f"the database is unreachable ({type(getattr(exc, 'orig', None) or exc).__name__}): "
            f"retry after {DATABASE_RETRY_AFTER_S}s",
            {"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this answer and uvicorn then closes the connection: say so,
        # or a keep-alive client sends its next request into a socket that is going away.
        del exc  # uvicorn logs the traceback; the client gets no internals
        return error_response(
            500,
            "internal_error",
            "unexpected server error; the server log has the details",
            {"Connection": "close"},
        )
