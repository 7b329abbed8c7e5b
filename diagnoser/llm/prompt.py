"""Prompts are Jinja templates under `prompts/`, versioned by file name (`diagnose.v1.j2`).

Each template defines two macros, `system(schema)` and `user(job_id, lines, examples)`;
rendering uses StrictUndefined so a missing value is an error, never an empty string in front
of a model. Log text goes inside
`<log>` ... `</log>` only, with any spelling of those delimiters in the text defused and control
characters removed, so a line cannot close the data block and speak as the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import regex

from diagnoser.config import default_prompts_dir
from diagnoser.llm.answer import Answer, TraceLines

DIAGNOSE_PROMPT = "diagnose.v1"
MAX_LINE_CHARS = 2000

DELIMITER = regex.compile(r"(?i)<\s*/?\s*log\s*>")
CONTROL = regex.compile(r"[\x00-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


@dataclass(frozen=True, slots=True)
class PromptLine:
    number: int
    node: str
    rank: int | None
    text: str
    count: int = 1
    """How many lines this one stands for after storm collapse."""
    flagged: bool = False
    """A rule found this line failure-looking (as opposed to context or a node's tail)."""


def defuse(text: str) -> str:
    """Log text made safe to sit between the delimiters."""
    text = CONTROL.sub(" ", text[:MAX_LINE_CHARS])
    return DELIMITER.sub(lambda m: m.group(0).replace("<", "(").replace(">", ")"), text)


def answer_schema() -> dict[str, Any]:
    """The wire schema: references inlined, every field required, nothing else allowed.

    That is the form OpenAI's strict mode demands and the one llama.cpp turns into a grammar.
    Patterns are left out (servers differ in what they support); `check` applies them after.
    """
    full = Answer.model_json_schema()
    definitions = full.get("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {
                key: inline(value)
                for key, value in node.items()
                if key not in {"title", "description", "default", "pattern", "$defs"}
            }
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    schema: dict[str, Any] = inline(full)
    schema["required"] = list(schema["properties"])
    schema["additionalProperties"] = False
    return schema


def trace_of(lines: Sequence[PromptLine], job_nodes: frozenset[str]) -> TraceLines:
    return TraceLines(
        node_of_line={ln.number: ln.node for ln in lines},
        job_nodes=job_nodes,
        flagged=frozenset(ln.number for ln in lines if ln.flagged),
    )


class Prompts:
    def __init__(self, directory: Path | None = None) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(directory or default_prompts_dir()),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
        )

    def diagnose(
        self,
        job_id: str,
        lines: Sequence[PromptLine],
        examples: Sequence[str] = (),
        version: str = DIAGNOSE_PROMPT,
    ) -> list[dict[str, str]]:
        module = self._env.get_template(f"{version}.j2").module
        safe = [
            PromptLine(ln.number, defuse(ln.node), ln.rank, defuse(ln.text), ln.count, ln.flagged)
            for ln in lines
        ]
        render_system = getattr(module, "system")  # noqa: B009 - macros are dynamic attributes
        render_user = getattr(module, "user")  # noqa: B009
        system = render_system(schema=json.dumps(answer_schema(), separators=(",", ":")))
        user = render_user(
            job_id=defuse(job_id), lines=safe, examples=[defuse(e) for e in examples]
        )
        return [{"role": "system", "content": str(system)}, {"role": "user", "content": str(user)}]
