"""Servers for the shipper's tests: the contract server and the real service, each behind a
`CuttingProxy` so that disconnects are real."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from diagnoser.shipper.schemas import StreamState
from tests.servers import ServiceProcess
from tests.shipper.contract_server import ContractServer, CuttingProxy, UvicornThread


@dataclass
class LogServer:
    """A server speaking the log-upload contract, reached through `proxy` at `url`."""

    url: str
    proxy: CuttingProxy
    contract: ContractServer | None = None
    token: str | None = None

    def state(self, job: str, node: str, rank: int | None = None) -> StreamState | None:
        params: dict[str, str | int] = {"node": node}
        if rank is not None:
            params["rank"] = rank
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = httpx.get(f"{self.url}/v1/jobs/{job}/logs", params=params, headers=headers)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return StreamState.model_validate_json(response.content)

    def committed(self, job: str, node: str) -> int:
        state = self.state(job, node)
        return 0 if state is None else state.committed_offset


@pytest.fixture
def job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def contract_server() -> Iterator[LogServer]:
    contract = ContractServer(commit_every_bytes=16 * 1024)
    server = UvicornThread(contract.app)
    server.start()
    proxy = CuttingProxy(server.port)
    yield LogServer(url=proxy.url, proxy=proxy, contract=contract)
    proxy.close()
    server.stop()


@pytest.fixture(scope="module")
def real_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """`diagnoser serve` itself."""
    service = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data"))})
    service.start()
    yield service
    service.stop()


@pytest.fixture
def real_server(real_service: ServiceProcess) -> Iterator[LogServer]:
    """The real service behind a fresh proxy; tests keep apart by using their own job ids."""
    proxy = CuttingProxy(real_service.port)
    yield LogServer(url=proxy.url, proxy=proxy)
    proxy.close()


@pytest.fixture(params=["contract", "real"])
def log_server(request: pytest.FixtureRequest) -> LogServer:
    """Each contract test runs against the contract server and against the real service."""
    server: LogServer = request.getfixturevalue(f"{request.param}_server")
    return server
