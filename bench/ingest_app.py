"""The server side of ``bench/ingest.py``: the real diagnoser app plus a framework floor route.

    python bench/ingest_app.py --data-dir /tmp/d --port 8765 [--profile out.pstats]

`create_bench_app` builds the product app with `create_app(settings)` and adds
``POST /bench/floor``, which only reads the body and counts its bytes: what FastAPI, Starlette
and uvicorn cost for the same requests, middleware included. ``GET /bench/stages`` names the
pipeline's stages for the report. The routes live here, never in the product package. One
uvicorn worker, with the loop and HTTP parser `diagnoser serve` picks (uvloop, httptools).
"""

from __future__ import annotations

import argparse
import cProfile
import signal
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request

from diagnoser.api.deps import Resources
from diagnoser.app import create_app
from diagnoser.config import IngestSettings, Settings

FLOOR_PATH = "/bench/floor"
STAGES_PATH = "/bench/stages"


async def floor(request: Request) -> dict[str, int]:
    """Read the body as it arrives and count it: the least an ingest route can do."""
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
    return {"bytes": received}


async def stages(request: Request) -> list[str]:
    """The pipeline stages the app's lifespan built: what "the full pipeline" was in a run."""
    resources: Resources = request.app.state.resources
    return [type(stage).__name__ for stage in resources.pipeline.stages]


def create_bench_app(settings: Settings) -> FastAPI:
    app = create_app(settings)
    app.add_api_route(FLOOR_PATH, floor, methods=["POST"], include_in_schema=False)
    app.add_api_route(STAGES_PATH, stages, methods=["GET"], include_in_schema=False)
    return app


def bench_settings(data_dir: Path, max_concurrent_requests: int) -> Settings:
    """Defaults everywhere except the data dir and the admission bound (the idle-stream test
    holds more uploads open than the default 512)."""
    return Settings(
        data_dir=data_dir,
        log_level="warning",
        ingest=IngestSettings(max_concurrent_requests=max_concurrent_requests),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-concurrent-requests", type=int, default=512)
    parser.add_argument("--profile", type=Path, help="write cProfile stats here on shutdown")
    args = parser.parse_args(argv)
    app = create_bench_app(bench_settings(args.data_dir, args.max_concurrent_requests))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_level="warning", backlog=4096
    )
    server = uvicorn.Server(config)
    if args.profile is None:
        server.run()
        return
    profiler = cProfile.Profile()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        server.should_exit = True

    # uvicorn installs its own handlers inside run(); these cover a signal before that.
    signal.signal(signal.SIGTERM, stop)
    profiler.enable()
    try:
        server.run()
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
