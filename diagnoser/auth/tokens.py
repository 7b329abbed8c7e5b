"""API tokens: issued once, stored as a sha256 digest, checked in constant time.

A token reads `dgn_<id>_<secret>`: the public id (12 hex) finds the row, the secret (256 random
bits) is compared by digest with `hmac.compare_digest`. A slow password hash (argon2, bcrypt)
defends guessable secrets; these are random and 256 bits long, so one sha256 is as strong and
costs nothing per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import Connection, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from diagnoser.store.database import DatabaseUrl, create_sync_engine
from diagnoser.store.models import ApiTokenRow, utcnow

PREFIX = "dgn"
ID_BYTES = 6
SECRET_BYTES = 32


class Role(StrEnum):
    INGEST = "ingest"
    """POST logs and job events (bound to a node and a job pattern when issued so)."""
    READ = "read"
    """The on-call queries."""
    OPERATOR = "operator"
    """Claim, extend and complete recovery actions."""
    ADMIN = "admin"
    """Rules, filters, tokens, opt-outs, feedback; and everything the other roles may do."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A new token: `raw` is shown once and never stored."""

    row: ApiTokenRow
    raw: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def split(raw: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None (nothing about it is looked up)."""
    prefix, _, rest = raw.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != PREFIX or len(token_id) != 2 * ID_BYTES or not secret or len(secret) > 128:
        return None
    if any(ch not in "0123456789abcdef" for ch in token_id):
        return None
    return token_id, secret


def issue(
    session: Session,
    role: Role,
    *,
    node: str | None = None,
    jobs: str | None = None,
    expires_at: datetime | None = None,
    description: str = "",
    created_by: str = "cli",
) -> Issued:
    """Create a token row; the caller commits and shows `raw` once."""
    token_id = secrets.token_hex(ID_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    row = ApiTokenRow(
        id=token_id,
        digest=digest(secret),
        role=role.value,
        node=node,
        jobs=jobs,
        description=description,
        created_by=created_by,
        created_at=utcnow(),
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return Issued(row, f"{PREFIX}_{token_id}_{secret}")


class Rejection(StrEnum):
    MALFORMED = "malformed"
    UNKNOWN = "unknown"
    REVOKED = "revoked"
    EXPIRED = "expired"


def verify(session: Session, raw: str, now: datetime | None = None) -> ApiTokenRow | Rejection:
    """The token's row when it is valid now, else why not."""
    parts = split(raw)
    if parts is None:
        return Rejection.MALFORMED
    token_id, secret = parts
    row = session.get(ApiTokenRow, token_id)
    # Compared even when the id is unknown, so timing tells nothing about which ids exist.
    stored = row.digest if row is not None else digest("")
    if not hmac.compare_digest(digest(secret), stored) or row is None:
        return Rejection.UNKNOWN
    if row.revoked_at is not None:
        return Rejection.REVOKED
    if row.expires_at is not None and row.expires_at <= (now or utcnow()):
        return Rejection.EXPIRED
    return row


@dataclass(frozen=True, slots=True)
class Verified:
    """What a request needs of a valid token's row, detached from any session."""

    id: str
    role: str
    node: str | None
    jobs: str | None
    expires_at: datetime | None

    @classmethod
    def of(cls, row: ApiTokenRow) -> Verified:
        return cls(row.id, row.role, row.node, row.jobs, row.expires_at)


class TokenCache:
    """Tokens verified in the last `ttl_s` seconds, so that a request with one skips the
    database (each node's shipper sends its token with every upload: thousands a second).

    Revocation is honoured within `ttl_s`: an entry is trusted only that long after the read
    that verified it, and `forget` drops a token revoked through this process at once. Expiry
    is checked at every use. Only valid tokens are kept (keyed by the digest of the whole
    token, never the token), at most `max_entries`, least recently used dropped first.
    """

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[str, tuple[Verified, float]] = OrderedDict()

    def get(self, raw: str, now: datetime | None = None) -> Verified | None:
        if self.ttl_s <= 0:
            return None
        key = digest(raw)
        entry = self._entries.get(key)
        if entry is None:
            return None
        verified, read_at = entry
        expired = verified.expires_at is not None and verified.expires_at <= (now or utcnow())
        if expired or self.clock() - read_at >= self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return verified

    def put(self, raw: str, verified: Verified, read_at: float) -> None:
        """`read_at`: the clock when the database read that verified it began."""
        if self.ttl_s <= 0:
            return
        self._entries[digest(raw)] = (verified, read_at)
        self._entries.move_to_end(digest(raw))
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, token_id: str) -> None:
        """The token was revoked here: its next request reads the database."""
        for key in [k for k, (v, _) in self._entries.items() if v.id == token_id]:
            del self._entries[key]


def any_token(session: Session | Connection) -> bool:
    """Whether a token was ever issued (revoked and expired ones count: protection stays on)."""
    return session.scalar(select(ApiTokenRow.id).limit(1)) is not None


def listing(session: Session) -> list[ApiTokenRow]:
    return list(session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at)))


def revoke(session: Session, token_id: str) -> ApiTokenRow | None:
    """Mark the token revoked (idempotent); None when no such token."""
    row = session.get(ApiTokenRow, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def exist(database: DatabaseUrl) -> bool | None:
    """`any_token` for a command line: None when the database cannot be asked."""
    engine = create_sync_engine(database)
    try:
        with engine.connect() as connection:
            return any_token(connection)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
