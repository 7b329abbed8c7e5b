# One image for every role: `serve` (api), `migrate` (one-shot) and `operator` (its extra).
# `serve` listens on 0.0.0.0 here, so it refuses to start until an API token exists:
# `docker run ... IMAGE token create --role admin` against the same database (docs/security.md).
FROM python:3.11-slim AS build
# A C compiler for the miner's mypyc extensions (setup.py); only this stage needs it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY diagnoser ./diagnoser
COPY rules ./rules
COPY prompts ./prompts
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM python:3.11-slim
RUN useradd --system --create-home --uid 10001 diagnoser \
    && mkdir -p /var/lib/diagnoser /etc/diagnoser \
    && chown diagnoser:diagnoser /var/lib/diagnoser
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The pack at a fixed path, so that a mounted directory can replace it (and hot-reload).
COPY rules /etc/diagnoser/rules
COPY prompts /etc/diagnoser/prompts
USER diagnoser
ENV DIAGNOSER_DATA_DIR=/var/lib/diagnoser \
    DIAGNOSER_RULES_DIR=/etc/diagnoser/rules \
    DIAGNOSER_LLM__PROMPTS_DIR=/etc/diagnoser/prompts \
    DIAGNOSER_HOST=0.0.0.0 \
    DIAGNOSER_PORT=8080 \
    PYTHONUNBUFFERED=1
# The embedded SQLite database lives here; a volume keeps it across container replacements.
VOLUME ["/var/lib/diagnoser"]
EXPOSE 8080
# Follows DIAGNOSER_PORT, the port `serve` listens on when no --port is given.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('DIAGNOSER_PORT', '8080') + '/healthz', timeout=2)"]
ENTRYPOINT ["diagnoser"]
CMD ["serve"]
