"""The active rule pack: what is loaded, and reloading it on request."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

from diagnoser.api.deps import Resources, ResourcesDep
from diagnoser.api.errors import ApiError, ErrorBody
from diagnoser.rules import RuleLoadError

router = APIRouter(prefix="/v1/rules", tags=["rules"])


class RuleView(BaseModel):
    id: str
    file: str
    description: str
    failure_type: str
    category: str
    severity: str
    scope: str
    action: str


class RuleSetView(BaseModel):
    digest: str
    loaded_at: datetime
    directory: str
    prefilter: str
    rules: list[RuleView]
    last_reload_errors: list[str]
    """Why the last reload was rejected (the set above stayed active); empty after a success."""


class RulesRejectedBody(ErrorBody):
    problems: list[str]
    """One line per problem: file, rule and what is wrong."""


def _view(resources: Resources) -> RuleSetView:
    reloader = resources.reloader
    active = reloader.registry.active
    return RuleSetView(
        digest=active.digest,
        loaded_at=reloader.loaded_at,
        directory=str(reloader.registry.directory),
        prefilter=active.prefilter.name,
        rules=[
            RuleView(
                id=rule.spec.id,
                file=rule.file,
                description=rule.spec.description,
                failure_type=rule.spec.failure_type,
                category=rule.spec.category.value,
                severity=rule.spec.severity.value,
                scope=rule.spec.scope.value,
                action=rule.spec.action.value,
            )
            for rule in active.rules
        ],
        last_reload_errors=[str(problem) for problem in reloader.last_error],
    )


@router.get("", response_model=RuleSetView)
async def get_rules(resources: ResourcesDep) -> RuleSetView:
    return _view(resources)


@router.post(
    "/reload",
    response_model=RuleSetView,
    responses={422: {"model": RulesRejectedBody, "description": "rejected; the active set stays"}},
)
async def reload_rules(resources: ResourcesDep) -> RuleSetView:
    """Validate the rule files again; on any problem the active set stays and 422 says why."""
    try:
        await resources.reloader.reload()
    except RuleLoadError as exc:
        raise ApiError(
            422,
            "invalid_rules",
            f"rule files rejected; digest {resources.reloader.registry.digest} stays active",
            problems=[str(problem) for problem in exc.problems],
        ) from exc
    return _view(resources)
