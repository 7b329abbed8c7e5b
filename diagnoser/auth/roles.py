"""Who may call what: ONE table, keyed by (method, path template), applied by one dependency.

A new route needs one entry in `POLICY`; a route without one is refused to everybody (and
tests/auth/test_route_table.py, generated from the app's routes, fails). `admin` is in every
entry: it may do what any other role may.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from diagnoser.api.errors import ApiError
from diagnoser.auth.binding import Binding
from diagnoser.auth.tokens import Rejection, Role, TokenCache, Verified, any_token, verify
from diagnoser.config import AuthSettings, Settings
from diagnoser.store.database import Sessions

log = logging.getLogger("diagnoser.auth")


class Open(StrEnum):
    """When a route answers without a token."""

    ALWAYS = "always"
    HEALTH = "health"
    """Unless DIAGNOSER_AUTH__OPEN_HEALTH=false."""
    METRICS = "metrics"
    """Unless DIAGNOSER_AUTH__OPEN_METRICS=false."""


@dataclass(frozen=True, slots=True)
class Access:
    roles: frozenset[Role]
    open: Open | None = None


def allow(*roles: Role) -> Access:
    return Access(frozenset({*roles, Role.ADMIN}))


ANY_ROLE = frozenset(Role)
PUBLIC = Access(ANY_ROLE, Open.ALWAYS)
INGEST = allow(Role.INGEST)
READ = allow(Role.READ)
ADMIN = allow()
OPERATOR = allow(Role.OPERATOR)
WATCH_ACTIONS = allow(Role.READ, Role.OPERATOR)

POLICY: dict[tuple[str, str], Access] = {
    # health and the API description
    ("GET", "/healthz"): Access(ANY_ROLE, Open.HEALTH),
    ("GET", "/readyz"): Access(ANY_ROLE, Open.HEALTH),
    ("GET", "/metrics"): Access(frozenset({Role.READ, Role.ADMIN}), Open.METRICS),
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/static-offline-docs"): PUBLIC,
    # ingest (a bound token: its own node, jobs matching its pattern)
    ("POST", "/v1/jobs/{job_id}/logs"): INGEST,
    ("GET", "/v1/jobs/{job_id}/logs"): allow(Role.INGEST, Role.READ),
    ("PUT", "/v1/jobs/{job_id}"): INGEST,
    ("POST", "/v1/jobs/{job_id}/events"): INGEST,
    # the on-call queries
    ("GET", "/v1/jobs"): READ,
    ("GET", "/v1/jobs/{job_id}"): READ,
    ("GET", "/v1/jobs/{job_id}/diagnoses"): READ,
    ("GET", "/v1/jobs/{job_id}/log"): READ,
    ("GET", "/v1/jobs/{job_id}/templates"): READ,
    ("GET", "/v1/diagnoses"): READ,
    ("GET", "/v1/diagnoses/stream"): READ,
    ("GET", "/v1/diagnoses/{diagnosis_id}"): READ,
    ("GET", "/v1/diagnoses/{diagnosis_id}/feedback"): READ,
    ("GET", "/v1/nodes"): READ,
    ("GET", "/v1/nodes/{node}"): READ,
    ("GET", "/v1/filters"): READ,
    ("GET", "/v1/rules"): READ,
    ("GET", "/v1/rules/suggestions"): READ,
    # admin changes (each one is audited)
    ("POST", "/v1/diagnoses/{diagnosis_id}/feedback"): ADMIN,
    ("PATCH", "/v1/filters/{filter_id}"): ADMIN,
    ("POST", "/v1/rules/reload"): ADMIN,
    ("POST", "/v1/rules/suggestions/{suggestion_id}/accept"): ADMIN,
    ("GET", "/v1/audit"): ADMIN,
    ("GET", "/v1/tokens"): ADMIN,
    ("POST", "/v1/tokens"): ADMIN,
    ("DELETE", "/v1/tokens/{token_id}"): ADMIN,
    # recovery actions (issue 14): operators claim and complete, on-call watches
    ("POST", "/v1/actions/claim"): OPERATOR,
    # (action ids route only as integers, so `/claim` and `/stream` are never read as ids)
    ("POST", "/v1/actions/{action_id:int}/complete"): OPERATOR,
    ("POST", "/v1/actions/{action_id:int}/extend"): OPERATOR,
    ("GET", "/v1/actions"): WATCH_ACTIONS,
    ("GET", "/v1/actions/stream"): WATCH_ACTIONS,
    ("GET", "/v1/actions/{action_id:int}"): WATCH_ACTIONS,
    ("PUT", "/v1/nodes/{node}/opt-out"): ADMIN,
    ("DELETE", "/v1/nodes/{node}/opt-out"): ADMIN,
    ("PUT", "/v1/jobs/{job_id}/opt-out"): ADMIN,
    ("DELETE", "/v1/jobs/{job_id}/opt-out"): ADMIN,
}


def access_for(method: str, template: str) -> Access | None:
    """The table's entry; HEAD is answered like GET."""
    return POLICY.get(("GET" if method == "HEAD" else method, template))


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: a token, or nobody on a route or service that is open."""

    actor: str
    """The token id, `open` (no tokens, loopback) or `anonymous` (a public route)."""
    role: Role | None
    binding: Binding = field(default_factory=Binding)


OPEN = Principal("open", None)
ANONYMOUS = Principal("anonymous", None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


TOKEN_HINT = "create one with `diagnoser token create --role admin` (same database settings)"


def startup_problem(settings: AuthSettings, host: str, tokens: bool | None) -> str | None:
    """Why the service must not start with these settings, or None. `tokens` is None when the
    database could not be asked (the service then starts protected: nothing is let in)."""
    loopback = is_loopback(host)
    if settings.enabled is False:
        if loopback:
            return None
        return f"DIAGNOSER_AUTH__ENABLED=false is accepted on loopback only, not on {host}"
    if tokens is False and (settings.enabled is True or not loopback):
        where = "" if settings.enabled else f" and the service would listen on {host}"
        return f"no API token exists{where}: {TOKEN_HINT}"
    return None


OPEN_WARNING = (
    "AUTHENTICATION IS OFF: no API token exists, so every request is answered without one. "
    "This is allowed on loopback only; " + TOKEN_HINT + " to turn it on."
)


class StartRefusedError(RuntimeError):
    """The settings would leave the service open where it must not be."""


async def check_start(settings: Settings, sessions: Sessions) -> None:
    """Refuse an open service off loopback; say loudly when it runs open on loopback."""
    try:
        tokens: bool | None = await sessions.run(any_token)
    except Exception as exc:  # the database is down or not migrated: start, protected
        log.warning("cannot tell whether API tokens exist (%s): starting protected", exc)
        tokens = None
    problem = startup_problem(settings.auth, settings.host, tokens)
    if problem is not None:
        log.error("%s", problem)
        raise StartRefusedError(problem)
    if settings.auth.enabled is False:
        log.warning("AUTHENTICATION IS OFF: DIAGNOSER_AUTH__ENABLED=false (loopback only)")
    elif tokens is False:
        log.warning("%s", OPEN_WARNING)


class Gate:
    """Whether the service is protected right now.

    Protected once any token exists (checked at most every RECHECK_S while open, and never
    turned off again); always protected off loopback; open when `enabled=false` on loopback.
    `tokens` holds the tokens verified lately (`DIAGNOSER_AUTH__TOKEN_CACHE_S`).
    """

    RECHECK_S = 1.0

    def __init__(self, settings: AuthSettings, host: str, sessions: Sessions) -> None:
        self.settings = settings
        self.sessions = sessions
        loopback = is_loopback(host)
        self._forced_open = settings.enabled is False and loopback
        self._protected = not self._forced_open and (settings.enabled is True or not loopback)
        self._checked_at = float("-inf")
        self.tokens = TokenCache(settings.token_cache_s)

    async def protected(self) -> bool:
        if self._forced_open:
            return False
        if self._protected:
            return True
        now = time.monotonic()
        if now - self._checked_at >= self.RECHECK_S:
            self._checked_at = now
            if await self.sessions.run(any_token):
                log.warning("an API token exists now: authentication is on")
                self._protected = True
        return self._protected


bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer dgn_...`, a token from `diagnoser token create`.",
)

REJECTED = {
    Rejection.MALFORMED: "the bearer token is not a diagnoser token (dgn_...)",
    Rejection.UNKNOWN: "unknown bearer token",
    Rejection.REVOKED: "the bearer token was revoked",
    Rejection.EXPIRED: "the bearer token has expired",
}


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


async def _authenticate(request: Request, raw: str) -> Principal:
    gate: Gate = request.app.state.gate
    cache = gate.tokens
    verified = cache.get(raw)
    if verified is None:
        sessions: Sessions = request.app.state.resources.sessions
        read_at = cache.clock()
        async with sessions() as session:
            found = await session.run_sync(lambda s: verify(s, raw))
        if isinstance(found, Rejection):
            raise _unauthorized(REJECTED[found])
        verified = Verified.of(found)
        cache.put(raw, verified, read_at)
    return Principal(verified.id, Role(verified.role), Binding(verified.node, verified.jobs))


def _check_binding(request: Request, binding: Binding) -> None:
    """Path and query names every route shares: `job_id`, `node`, `stream`."""
    job_id = request.path_params.get("job_id")
    problems = [
        binding.job_problem(job_id) if isinstance(job_id, str) else None,
        binding.node_problem(request.path_params.get("node") or request.query_params.get("node")),
        binding.stream_problem(request.query_params.get("stream")),
    ]
    problem = next((p for p in problems if p), None)
    if problem:
        raise ApiError(403, "forbidden", problem)


async def authorize(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The one check every API route runs (installed on the app in diagnoser/app.py)."""
    route = request.scope.get("route")
    template = getattr(route, "path", "")
    access = access_for(request.method, template)
    if access is None:
        raise ApiError(403, "forbidden", f"no access rule for {request.method} {template}")
    settings: AuthSettings = request.app.state.resources.settings.auth
    public = _is_public(access, settings)
    gate: Gate = request.app.state.gate
    if public:
        principal = ANONYMOUS
    elif not await gate.protected():
        principal = OPEN
    else:
        if credentials is None:
            raise _unauthorized("this route needs `Authorization: Bearer <token>`")
        principal = await _authenticate(request, credentials.credentials)
        assert principal.role is not None
        if principal.role not in access.roles:
            allowed = ", ".join(sorted(access.roles))
            raise ApiError(
                403,
                "forbidden",
                f"role {principal.role} may not {request.method} {template} (allowed: {allowed})",
            )
        _check_binding(request, principal.binding)
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(authorize)]
"""The caller, for routes that act on who it is (binding of record bodies, the audit log)."""


def document(app: FastAPI, settings: AuthSettings) -> None:
    """The OpenAPI document says which operations answer without a token: those get
    `security: []` and no 401/403, so clients and schema checkers see what the table says."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                access = access_for(method.upper(), path)
                if access is not None and _is_public(access, settings):
                    operation["security"] = []
                    for status in ("401", "403"):
                        operation.get("responses", {}).pop(status, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _is_public(access: Access, settings: AuthSettings) -> bool:
    return access.open is Open.ALWAYS or (
        (access.open is Open.HEALTH and settings.open_health)
        or (access.open is Open.METRICS and settings.open_metrics)
    )
