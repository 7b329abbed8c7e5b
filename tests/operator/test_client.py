"""The action API client over real HTTP: the contract's answers become typed errors."""

from __future__ import annotations

import pytest

from diagnoser.operator.client import (
    ActionApiError,
    ActionClient,
    ActionNotFoundError,
    LeaseLostError,
)
from diagnoser.operator.wire import (
    ActionKind,
    ClaimRequest,
    CompleteRequest,
    CompletionStatus,
    ExtendRequest,
)
from tests.operator.actionserver import ScriptedActions, serving
from tests.operator.conftest import action
from tests.operator.test_cordon import CORDON


async def test_claim_complete_and_the_refusals() -> None:
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    async with serving(script) as url, ActionClient(url, token="t0k") as client:
        claimed = await client.claim(ClaimRequest(operator_id="op-a", max=5, wait_seconds=0))
        assert [a.id for a in claimed] == [1]
        assert claimed[0].lease_owner == "op-a"
        assert await client.claim(ClaimRequest(operator_id="op-b", wait_seconds=0)) == []

        extended = await client.extend(1, ExtendRequest(operator_id="op-a", lease_seconds=30))
        assert extended.id == 1
        with pytest.raises(LeaseLostError):
            await client.extend(1, ExtendRequest(operator_id="op-b"))

        done = CompleteRequest(operator_id="op-a", status=CompletionStatus.DONE, message="ok")
        with pytest.raises(LeaseLostError):
            await client.complete(1, done.model_copy(update={"operator_id": "op-b"}))
        assert (await client.complete(1, done)).id == 1
        assert (await client.complete(1, done)).id == 1  # the same completion again
        with pytest.raises(ActionNotFoundError):
            await client.complete(99, done)
    assert set(script.authorizations) == {"Bearer t0k"}
    sent = script.completions[-1][1]
    assert "result" not in sent  # optional fields are left out, not sent as null


async def test_a_server_error_and_no_server_are_retryable() -> None:
    script = ScriptedActions(failing_claims=1)
    async with serving(script) as url, ActionClient(url) as client:
        with pytest.raises(ActionApiError) as caught:
            await client.claim(ClaimRequest(operator_id="op-a"))
        assert caught.value.status == 503
        assert caught.value.retryable
    async with ActionClient(url, timeout=2) as gone:
        with pytest.raises(ActionApiError) as caught:
            await gone.claim(ClaimRequest(operator_id="op-a"))
        assert caught.value.status == 0
        assert caught.value.retryable
