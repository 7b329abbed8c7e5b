"""Tokens over their life: stored as digests, refused once expired or revoked, every admin
change in the audit log."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from diagnoser.auth import tokens
from diagnoser.auth.tokens import Rejection, Role
from diagnoser.store.database import create_sync_engine, parse_database_url
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import ApiTokenRow, utcnow
from tests.auth.issuing import Token, create_token
from tests.servers import ServiceProcess, run_diagnoser


def test_only_a_digest_is_stored_and_the_check_is_exact(tmp_path: Path) -> None:
    database = parse_database_url(f"sqlite:///{tmp_path / 'diagnoser.db'}")
    upgrade(database)
    with Session(create_sync_engine(database)) as session, session.begin():
        issued = tokens.issue(session, Role.READ)
        raw = issued.raw
        assert tokens.verify(session, raw) is issued.row
        assert tokens.verify(session, raw[:-1] + ("A" if raw[-1] != "A" else "B")) is (
            Rejection.UNKNOWN
        )
        assert tokens.verify(session, "Bearer") is Rejection.MALFORMED
        assert tokens.verify(session, raw, utcnow() + timedelta(days=1)) is issued.row
    dump = "\n".join(sqlite3.connect(tmp_path / "diagnoser.db").iterdump())
    secret = raw.split("_", 2)[2]
    assert secret not in dump
    assert tokens.digest(secret) in dump


def test_a_cached_token_is_trusted_for_the_cache_time_only(tmp_path: Path) -> None:
    """The cache skips the database for `ttl_s` after a read: a revocation made elsewhere is
    honoured once that runs out, and expiry at every use."""
    database = parse_database_url(f"sqlite:///{tmp_path / 'diagnoser.db'}")
    upgrade(database)
    now = [1000.0]
    cache = tokens.TokenCache(5.0, clock=lambda: now[0])
    with Session(create_sync_engine(database)) as session, session.begin():
        issued = tokens.issue(session, Role.INGEST, node="node-a")
        soon = tokens.issue(session, Role.READ, expires_at=utcnow() + timedelta(seconds=30))
        issued_id = issued.row.id
    for token in (issued, soon):
        with Session(create_sync_engine(database)) as session:
            row = tokens.verify(session, token.raw)
            assert isinstance(row, ApiTokenRow)
            cache.put(token.raw, tokens.Verified.of(row), now[0])
    with Session(create_sync_engine(database)) as session, session.begin():
        tokens.revoke(session, issued_id)
    now[0] += 4.9
    cached = cache.get(issued.raw)
    assert cached is not None  # within the cache time
    assert cached.node == "node-a"
    assert cache.get(soon.raw, utcnow() + timedelta(seconds=31)) is None  # expired: dropped
    now[0] += 0.1
    assert cache.get(issued.raw) is None  # the next request reads the database: revoked
    with Session(create_sync_engine(database)) as session:
        assert tokens.verify(session, issued.raw) is Rejection.REVOKED
    assert tokens.TokenCache(0.0).get(issued.raw) is None


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def admin(data_dir: Path) -> Token:
    return create_token(data_dir, "admin")


@pytest.fixture
def service(data_dir: Path, admin: Token) -> Iterator[ServiceProcess]:
    # A 2 s token cache (30 s by default): a token revoked elsewhere is refused within it.
    env = {"DIAGNOSER_DATA_DIR": str(data_dir), "DIAGNOSER_AUTH__TOKEN_CACHE_S": "2"}
    process = ServiceProcess(env=env)
    process.start()
    yield process
    process.stop()


def test_an_expired_token_is_refused(service: ServiceProcess, data_dir: Path) -> None:
    database = parse_database_url(f"sqlite:///{data_dir / 'diagnoser.db'}")
    with Session(create_sync_engine(database)) as session, session.begin():
        expired = tokens.issue(session, Role.READ, expires_at=utcnow() - timedelta(seconds=1))
        live = tokens.issue(session, Role.READ, expires_at=utcnow() + timedelta(days=30))
    url = f"{service.base_url}/v1/jobs"
    refused = httpx.get(url, headers={"Authorization": f"Bearer {expired.raw}"})
    assert refused.status_code == 401
    assert refused.json()["detail"] == "the bearer token has expired"
    assert httpx.get(url, headers={"Authorization": f"Bearer {live.raw}"}).status_code == 200


def test_a_revoked_token_is_refused_from_the_next_request(
    service: ServiceProcess, data_dir: Path
) -> None:
    reader = create_token(data_dir, "read", "--expires", "30d")
    url = f"{service.base_url}/v1/jobs"
    assert httpx.get(url, headers=reader.headers).status_code == 200
    result = run_diagnoser(  # the console script itself, in its own process
        "token", "revoke", reader.id, "--data-dir", str(data_dir), child=True
    )
    assert result.returncode == 0, result.stderr
    # Revoked outside the service: refused once its cache entry runs out (TOKEN_CACHE_S).
    deadline = time.monotonic() + 60
    while (refused := httpx.get(url, headers=reader.headers)).status_code == 200:
        assert time.monotonic() < deadline, "the revoked token still works"
        time.sleep(0.2)
    assert refused.status_code == 401
    assert refused.json()["detail"] == "the bearer token was revoked"
    listed = run_diagnoser("token", "list", "--json", "--data-dir", str(data_dir))
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows[reader.id]["revoked_at"] is not None
    assert rows[reader.id]["expires_at"] is not None
    assert reader.raw not in listed.stdout


def test_admin_changes_are_audited_with_the_token_that_made_them(
    service: ServiceProcess, admin: Token
) -> None:
    base = service.base_url
    assert (
        httpx.post(f"{base}/v1/rules/reload", headers=admin.headers, timeout=60).status_code == 200
    )
    created = httpx.post(
        f"{base}/v1/tokens",
        json={"role": "ingest", "node": "node-a", "jobs": "train-*", "expires_in_s": 3600},
        headers=admin.headers,
    )
    assert created.status_code == 201, created.text
    new = created.json()
    assert new["token"].startswith("dgn_")
    bound = {"Authorization": f"Bearer {new['token']}"}
    posted = httpx.post(f"{base}/v1/jobs/train-1/logs?node=node-a", content=b"x\n", headers=bound)
    assert posted.status_code == 200, posted.text  # verified, and now in the token cache
    revoked = httpx.delete(f"{base}/v1/tokens/{new['id']}", headers=admin.headers)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    # Revoked through this replica: the cached token is refused from the next request.
    again = httpx.post(f"{base}/v1/jobs/train-1/logs?node=node-a", content=b"y\n", headers=bound)
    assert again.status_code == 401
    page = httpx.get(f"{base}/v1/audit", headers=admin.headers).json()
    seen = [(e["actor"], e["action"], e["subject"]) for e in page["entries"]]
    assert seen[:3] == [
        (admin.id, "token.revoke", new["id"]),
        (admin.id, "token.create", new["id"]),
        (admin.id, "rules.reload", seen[2][2]),
    ]
    assert seen[-1][1] == "token.create"  # the admin token itself, made on the command line
    assert seen[-1][0].startswith("cli")
    assert "token" not in json.dumps(page["entries"][1]["detail"])


def test_only_ingest_tokens_are_bound(
    service: ServiceProcess, admin: Token, data_dir: Path
) -> None:
    refused = httpx.post(
        f"{service.base_url}/v1/tokens", json={"role": "read", "node": "n1"}, headers=admin.headers
    )
    assert refused.status_code == 422
    cli = run_diagnoser("token", "create", "--role", "read", "--node", "n1", "--data-dir",
                        str(data_dir))  # fmt: skip
    assert cli.returncode == 2
    assert "bind ingest tokens only" in cli.stderr
