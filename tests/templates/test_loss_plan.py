"""Progress lines read once: the compression stage's extractor match gives the live loss reader
its step and loss (`LossPlan`) only where they are what `Signals.observe_loss` would read."""

from __future__ import annotations

import random
from pathlib import Path

from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.ingest.framing import Framer
from diagnoser.pipeline import LineCounter, Pipeline, StreamKey
from diagnoser.rules import RuleEvent, RuleRegistry
from diagnoser.templates.signals import Extractor, Signals
from diagnoser.templates.stage import CompressionStage
from tests.diagnosis.training_logs import training_log

ROOT = Path(__file__).resolve().parents[2]

DEEPSPEED = (
    "[<*>]: [<int>-<int>-<int> <int>:<int>:<int>,<int>] [INFO] [logging.py:<int>:log_dist] "
    "[Rank <int>] step=<int> loss=<float> lr=<float> grad_norm=<float> tokens/s=<int>"
)
MEGATRON = (
    "[<int>-<int>-<int> <int>:<int>:<int>] iteration <int>/ <int> | consumed samples: <int> | "
    "elapsed time per iteration (ms): <float> | learning rate: <float> | global batch size: "
    "<int> | lm loss: <float> | loss scale: <float> | grad norm: <float> |"
)


def observed(line: str) -> tuple[int | None, float | None]:
    """What the live reader reads from one line: its step and its loss."""
    signals = Signals()
    signals.observe_loss(line, 1)
    return signals.step, signals.loss


def test_the_common_progress_templates_are_read_once() -> None:
    for template in (DEEPSPEED, MEGATRON, "step: <int> loss: <float>", "iter <int>: loss <float>"):
        extractor = Extractor.of(template)
        assert extractor is not None, template
        assert extractor.plan is not None, template


def test_a_template_the_literal_text_cannot_decide_is_read_twice() -> None:
    for template in (
        "step <int> loss <float> val loss <float>",  # two losses: the last is the reader's
        "<*>_loss=<float> step <int>",  # `lm_loss` or `val_loss`: the slot decides
        "step <int> lr <float> loss=<*> grad_norm <float>",  # no number after `loss=`
        "<*>step=<int> loss=<float>",  # `global_step` or `substep`: the slot decides
    ):
        extractor = Extractor.of(template)
        assert extractor is not None
        assert extractor.plan is None, template


def test_a_line_read_once_reads_what_the_loss_reader_reads() -> None:
    """Random templates from keys, separators and slots; random slot texts, among them keys,
    checkpoints, NaN, signs and numbers the loss reader reads otherwise: wherever the plan
    answers, its answer is `observe_loss`'s."""
    pieces = [
        "step", "Step", "iter", "iteration", "global_step", "loss", "lm loss", "lm_loss",
        "train_loss", "val_loss", "Loss", "=", ": ", ":", " ", " | ", "(ms)", "'", "_", "/", "x",
        "0", ".", ",", "#", "<int>", "<float>", "<*>", "<int>", "<float>",
    ]  # fmt: skip
    fillers = [
        "7", "42", "0012", "12345678901", "-3", "+4", "2.5", "1.", ".5", ".5e3", "1e-3", "3e5",
        "nan", "x", "loss=3", "step", "step=9", "iter", "checkpoint", "a_b", "İ", "",
    ]  # fmt: skip
    rng = random.Random(16)
    proved = 0
    for _ in range(20000):
        template = "".join(rng.choice(pieces) for _ in range(rng.randrange(2, 10)))
        extractor = Extractor.of(template)
        if extractor is None or extractor.plan is None:
            continue
        for _ in range(20):
            line = template
            for slot in ("<int>", "<float>", "<*>"):
                while slot in line:
                    line = line.replace(slot, rng.choice(fillers), 1)
            try:
                both = extractor.read_both(line)
            except ValueError:  # a slot text `float` refuses, as `read` would
                continue
            if both is None or both[1] is None:
                continue
            assert both[1] == observed(line), (template, line)
            proved += both[1] != (None, None)
    assert proved > 1000


def replay(share: bool) -> tuple[list[RuleEvent], dict[str, int] | None, int]:
    """A training log with a spike and a NaN through the app's pipeline, from 8 ranks; the
    live stage's events and progress, and how many lines it took as read."""
    registry = RuleRegistry(ROOT / "rules")
    compression = CompressionStage(registry)
    reads = compression.share_loss_reads() if share else None
    live = DiagnosisStage(registry, clock=lambda: 100.0, loss_reads=reads)
    pipeline = Pipeline([LineCounter(), compression, live])
    taken = 0
    logs = [training_log(400, spike_at=170), training_log(400, nan_at=300)]
    for rank in range(8):
        framer = Framer()
        data = logs[rank % 2].encode()
        for start in range(0, len(data), 4096):
            batch = framer.feed(data[start : start + 4096])
            pipeline.process(StreamKey("job", f"r{rank}", "node-0", rank), batch)
            got = compression.loss_reads(batch) if share else None
            taken += len(got or {})
    return sorted(live.jobs["job"].events.values(), key=repr), live.progress("job"), taken


def test_the_live_diagnosis_is_the_same_with_lines_read_once() -> None:
    alone, progress, _ = replay(share=False)
    shared, shared_progress, taken = replay(share=True)
    assert taken > 1000
    assert {e.rule_id for e in alone} >= {"signal.loss_spike", "nan_loss"}
    assert shared == alone
    assert shared_progress == progress
