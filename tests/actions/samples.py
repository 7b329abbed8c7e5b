"""Notify actions as the operator API returns them, for the notifier's tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from diagnoser.actions.notify_wire import ActionView

DIAGNOSIS_ID = "6f1c2d3e-0000-4000-8000-00000000abcd"


def notify_action(action_id: int = 7, **target: Any) -> ActionView:
    at = datetime(2026, 12, 1, 11, 59, tzinfo=UTC)
    return ActionView(
        id=action_id,
        diagnosis_id=DIAGNOSIS_ID,
        job_id="llama-70b-run7",
        kind="notify",
        target={
            "audience": "oncall",
            "message": "node-3 lost a GPU; cordoned, job restarted from step 1200",
            "diagnosis_url": f"http://diagnoser.local/v1/diagnoses/{DIAGNOSIS_ID}",
            "summary": "Xid 79: GPU fell off the bus on node-3",
            "category": "hardware",
            "failure_type": "xid_79",
            "culprit_nodes": ["node-3"],
            "evidence": [
                "[node-3] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                "[node-1] NCCL watchdog timeout after 600000 ms",
            ],
            "namespace": "ml",
            "action": "cordon_node_and_restart",
            **target,
        },
        reason="xid 79 on node-3 (rule gpu-xid-79)",
        source="rules",
        idempotency_key=f"notify:oncall:{DIAGNOSIS_ID}",
        state="pending",
        created_at=at,
        updated_at=at,
    )
