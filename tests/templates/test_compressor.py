"""The compressed log: kept lines, filtered runs, storms, training signals, reuse by a family."""

from __future__ import annotations

import random
import re

from diagnoser.templates.compressor import (
    Compressor,
    CompressorConfig,
    JobCompression,
    JobLog,
    KeptLine,
    Run,
    Storm,
    validate_promotion,
)
from diagnoser.templates.family import family_of
from diagnoser.templates.filters import Filter, Proposer
from diagnoser.templates.signals import SignalKind
from tests.templates.corpus import pack


def training_lines(seed: int, steps: int, *, spike_at: int | None = None) -> list[str]:
    """A Megatron-style job: iteration lines, memory reports, checkpoint saves every 50 steps."""
    rng = random.Random(seed)
    lines = ["> initializing torch distributed ...", "> building GPT model ..."]
    loss = 4.0
    for it in range(1, steps + 1):
        loss = max(2.0, loss - 0.002 + rng.uniform(-0.01, 0.01))
        shown = loss * 3 if it == spike_at else loss
        lines.append(
            f" iteration {it:>6}/{100000:>6} | consumed samples: {it * 512:>9} | "
            f"learning rate: {3e-4:.6E} | lm loss: {shown:.6E} | loss scale: 1.0 | "
            f"grad norm: {rng.uniform(0.2, 1.0):.3f} | number of nan iterations: {0:>3} |"
        )
        lines.append(
            f"[Rank 0] (after {it} iterations) memory (MB) | allocated: "
            f"{rng.uniform(2e4, 2.1e4):.1f} | reserved: 34000.0"
        )
        if it % 50 == 0:
            lines.append(f"saving checkpoint at iteration {it:>7} to /ckpt/gpt")
    return lines


def run(job: JobCompression, lines: list[str], batch: int = 512) -> JobLog:
    for start in range(0, len(lines), batch):
        job.feed(lines[start : start + batch])
    return job.finish()


def test_filtered_runs_and_kept_lines_account_for_every_input_line() -> None:
    compressor = Compressor(pack())
    lines = training_lines(1, 2000)
    log = run(compressor.job(), lines)
    assert log.lines_in == len(lines)
    assert log.ratio < 0.05
    entries = log.entries({t.id: t.text for t in compressor.templates()})
    kept = [e for e in entries if isinstance(e, KeptLine)]
    runs = [e for e in entries if isinstance(e, Run)]
    assert len(kept) == log.lines_kept
    assert sum(r.count for r in runs) + len(kept) == len(lines)
    assert [k.line_no for k in kept] == sorted(k.line_no for k in kept)
    assert any(re.search(r"iteration +<int>/<int>", r.template) for r in runs)
    big = max(runs, key=lambda r: r.count)
    assert big.count > 100
    assert big.first_line > kept[0].line_no


def test_a_second_job_of_the_family_is_compressed_from_its_first_line() -> None:
    compressor = Compressor(pack())
    first = run(compressor.job(), training_lines(1, 2000)[:1000])
    second = run(compressor.job(), training_lines(2, 2000)[:1000])
    assert second.lines_kept * 3 <= first.lines_kept
    assert second.kept == [] or second.kept[0].line_no >= 1


def test_nan_loss_is_kept_and_signalled() -> None:
    compressor = Compressor(pack())
    job = compressor.job()
    lines = training_lines(3, 400)
    nan_line = (
        " iteration    401/100000 | lm loss: nan | grad norm: inf | number of nan iterations:   1 |"
    )
    log = run(job, [*lines, nan_line])
    assert log.kept[-1].text == nan_line
    kinds = [s.kind for s in log.signals.raised]
    assert SignalKind.NAN_LOSS in kinds
    assert SignalKind.NAN_GRAD_NORM in kinds
    assert log.signals.raised[-1].step == 401


def test_loss_spike_names_the_checkpoint_to_resume_from() -> None:
    compressor = Compressor(pack())
    run(compressor.job(), training_lines(4, 300))  # warm-up: progress lines are filtered now
    log = run(compressor.job(), training_lines(5, 300, spike_at=173))
    spikes = [s for s in log.signals.raised if s.kind is SignalKind.LOSS_SPIKE]
    assert [s.step for s in spikes] == [173]
    assert spikes[0].resume_from == 150
    assert spikes[0].baseline is not None
    assert spikes[0].value > 1.5 * spikes[0].baseline
    # The spiking line itself was filtered: the signal comes from what the filters dropped.
    assert all(" iteration    173/" not in k.text for k in log.kept)


def test_storm_of_one_failure_template_over_many_ranks_becomes_one_entry() -> None:
    compressor = Compressor(pack())
    lines = []
    for i in range(64):
        rank = i % 32
        lines.append(
            f"gpu-node-{rank // 8:03d}:{100 + rank}:{200 + rank} [{rank % 8}] NCCL WARN "
            f"NET/IB : Got completion from peer 10.0.0.{rank} with status=12 opcode=0 len=0 "
            f"vendor err 129 (Recv) localGid ::ffff:10.0.0.{i} hca mlx5_0"
        )
    log = run(compressor.job(), ["training started", *lines, "training ended"])
    assert log.lines_kept == 66  # every failure line is kept...
    entries = log.entries({t.id: t.text for t in compressor.templates()})
    storms = [e for e in entries if isinstance(e, Storm)]
    assert len(storms) == 1  # ...and shown once
    [storm] = storms
    assert storm.count == 64
    assert len(storm.nodes) == 4
    assert len(storm.ranks) == 8  # NCCL's bracket is the local rank
    assert storm.first.line_no == 2
    assert storm.last.line_no == 65
    assert len(entries) == 3


def test_templates_are_recorded_per_line_when_asked() -> None:
    compressor = Compressor(pack(), CompressorConfig(min_count=4))
    lines = training_lines(6, 300)
    log = run(compressor.job(record=True), lines)
    assert log.template_ids is not None
    assert len(log.template_ids) == len(lines)
    assert -1 not in log.template_ids
    iteration_ids = {
        t for t, line in zip(log.template_ids, lines, strict=True) if line.startswith(" iteration")
    }
    assert len(iteration_ids) == 1


def test_family_is_the_job_name_without_run_numbers_dates_and_hashes() -> None:
    assert family_of("llama-7b-pretrain-run42-2024-05-01") == "llama-7b-pretrain"
    assert family_of("gpt-neox_20240501_3f9a2c1.log") == "gpt-neox"
    assert family_of("bert-large-17") == "bert-large"


def loss_scale_lines(n: int) -> list[str]:
    """DeepSpeed's fp16 loss scaler: the scale starts as an integer, then turns float."""
    out: list[str] = []
    scale = 65536.0
    for i in range(n):
        shown = f"{int(scale)}" if i < 10 else f"{scale:.1f}"
        out.append(
            f"[2023-04-18 03:36:{i % 60:02d},502] [INFO] [fused_optimizer.py:363:_update_scale] "
            f"Reducing dynamic loss scale from {shown} to {scale / 2:.1f}"
        )
        scale = max(scale / 2, 1.0) if i % 3 == 0 else scale
    return out


def test_a_filter_learned_on_an_integer_still_matches_when_the_value_turns_float() -> None:
    compressor = Compressor(pack())
    lines = loss_scale_lines(200)
    log = run(compressor.job(), lines, batch=4096)
    late = [k.line_no for k in log.kept if k.line_no > 20]
    assert late == [], [lines[n - 1] for n in late[:3]]
    assert compressor.filters.enabled


def test_a_filter_applies_from_the_next_line_inside_one_big_batch() -> None:
    """A short file is one batch: a template first seen mid-batch is filtered after
    `min_count` lines, not at the next batch."""
    compressor = Compressor(pack())
    chatter = [f"> loading shard number {i} from the object store" for i in range(60)]
    steps = [
        f"step={i} loss={2.0 + i / 1000:.4f} lr=3.0e-04 tokens/s={9000 + i}" for i in range(900)
    ]
    lines = chatter + steps
    log = run(compressor.job(), lines, batch=4096)
    kept_steps = [k for k in log.kept if k.text.startswith("step=")]
    assert len(kept_steps) <= compressor.config.min_count, len(kept_steps)
    assert log.lines_in == len(lines)
    entries = log.entries({t.id: t.text for t in compressor.templates()})
    runs = [e for e in entries if isinstance(e, Run)]
    assert sum(r.count for r in runs) + log.lines_kept == len(lines)


def test_a_widened_template_gets_a_filter_for_its_new_form() -> None:
    compressor = Compressor(pack())
    first = [f"worker pool ready with slots {i} and queue depth {i * 2}" for i in range(20)]
    later = [f"worker pool ready with slots w{i}x and queue depth {i * 2}" for i in range(200)]
    job = compressor.job()
    run(job, first + later, batch=4096)
    kept_late = [k for k in job.log.kept if k.line_no > 60]
    assert kept_late == [], kept_late[:3]


def test_job_filters_apply_to_their_job_only_and_the_guard_still_wins() -> None:
    # The family itself learns no filter from five lines.
    compressor = Compressor(pack(), CompressorConfig(min_count_numeric=8))
    lines = [f"heartbeat from agent {i} at tick {i * 7}" for i in range(5)]
    own = compressor.job()
    other = compressor.job()
    own.job_filters().adopt(
        Filter(
            0,
            -1,
            "heartbeat from agent <int> at tick <int>",
            r"^heartbeat from agent [0-9]+ at tick [0-9]+$",
            Proposer.HUMAN,
        )
    )
    assert own.feed(lines) == []
    assert other.feed(lines) == list(range(5))
    hostile = own.job_filters()
    hostile.adopt(Filter(0, -2, "<*>", r"^[^\n]*error[^\n]*$", Proposer.HUMAN))
    failure = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert own.feed([failure, *lines]) == [0]
    assert not hostile.filters[1].enabled
    assert "guarded" in (hostile.filters[1].disabled_reason or "")


def config_dump(seed: int) -> list[str]:
    """A start-up dump: one line per setting, each its own template, printed once per job (no
    dot leader: `name .... value` lines share one template, see test_miner)."""
    names = [f"option_{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(300)]
    return [f"[config] {name}: {seed * 7 + i}" for i, name in enumerate(names)]


def test_a_second_job_does_not_keep_the_start_up_lines_the_first_one_taught() -> None:
    compressor = Compressor(pack(), CompressorConfig(promote=True))
    failure = "[config] option_zz: RuntimeError: CUDA error: out of memory"
    first = run(compressor.job(), config_dump(1), batch=4096)
    second = run(compressor.job(), [*config_dump(2), failure], batch=4096)
    assert first.lines_kept == 300, "each setting is new to the first job"
    assert second.lines_kept * 3 <= first.lines_kept, second.lines_kept
    assert [k.text for k in second.kept if k.guarded is not None] == [failure]


def test_promotion_can_be_left_to_the_caller() -> None:
    compressor = Compressor(pack(), CompressorConfig(promote=True))
    run(compressor.job(), config_dump(1), batch=4096)
    job = compressor.job(promote=False)
    assert len(job.feed(config_dump(2))) == 300
    work, snapshot = compressor.promotion()
    assert work
    found, _ = validate_promotion(work, snapshot)
    assert compressor.finish_promotion(found, snapshot) == len(found) > 250
    assert compressor.promotion()[0] == [], "each template is tried once"


def test_a_template_of_numbers_alone_is_filtered_from_its_fourth_line() -> None:
    """An evaluation line printed every few hundred steps (values alone vary) becomes a filter
    after three prints; one whose varying part is a word (`<*>`) still waits for eight, and a
    NaN in a number's place is kept whatever the filter says."""
    compressor = Compressor(pack())
    evals = [f"eval at step {s} | val loss {2.5 - s / 1e4:.4f} | ppl {9.1 - s / 1e3:.2f}"
             for s in range(100, 1300, 100)]  # fmt: skip
    workers = [f"worker {name} joined the ring" for name in "abcdefghijkl"]
    nan = "eval at step 1300 | val loss nan | ppl nan"
    lines = [line for pair in zip(evals, workers, strict=True) for line in pair] + [nan]
    log = run(compressor.job(), lines, batch=1)
    kept = [k.text for k in log.kept]
    assert [line for line in kept if line.startswith("eval")] == [*evals[:3], nan]
    assert sum(line.startswith("worker") for line in kept) >= 8


def _child_failed_report(step: int) -> list[str]:
    """torchrun's report, with a blank line inside it (block-guarded)."""
    return [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : 2025-05-21_15:43:{step:02d}",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -9 (pid: 14750)",
        "============================================================",
    ]


def test_blank_lines_are_filtered_but_kept_inside_a_failure_report() -> None:
    for engine in ("hyperscan", "regex"):
        compressor = Compressor(pack(engine), CompressorConfig(engine=engine))
        lines: list[str] = []
        for step in range(1, 40):
            lines += [f"step {step} done in {step * 3} ms", "", "   "]
            if step in (20, 30):
                lines += _child_failed_report(step)
        log = run(compressor.job(), lines, batch=64)
        blank_kept = [k for k in log.kept if not k.text.strip()]
        # The first few blank lines teach the filter; later ones are dropped, except the one
        # inside each report, kept as part of its block.
        assert len([k for k in blank_kept if k.guarded is None]) <= 4, engine
        assert len([k for k in blank_kept if k.guarded is not None]) == 2, engine
        for step in (20, 30):
            report = _child_failed_report(step)
            start = lines.index(report[0], lines.index(f"step {step} done in {step * 3} ms"))
            kept = {k.line_no for k in log.kept}
            assert set(range(start + 1, start + len(report) + 1)) <= kept, engine
        blank = [f for f in compressor.filters.filters if f.pattern == r"^[ \t]*$"]
        assert blank, engine
        assert blank[0].enabled, engine
        assert compressor.filters.disabled == [], engine
