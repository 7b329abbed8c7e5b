"""Nodes as on-call engineers see them: incident history and whether a cordon is recommended."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from diagnoser.api.deps import NodePath, Resources, ResourcesDep
from diagnoser.api.errors import ApiError, responses
from diagnoser.diagnosis.schemas import DiagnosisView, NodeDetail, NodeSummary
from diagnoser.store.diagnoses import ACTIVE, DiagnosisFilter, NodeStats, filtered, node_stats
from diagnoser.store.models import DiagnosisCulpritRow, DiagnosisRow

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


async def _cordon_recommended(resources: Resources) -> set[str]:
    async with resources.sessions() as session:
        rows = await session.execute(
            select(DiagnosisCulpritRow.node)
            .join(DiagnosisRow, DiagnosisRow.id == DiagnosisCulpritRow.diagnosis_id)
            .where(
                DiagnosisRow.status.in_(ACTIVE),
                DiagnosisRow.action == "cordon_node_and_restart",
            )
        )
        return {node for (node,) in rows}


def _summary(stats: NodeStats, cordon: set[str], last_type: str | None) -> NodeSummary:
    return NodeSummary(
        node=stats.node,
        incidents=stats.incidents,
        last_incident_at=stats.last_incident_at,
        last_failure_type=last_type,
        cordon_recommended=stats.node in cordon,
    )


@router.get("", response_model=list[NodeSummary])
async def list_nodes(resources: ResourcesDep) -> list[NodeSummary]:
    """Every node ever named as a culprit, most recent incident first."""
    async with resources.sessions() as session:
        stats = await node_stats(session)
    cordon = await _cordon_recommended(resources)
    return [_summary(s, cordon, None) for s in stats]


@router.get(
    "/{node}",
    response_model=NodeDetail,
    responses=responses(404, described={404: "never named as a culprit"}),
)
async def get_node(
    node: NodePath, resources: ResourcesDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> NodeDetail:
    async with resources.sessions() as session:
        stats = await node_stats(session, node)
        history = list(await session.scalars(filtered(DiagnosisFilter(node=node)).limit(limit)))
    if not stats:
        raise ApiError(404, "not_found", f"node {node!r} was never named as a culprit")
    cordon = await _cordon_recommended(resources)
    summary = _summary(stats[0], cordon, history[0].failure_type if history else None)
    return NodeDetail(
        **summary.model_dump(), history=[DiagnosisView.model_validate(h) for h in history]
    )
