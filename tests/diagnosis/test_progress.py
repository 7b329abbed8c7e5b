from __future__ import annotations

import random

import pytest

from diagnoser.diagnosis.progress import STEP, Progress, may_step, step_search
from diagnoser.rules import make_batch


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [
                " iteration     1000/  500000 | consumed samples: 64000 | lm loss: 2.41",
                "saving checkpoint at iteration    1000 to /ckpt/llama",
                "  successfully saved checkpoint at iteration    1000 to /ckpt/llama",
                " iteration     1200/  500000 | consumed samples: 76800 | lm loss: 2.38",
            ],
            {"last_step": 1200, "last_checkpoint_step": 1000, "steps_lost": 200},
        ),
        (
            [
                "{'loss': 1.93, 'learning_rate': 2e-05, 'epoch': 0.4}",
                "Saving model checkpoint to output/checkpoint-500",
                "step 640 | loss 1.88",
            ],
            {"last_step": 640, "last_checkpoint_step": 500, "steps_lost": 140},
        ),
        (
            [
                "[Rank 0] Saving model checkpoint: /ckpt/global_step300/mp_rank_00_model_states.pt",
                "iter 310: loss 2.2041, time 512.33ms",
            ],
            {"last_step": 310, "last_checkpoint_step": 300, "steps_lost": 10},
        ),
        (
            ["loading checkpoint from /ckpt/global_step900", "step: 905  loss: 3.1"],
            {"last_step": 905},
        ),
        (["NCCL INFO Bootstrap : Using eth0", "all good"], None),
    ],
)
def test_reads_steps_and_saved_checkpoints(
    lines: list[str], expected: dict[str, int] | None
) -> None:
    progress = Progress()
    progress.observe(make_batch(lines))
    assert progress.as_record() == expected


def test_the_step_never_goes_backwards_across_batches() -> None:
    progress = Progress()
    progress.observe(make_batch(["step 50"]))
    progress.observe(make_batch(["[rank7]: step 49"]))  # a slower rank
    assert progress.as_record() == {"last_step": 50}


def test_the_step_search_finds_what_the_step_regex_finds() -> None:
    """`step_search` starts the search at the first `step` or `iter`: on lines built from the
    keywords, their neighbours and letters that case-fold, it finds what `STEP.search` finds
    on every line `may_step` lets through."""
    pieces = [
        "step", "STEP", "Step", "iter", "Iteration", "global_step", "global_STEP", "xstep",
        "_step", "steps", "iters", "\u017ftep", "\u0130ter", "\u212a", " ", ": ", "=", "#",
        "_", "12", "3x", "[rank1]: ", "/", "-", "\t", "loss=2.5 ", "global_", "9" * 11,
    ]  # fmt: skip
    rng = random.Random(7)
    for _ in range(5000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 9)))
        found = step_search(line)
        expected = STEP.search(line) if may_step(line) else None
        assert (found and (found.span(), found.group(1))) == (
            expected and (expected.span(), expected.group(1))
        ), line
