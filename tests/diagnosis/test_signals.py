"""Training signals as diagnoses: NaN losses and loss spikes, with the step to resume from."""

from __future__ import annotations

import json
import random
from dataclasses import astuple
from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.signals import SignalReader
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules import Action, RuleRegistry
from diagnoser.templates.signals import LOSS, Signal, SignalConfig, SignalKind, Signals, last_loss
from tests.diagnosis.training_logs import iteration_line, training_log
from tests.servers import run_diagnoser

ROOT = Path(__file__).resolve().parents[2]
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
    "capacity of 31.47 GiB of which 12.73 GiB is free.\n"
)


def batch(text: str) -> LineBatch:
    framer = Framer()
    fed = framer.feed(text.encode())
    rest = framer.close()
    return LineBatch(
        stream_offset=fed.stream_offset,
        first_line_no=fed.first_line_no,
        lines=[*fed.lines, *rest.lines],
        ends=[*fed.ends, *rest.ends],
    )


def stage_after(*texts: str, config: SignalConfig | None = None) -> DiagnosisStage:
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"), clock=lambda: 100.0, signals=config)
    framer = Framer()
    for text in texts:
        stage.process(StreamKey("job", "stdout", "node-0", None), framer.feed(text.encode()))
    return stage


def test_a_loss_spike_is_an_event_with_the_checkpoint_before_it() -> None:
    events = SignalReader().feed("node-0", 3, batch(training_log(spike_at=170)), 5.0)
    [event] = events
    assert (event.rule_id, event.failure_type, event.action) == (
        "signal.loss_spike",
        "loss_spike",
        Action.NOTIFY_USER,
    )
    assert event.entities["step"] == "170"
    assert event.entities["resume_from_step"] == "150"
    assert "iteration      170/" in event.text
    assert (event.node, event.rank, event.time) == ("node-0", 3, 5.0)


def test_a_healthy_run_with_warm_up_and_noise_raises_nothing() -> None:
    reader = SignalReader()
    assert reader.feed("node-0", None, batch(training_log(steps=2000)), 0.0) == []
    assert reader.resume_from_step is None


def test_the_spike_factor_is_configurable() -> None:
    strict = SignalReader(SignalConfig(spike_factor=3.5))
    assert strict.feed("node-0", None, batch(training_log(spike_at=170)), 0.0) == []


def test_no_spike_is_called_before_the_minimum_window() -> None:
    flat = "".join(
        iteration_line(step, "6.0" if step == 8 else "2.0") + "\n" for step in range(1, 13)
    )
    assert SignalReader(SignalConfig(min_window=10)).feed("n", None, batch(flat), 0.0) == []
    [spike] = SignalReader(SignalConfig(min_window=5)).feed("n", None, batch(flat), 0.0)
    assert spike.entities["step"] == "8"


def test_the_live_stage_turns_a_spike_into_a_notify_user_verdict() -> None:
    stage = stage_after(training_log(spike_at=170))
    changed = stage.changed_verdict("job")
    assert changed is not None
    verdict, _ = changed
    assert (verdict.status, verdict.failure_type, verdict.action) == (
        Status.FAILURE,
        "loss_spike",
        Action.NOTIFY_USER,
    )
    assert verdict.summary.endswith("resume from the checkpoint of step 150")
    assert stage.progress("job") == {
        "last_step": 200,
        "last_checkpoint_step": 200,
        "steps_lost": 0,
        "resume_from_step": 150,
    }


def test_a_nan_loss_a_rule_catches_too_is_one_piece_of_evidence() -> None:
    stage = stage_after(training_log(nan_at=170))
    changed = stage.changed_verdict("job")
    assert changed is not None
    verdict, _ = changed
    assert verdict.failure_type == "nan_loss"
    assert verdict.root is not None
    assert verdict.root.rule_id == "nan_loss"
    assert "signal.nan_loss" not in verdict.rule_ids  # the rule's event covers the line
    assert [e.line_no for e in verdict.evidence if e.failure_type == "nan_loss"][:1] == [179]
    assert verdict.summary.endswith("resume from the checkpoint of step 150")
    assert stage.progress("job") == {
        "last_step": 200,
        "last_checkpoint_step": 200,
        "steps_lost": 0,
        "resume_from_step": 150,
    }


def test_a_nan_loss_no_rule_spells_is_caught_by_the_signal() -> None:
    lines = [f"step {s} | loss {2.0 + 0.01 * (s % 3):.3f}" for s in range(1, 30)]
    lines.insert(20, "checkpoint saved at step 20")
    lines.append("step 30 | loss nan")  # `loss nan` with `|` around: no rule pattern has it
    stage = stage_after("\n".join(lines) + "\n")
    changed = stage.changed_verdict("job")
    assert changed is not None
    verdict, _ = changed
    assert verdict.failure_type == "nan_loss"
    assert verdict.action is Action.NOTIFY_USER
    assert "resume from the checkpoint of step 20" in verdict.summary


def test_a_rule_that_names_the_failure_outranks_a_spike() -> None:
    stage = stage_after(training_log(spike_at=170) + OOM)
    changed = stage.changed_verdict("job")
    assert changed is not None
    verdict, _ = changed
    assert verdict.failure_type == "cuda_oom"
    assert "signal.loss_spike" in verdict.rule_ids  # still evidence
    assert "resume from" not in verdict.summary
    progress = stage.progress("job")
    assert progress is not None
    assert "resume_from_step" not in progress  # the diagnosis is about the OOM


@pytest.mark.parametrize(
    ("log", "failure_type"),
    [(training_log(nan_at=170), "nan_loss"), (training_log(spike_at=170), "loss_spike")],
)
def test_diagnose_reads_the_signals(tmp_path: Path, log: str, failure_type: str) -> None:
    path = tmp_path / "node-0.log"
    path.write_text(log)
    done = run_diagnoser("diagnose", "--json", str(path))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["failure_type"], out["action"]) == (
        "failure",
        failure_type,
        "notify_user",
    )
    assert out["resume_from_step"] == 150
    assert "resume from the checkpoint of step 150" in out["summary"]


def test_diagnose_stays_silent_on_a_healthy_run_and_follows_the_settings(tmp_path: Path) -> None:
    healthy = tmp_path / "healthy.log"
    healthy.write_text(training_log(steps=2000))
    out = json.loads(run_diagnoser("diagnose", "--json", str(healthy)).stdout)
    assert (out["status"], out["resume_from_step"]) == ("healthy", None)
    spike = tmp_path / "spike.log"
    spike.write_text(training_log(spike_at=170))
    lenient = {"DIAGNOSER_SIGNALS__SPIKE_FACTOR": "4"}
    out = json.loads(run_diagnoser("diagnose", "--json", str(spike), env=lenient).stdout)
    assert out["status"] == "healthy"


PROGRESS_FORMATS = [
    " iteration {step}/ 500000 | learning rate: 1.5E-04 | lm loss: {loss} | loss scale: 1.0 |"
    " grad norm: nan | number of skipped iterations: 0 |",
    "[Rank 3] step={step} loss={loss} lr=1.2e-04 grad_norm=0.8 tokens/s=123456",
    "{{'loss': {loss}, 'grad_norm': 0.41, 'learning_rate': 2e-05, 'epoch': 0.3}}",
    "step {step}: train loss {loss}, val_loss 9.9, time 31.2ms, mfu 41%",
    "iter {step}: Loss(avg)={loss} throughput 3.1 samples/s",
    "saving checkpoint at iteration {step} to /ckpt",
    "[default0]:step: {step}  loss: {loss}  memory: 31GiB  tps: 5,012  tflops: 201.4",
]


def test_the_loss_reader_raises_what_the_full_reader_raises() -> None:
    """The live reader reads losses alone (`observe_loss`): on every progress format, its NaN
    losses and spikes are the full metric reader's, with the same step, value, baseline and
    checkpoint to resume from."""
    full, losses = Signals(), Signals()
    diagnosed = {SignalKind.NAN_LOSS, SignalKind.LOSS_SPIKE}
    found: tuple[list[Signal], list[Signal]] = ([], [])
    line_no = 0
    for step in range(1, 121):
        loss = "nan" if step == 90 else "9.5" if step in (40, 41) else f"{2.5 - step / 100:.4f}"
        for template in PROGRESS_FORMATS:
            line = template.format(step=step, loss=loss)
            line_no += 1
            for signals, out, read in (
                (full, found[0], full.observe),
                (losses, found[1], losses.observe_loss),
            ):
                read(line, line_no)
                out.extend(s for s in signals.raised if s.kind in diagnosed)
                signals.raised.clear()
    full_found, loss_found = (
        [(*astuple(s)[:3], str(s.value), *astuple(s)[4:]) for s in f] for f in found
    )
    assert full_found == loss_found
    assert {s.kind for s in found[0]} == diagnosed


def test_the_literal_loss_search_finds_what_the_loss_regex_finds() -> None:
    """`last_loss` (a literal search, then the value) against `LOSS` itself, on lines built
    from the spellings a key may take and the neighbours it may have."""
    pieces = [
        "loss", "LOSS", "Loss", "lm loss", "lm_loss", "xlm loss", "train_loss", "val_loss",
        "/loss", "(loss)", " (avg)", "loss scale", ": ", "=", "'", "2.5", "nan", "-inf", "1e-3",
        "3.", " ", " | ", "lossy", "İ", "step 3", ",", ")", "]", "}", ";", "\t", "xtrain_loss",
        "train loss", "2", ".", "e5", "2.5e", "  ", "(avg)",
    ]  # fmt: skip
    rng = random.Random(5)
    for _ in range(5000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 9)))
        found = [float(m["value"]) for m in LOSS.finditer(line)]
        expected = found[-1] if found else None
        assert str(last_loss(line)) == str(expected), line
