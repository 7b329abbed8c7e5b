"""An unexpected error, over a real keep-alive connection to the real app under uvicorn."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from diagnoser.app import create_app
from diagnoser.auth.roles import POLICY, READ
from diagnoser.config import Settings
from tests.servers import free_port, wait_until


@pytest.fixture(params=["h11", "httptools"])
def failing_service(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[int]:
    """The service's app with one route that fails as a bug would; yields its port."""
    monkeypatch.setitem(POLICY, ("GET", "/v1/fail"), READ)  # a route needs an access rule
    app = create_app(Settings(data_dir=tmp_path, rules_watch=False))

    async def fail() -> None:
        raise RuntimeError("a bug the handler did not expect")

    app.add_api_route("/v1/fail", fail)
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="critical", http=request.param
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "uvicorn")
    yield port
    server.should_exit = True
    thread.join(15)


def test_a_500_is_json_and_tells_a_keep_alive_client_the_connection_closes(
    failing_service: int,
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", failing_service, timeout=10)
    try:
        connection.request("GET", "/v1/fail")
        response = connection.getresponse()
        body = json.loads(response.read())
        assert response.status == 500
        assert body["error"] == "internal_error"
        assert "a bug" not in body["detail"]
        assert response.getheader("Connection") == "close"
        # A client that honours the header opens a new connection for its next request, instead
        # of writing into the one the server is closing.
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
    finally:
        connection.close()
