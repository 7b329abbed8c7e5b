"""The Kubernetes side of the operator: the official client's APIs, built once per process.

The official `kubernetes` client is synchronous. The operator calls it from worker threads
(`asyncio.to_thread`), one action at a time per thread, so that the claim loop, lease extension
and SIGTERM handling keep running while a call or a verification wait blocks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

RETRYABLE_STATUSES = frozenset({0, 409, 429, 500, 502, 503, 504})
"""409 is a lost optimistic-concurrency race (re-read and try again); 0 is no HTTP answer."""


@dataclass(frozen=True)
class Cluster:
    api: client.ApiClient
    core: client.CoreV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi

    @classmethod
    def from_api_client(cls, api: client.ApiClient) -> Cluster:
        return cls(
            api=api,
            core=client.CoreV1Api(api),
            batch=client.BatchV1Api(api),
            custom=client.CustomObjectsApi(api),
        )

    def plain(self, obj: object) -> dict[str, Any]:
        """A typed model as the JSON the API server sent (camelCase keys, no None fields)."""
        data = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        return data


def connect(kubeconfig: str | None) -> Cluster:
    """In-cluster service account when there is no kubeconfig and we run in a pod."""
    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    return Cluster.from_api_client(client.ApiClient(configuration))


def connect_url(url: str) -> Cluster:
    """A plain-HTTP API server without credentials (tests: the kmock emulator on loopback)."""
    configuration = client.Configuration()
    configuration.host = url.rstrip("/")
    return Cluster.from_api_client(client.ApiClient(configuration))


def describe(exc: ApiException) -> str:
    """One line for a completion message: status, reason and the server's message if any."""
    head = f"Kubernetes API {exc.status} {exc.reason or ''}".rstrip()
    message = _status_message(exc)
    return f"{head}: {message}" if message else head


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:300] if message else ""


def is_retryable(exc: ApiException) -> bool:
    return (exc.status or 0) in RETRYABLE_STATUSES


def is_not_found(exc: ApiException) -> bool:
    return bool(exc.status == 404)


def is_conflict(exc: ApiException) -> bool:
    return bool(exc.status == 409)
