"""The compression API's contracts: a job's compressed log, its templates, the stored filters."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class KeptLineOut(BaseModel):
    kind: Literal["line"] = "line"
    line_no: int = Field(description="1-based, across the job's streams in arrival order.")
    node: str | None
    rank: int | None
    text: str
    template_id: int
    guarded: str | None = Field(description="Why the line could not be filtered, if so.")


class RunOut(BaseModel):
    kind: Literal["run"] = "run"
    count: int
    first_line: int
    template_id: int
    template: str
    text: str = Field(description="`[x 12,345 lines] <template>`")


class StormOut(BaseModel):
    kind: Literal["storm"] = "storm"
    count: int
    template_id: int
    template: str
    ranks: list[int]
    nodes: list[str]
    first: KeptLineOut
    last: KeptLineOut


class JobLogOut(BaseModel):
    job_id: str
    family: str
    lines_in: int
    lines_kept: int
    lines_filtered: int
    ratio: float
    truncated: bool = Field(description="The stored log hit its bound; counts still grow.")
    entries: list[KeptLineOut | RunOut | StormOut]


class TemplateOut(BaseModel):
    id: int
    text: str
    count: int = Field(description="Lines the miner grouped into it (kept lines, family-wide).")
    filtered_in_job: int = Field(description="This job's lines its filter dropped.")
    filtered: bool = Field(description="An enabled filter drops its lines.")
    samples: list[str]


class TemplatePage(BaseModel):
    job_id: str
    family: str
    templates: list[TemplateOut]


class FilterOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    scope: str
    family: str | None
    job_id: str | None
    template: str
    pattern: str
    proposer: str
    names: list[str]
    """Names of the pattern's numeric slots, in group order, when the LLM proposer gave them."""
    hits: int
    enabled: bool
    disabled_reason: str | None
    version: int
    created_at: datetime
    last_hit_at: datetime | None
    updated_at: datetime


class FilterPage(BaseModel):
    filters: list[FilterOut]


class FilterPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(strict=True)
