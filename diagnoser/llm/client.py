"""One OpenAI-compatible client per process, asking for JSON whatever the server supports.

Servers differ in structured output: OpenAI, vLLM and llama.cpp take `response_format`
`json_schema`; some only `json_object`; some ignore both. The client starts with `json_schema`
and, when the server answers 400/422/500 to it, steps down for good (`json_object`, then plain
text with the schema spelled out in the prompt, which it always is), and parses leniently: the
first JSON object in the text, code fences and chatter around it ignored. An answer that still
is not JSON is asked again once. Transport failures go through the openai client's own retries
with backoff, then count against the circuit breaker.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from diagnoser.config import LlmSettings
from diagnoser.llm.breaker import CircuitBreaker

if TYPE_CHECKING:
    import openai

MAX_CONTENT_CHARS = 20_000
"""A longer answer is cut before parsing: the schema's strings are short."""
STEP_DOWN_STATUSES = frozenset({400, 422, 500, 501})
TRANSPORT_ERRORS = ("HTTP", "APITimeoutError", "APIConnectionError")


class OutputMode(IntEnum):
    """Ordered from the strictest the server may support to the most lenient."""

    JSON_SCHEMA = 0
    JSON_OBJECT = 1
    TEXT = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Completion:
    payload: object | None
    """The parsed JSON value, or None when the call failed or no JSON could be found."""
    mode: OutputMode
    tokens_in: int
    tokens_out: int
    latency_s: float
    error: str | None = None

    @property
    def transport_failed(self) -> bool:
        """The endpoint failed (HTTP error, timeout, connection), as opposed to a bad answer."""
        return self.error is not None and self.error.startswith(TRANSPORT_ERRORS)


class LlmUnavailableError(Exception):
    """The breaker is open: no call was made."""


class LlmClient:
    def __init__(self, settings: LlmSettings, breaker: CircuitBreaker | None = None) -> None:
        if settings.base_url is None:
            raise ValueError("LLM client needs DIAGNOSER_LLM__BASE_URL")
        import openai  # about a second to import: only a process that talks to an LLM pays it

        key = settings.api_key.get_secret_value() if settings.api_key else "not-needed"
        self._openai: openai.AsyncOpenAI = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=key,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
        )
        self.model = settings.model
        self.breaker = breaker or CircuitBreaker()
        self.mode = OutputMode.JSON_SCHEMA

    async def aclose(self) -> None:
        await self._openai.close()

    async def complete_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        *,
        seed: int,
        temperature: float,
        max_tokens: int = 512,
    ) -> Completion:
        """One sample; raises LlmUnavailableError when the breaker refuses the call."""
        import openai  # already loaded by __init__

        if not self.breaker.allow():
            raise LlmUnavailableError("LLM circuit breaker is open")
        started = time.monotonic()
        tokens_in = tokens_out = 0
        error: str | None = None
        reasks = 0
        while True:
            used = self.mode
            try:
                response = await self._openai.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    seed=seed,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    **self._format_arguments(schema, used),
                )
            except openai.APIStatusError as exc:
                if exc.status_code in STEP_DOWN_STATUSES and used < OutputMode.TEXT:
                    # Concurrent samples may all be refused; step down once, from the mode used.
                    self.mode = max(self.mode, OutputMode(used + 1))
                    continue
                error = f"HTTP {exc.status_code}"
                break
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                error = type(exc).__name__
                break
            if response.usage is not None:
                tokens_in += response.usage.prompt_tokens
                tokens_out += response.usage.completion_tokens
            content = response.choices[0].message.content if response.choices else None
            payload = extract_json(content or "")
            if payload is not None:
                self.breaker.record_success()
                return Completion(
                    payload, self.mode, tokens_in, tokens_out, time.monotonic() - started
                )
            error = "no JSON object in the answer"
            reasks += 1
            if reasks > 1:
                break
        failed = Completion(
            None, self.mode, tokens_in, tokens_out, time.monotonic() - started, error
        )
        if failed.transport_failed:
            self.breaker.record_failure()
        else:
            self.breaker.record_success()
        return failed

    @staticmethod
    def _format_arguments(schema: dict[str, Any], mode: OutputMode) -> dict[str, Any]:
        if mode is OutputMode.JSON_SCHEMA:
            return {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "diagnosis", "schema": schema, "strict": True},
                }
            }
        if mode is OutputMode.JSON_OBJECT:
            return {"response_format": {"type": "json_object"}}
        return {}


def extract_json(content: str) -> object | None:
    """The first JSON object in `content`, or None: tolerant of fences and prose around it."""
    text = content[:MAX_CONTENT_CHARS]
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None
