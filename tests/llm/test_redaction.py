"""Every kind of secret the redactor knows is removed; ordinary training log text is untouched."""

from __future__ import annotations

import pytest

from diagnoser.llm.redaction import Redactor

SECRETS = [
    (
        "openai_key",
        "OPENAI_API_KEY set to sk-proj-Abc123Def456Ghi789Jkl012Mno345",
        "sk-proj-Abc123",
    ),
    ("openai_key", "using key sk-1234567890abcdefghijklmnopqrstuv for eval", "sk-1234567890"),
    ("huggingface_token", "login with hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_AbCdEf"),
    (
        "github_token",
        "git clone https://ghp_0123456789abcdefghijABCDEFGHIJ0123456789@github.com/x",
        "ghp_0123",
    ),
    (
        "github_token",
        "GITHUB_TOKEN github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF01234",
        "github_pat_11",
    ),
    ("aws_access_key_id", "aws key AKIAIOSFODNN7EXAMPLE in env", "AKIAIOSFODNN7EXAMPLE"),
    (
        "secret_assignment",
        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI",
    ),
    ("bearer", "curl -H 'Authorization: Bearer abcDEF123456ghiJKL789' http://x", "abcDEF123456"),
    (
        "jwt",
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
        ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3",
    ),
    (
        "url_password",
        "connecting to postgresql://trainer:hunter2secret@db:5432/runs",
        "hunter2secret",
    ),
    ("secret_assignment", "wandb: password = 'S3cr3t!pass' accepted", "S3cr3t!pass"),
    ("email", "job submitted by alice.smith@example.com on gpu-3", "alice.smith@example.com"),
    (
        "private_key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\nabcd\n"
        "-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA1234",
    ),
    (
        "private_key",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA (cut off",
        "b3BlbnNz",
    ),
]


@pytest.mark.parametrize(("kind", "text", "secret"), SECRETS)
def test_each_kind_of_secret_is_removed(kind: str, text: str, secret: str) -> None:
    redacted = Redactor().redact(text)
    assert secret not in redacted.text
    assert f"[REDACTED:{kind}]" in redacted.text
    assert redacted.counts[kind] >= 1


def test_context_around_a_secret_stays_readable() -> None:
    redacted = Redactor().redact("Authorization: Bearer abcDEF123456ghiJKL789")
    assert redacted.text == "Authorization: Bearer [REDACTED:bearer]"


BENIGN = [
    "[rank3]:[E ProcessGroupNCCL.cpp:1182] [Rank 3] Watchdog caught collective operation timeout",
    "gpu-017 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    " iteration     1200/  500000 | consumed samples: 38400 | lm loss: 2.314E+00 | grad norm: 0.4",
    "{'loss': 1.2345, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
    "max_tokens=4096 tokens_per_sec: 1234.5 num_tokens = 8192",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)",
    "Saving model checkpoint to /checkpoints/run7/checkpoint-500",
]


@pytest.mark.parametrize("line", BENIGN)
def test_training_log_text_is_untouched(line: str) -> None:
    redacted = Redactor().redact(line)
    assert redacted.text == line
    assert redacted.counts == {}


def test_configured_patterns_are_applied_and_bad_ones_refused() -> None:
    redactor = Redactor([r"cluster-[a-z]+-internal"])
    redacted = redactor.redact("resolving cluster-east-internal failed")
    assert redacted.text == "resolving [REDACTED:custom] failed"
    with pytest.raises(ValueError, match="does not compile"):
        Redactor(["(unclosed"])


def test_a_catastrophic_configured_pattern_fails_closed() -> None:
    redactor = Redactor([r"(a|aa)+$"])
    redacted = redactor.redact("a" * 5000 + "b secret-ish tail")
    assert "secret-ish" not in redacted.text
    assert redacted.counts == {"custom": 1}
