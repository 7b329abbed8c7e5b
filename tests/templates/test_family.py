"""Job families from job names: what varies between runs goes, what names the recipe stays."""

from __future__ import annotations

import pytest

from diagnoser.templates.family import family_of


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("llama-70b-run7", "llama-70b"),
        ("llama-70b-run8", "llama-70b"),
        ("llama-7b-pretrain-run42-2024-05-01", "llama-7b-pretrain"),
        ("gpt-neox_20240501_3f9a2c1.log", "gpt-neox"),
        ("bert-large-17", "bert-large"),
        ("mixtral-8x7b-v2", "mixtral-8x7b"),
        ("t5-xl-20240501T1230", "t5-xl"),
        ("logs/gpt-7b-run3.out", "gpt-7b"),
        ("job-deadbeef12", "job"),
        ("nanogpt", "nanogpt"),
        ("42", "42"),
        ("t5-base-3", "t5-base"),
    ],
)
def test_family_of(name: str, family: str) -> None:
    assert family_of(name) == family
