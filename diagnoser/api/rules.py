"""The active rule pack: what is loaded, and reloading it on request."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

import anyio
from fastapi import APIRouter, Path
from pydantic import BaseModel

from diagnoser.api.deps import Resources, ResourcesDep
from diagnoser.api.errors import ApiError, ErrorBody, responses
from diagnoser.auth.audit import log_change
from diagnoser.auth.roles import PrincipalDep
from diagnoser.llm.suggestions import Suggestion, Withheld, rule_id, suggest
from diagnoser.rules import RuleLoadError
from diagnoser.rules.learned import LEARNED_FILE, add_rule, snippet
from diagnoser.store.history import llm_resolutions

router = APIRouter(prefix="/v1/rules", tags=["rules"])

RESOLUTION_WINDOW = 1000
"""Suggestions are counted over the most recent LLM-decided diagnoses, this many at most."""
SuggestionId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


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
async def reload_rules(resources: ResourcesDep, principal: PrincipalDep) -> RuleSetView:
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
    digest = resources.reloader.registry.digest
    await log_change(resources.sessions, principal.actor, "rules.reload", digest)
    return _view(resources)


class SuggestionView(BaseModel):
    id: str
    rule_id: str
    failure_type: str
    category: str
    action: str
    scope: str
    pattern: str
    jobs: int
    """Jobs whose LLM-decided diagnosis agreed on this outcome for lines of this pattern."""
    agreement: float
    """Their share of all such jobs (people's overrides included)."""
    diagnoses: list[str]
    examples_match: list[str]
    yaml: str
    """The rule as an entry of a rule file's `rules:` list: what accepting writes."""


class WithheldView(BaseModel):
    id: str
    pattern: str
    jobs: int
    reason: str


class SuggestionsView(BaseModel):
    suggestions: list[SuggestionView]
    withheld: list[WithheldView]
    """Failures resolved often enough that are still not offered as a rule, and why."""
    suggest_after: int


class AcceptedView(BaseModel):
    suggestion: SuggestionView
    file: str
    """The rule file, inside the rule directory, that now holds the rule."""
    rules: RuleSetView


def _suggestion_view(suggestion: Suggestion) -> SuggestionView:
    rule = suggestion.rule
    return SuggestionView(
        id=suggestion.id,
        rule_id=rule.id,
        failure_type=rule.failure_type,
        category=rule.category.value,
        action=rule.action.value,
        scope=rule.scope.value,
        pattern=rule.patterns[0],
        jobs=suggestion.jobs,
        agreement=round(suggestion.share, 3),
        diagnoses=list(suggestion.diagnoses[:20]),
        examples_match=list(rule.examples.match),
        yaml=snippet(rule),
    )


async def _suggestions(resources: Resources) -> tuple[list[Suggestion], list[Withheld]]:
    """Derived on request from the stored verdicts; what the active pack holds is not offered."""
    async with resources.sessions() as session:
        resolutions = await llm_resolutions(session, RESOLUTION_WINDOW)
    llm = resources.settings.llm
    offered, withheld = await anyio.to_thread.run_sync(
        lambda: suggest(resolutions, after=llm.suggest_after, min_share=llm.min_agreement)
    )
    active = resources.reloader.registry.active.by_id
    return [s for s in offered if s.rule.id not in active], withheld


@router.get("/suggestions", response_model=SuggestionsView)
async def list_suggestions(resources: ResourcesDep) -> SuggestionsView:
    """Rules suggested from repeated LLM verdicts; none is enabled until a person accepts it."""
    offered, withheld = await _suggestions(resources)
    return SuggestionsView(
        suggestions=[_suggestion_view(s) for s in offered],
        withheld=[WithheldView(**asdict(w)) for w in withheld],
        suggest_after=resources.settings.llm.suggest_after,
    )


@router.post(
    "/suggestions/{suggestion_id}/accept",
    response_model=AcceptedView,
    responses=responses(
        404,
        409,
        422,
        described={
            404: "not offered",
            409: "already in the pack",
            422: "rejected by the rule checks, or an invalid id",
        },
    ),
)
async def accept_suggestion(
    suggestion_id: SuggestionId, resources: ResourcesDep, principal: PrincipalDep
) -> AcceptedView:
    """A person enables a suggested rule: it is written to the rule directory's learned file
    (validated with the whole pack first) and the pack is reloaded, as POST /v1/rules/reload."""
    registry = resources.reloader.registry
    if rule_id(suggestion_id) in registry.active.by_id:
        raise ApiError(409, "already_accepted", f"rule {rule_id(suggestion_id)} is in the pack")
    offered, _ = await _suggestions(resources)
    suggestion = next((s for s in offered if s.id == suggestion_id), None)
    if suggestion is None:
        raise ApiError(404, "not_found", f"no suggestion {suggestion_id!r} is offered")
    try:
        await anyio.to_thread.run_sync(add_rule, registry.directory, suggestion.rule)
    except RuleLoadError as exc:
        raise ApiError(
            422,
            "invalid_rules",
            "the rule was not written: the pack with it fails the rule checks",
            problems=[str(problem) for problem in exc.problems],
        ) from exc
    except OSError as exc:
        raise ApiError(
            409, "rules_dir_not_writable", f"cannot write {LEARNED_FILE}: {exc.strerror}"
        ) from exc
    await log_change(
        resources.sessions,
        principal.actor,
        "suggestion.accept",
        suggestion.rule.id,
        {"suggestion": suggestion_id, "pattern": suggestion.rule.patterns[0]},
    )
    await reload_rules(resources, principal)
    return AcceptedView(
        suggestion=_suggestion_view(suggestion), file=LEARNED_FILE, rules=_view(resources)
    )
