"""`diagnoser diagnoses list|show|watch` against a real service, as an on-call engineer runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.llm_service import diagnose, llm_services, wait_for_llm
from tests.api.test_llm_stage import UNKNOWN_FAILURE, answer
from tests.conftest import run_service
from tests.llm.scripted_llm import Reply, scripted_llm
from tests.servers import ServiceProcess, post_text

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
OOM = (
    "[default0]:[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 "
    "GiB. GPU 0 has a total capacity of 31.47 GiB [c10d] reading [/data/shards/x.bin]\n"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    yield from run_service({"DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data"))})


def cli(
    service: ServiceProcess, *args: str, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", "diagnoses", *args, "--server", service.base_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": str(columns)},
    )


def diagnosis_of(service: ServiceProcess, job: str) -> dict[str, object]:
    body = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses").json()
    [item] = body["diagnoses"]
    assert isinstance(item, dict)
    return item


def test_list_shows_an_action_that_has_no_colour(service: ServiceProcess) -> None:
    post_text(service, "oom-run", "node-2", OOM)
    assert diagnosis_of(service, "oom-run")["action"] == "notify_user"
    listed = cli(service, "list", "--job", "oom-run")
    assert listed.returncode == 0, listed.stderr
    assert "notify_user" in listed.stdout
    assert "Traceback" not in listed.stderr


def test_show_prints_log_text_as_written(service: ServiceProcess) -> None:
    post_text(service, "markup-run", "node-1", OOM)
    item = diagnosis_of(service, "markup-run")
    shown = cli(service, "show", str(item["id"]))
    assert shown.returncode == 0, shown.stderr
    for text in ("[default0]:[rank3]:", "[c10d]", "[/data/shards/x.bin]"):
        assert text in shown.stdout, text


def test_watch_prints_an_action_that_has_no_colour(service: ServiceProcess) -> None:
    command = [sys.executable, "-m", "diagnoser", "diagnoses", "watch", "--server",
               service.base_url]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as watcher:
        try:
            deadline = time.monotonic() + 20
            while (
                "diagnoser_diagnosis_watchers 1.0"
                not in httpx.get(f"{service.base_url}/metrics").text
            ):
                assert time.monotonic() < deadline, "the watcher never connected"
                time.sleep(0.1)
            post_text(service, "watched-oom", "node-5", OOM)
            assert watcher.stdout is not None
            seen = ""
            while "notify_user" not in seen and watcher.poll() is None:
                seen += watcher.stdout.readline()
            assert "notify_user" in seen
            assert "watched-oom" in seen
        finally:
            watcher.terminate()


def test_list_at_80_columns_keeps_the_id_and_the_culprits(service: ServiceProcess) -> None:
    job = "llama-70b-pretraining-run-0007-with-a-long-name"
    post_text(service, job, "gpu-node-0017", XID79)
    item = diagnosis_of(service, job)
    listed = cli(service, "list", "--job", job, columns=80)
    assert listed.returncode == 0, listed.stderr
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80
    assert str(item["id"])[:8] in listed.stdout
    assert "gpu-node-0017" in listed.stdout
    assert str(item["updated_at"])[5:16].replace("T", " ") in listed.stdout


def test_show_takes_a_unique_id_prefix(service: ServiceProcess) -> None:
    post_text(service, "prefix-run", "node-6", XID79)
    item = diagnosis_of(service, "prefix-run")
    shown = cli(service, "show", str(item["id"])[:8])
    assert shown.returncode == 0, shown.stderr
    assert "gpu_fallen_off_bus on node-6" in shown.stdout
    assert str(item["id"]) in shown.stdout
    missing = cli(service, "show", "zz-no-such-id")
    assert missing.returncode == 1
    assert "no diagnosis 'zz-no-such-id'" in missing.stderr


def test_an_ambiguous_prefix_lists_the_matches(service: ServiceProcess) -> None:
    for n in range(17):  # 17 ids over 16 hex digits: two share their first character
        post_text(service, f"ambiguous-{n}", "node-1", XID79)
    ids = [str(d["id"]) for d in httpx.get(f"{service.base_url}/v1/diagnoses?limit=500").json()[
        "diagnoses"
    ]]  # fmt: skip
    first = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    result = cli(service, "show", first)
    assert result.returncode == 2
    assert f"'{first}' matches" in result.stderr
    for ident in ids:
        if ident.startswith(first):
            assert ident in result.stderr


def test_a_path_in_the_id_stays_inside_the_diagnoses_api(
    service: ServiceProcess, tmp_path: Path
) -> None:
    result = cli(service, "show", "../../healthz")
    assert result.returncode == 1
    assert "no diagnosis" in result.stderr


def test_show_prints_the_llm_vote_as_written(tmp_path: Path) -> None:
    outsider = answer(category="hardware", action="cordon_node_and_restart", culprit_nodes=["[x]"])
    good = answer(summary="The script raised [bold red]FluxCapacitorError[/bold red].")
    with (
        scripted_llm([Reply(outsider)] + [Reply(good)] * 4) as llm,
        llm_services(tmp_path / "data") as start,
    ):
        service = start(llm)
        diagnosis_id = diagnose(service, "voted-run", "gpu-1", UNKNOWN_FAILURE)
        wait_for_llm(service, diagnosis_id)
        shown = cli(service, "show", diagnosis_id)
    assert shown.returncode == 0, shown.stderr
    assert "[bold red]FluxCapacitorError[/bold red]" in shown.stdout, "LLM text is not markup"
    assert "LLM vote: decided with 0.80 of the votes (k 5, asked 5)" in shown.stdout
    assert "votes: user_code/notify_user 4, abstain 1" in shown.stdout
    assert "abstained:" in shown.stdout
    assert "[x]" in shown.stdout
    assert "model scripted, prompt diagnose.v1" in shown.stdout
    assert "tokens 500 in / 100 out" in shown.stdout
