# One image for every role: `serve` (api), `migrate` (one-shot), and later `operator`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY diagnoser ./diagnoser
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --create-home --uid 10001 diagnoser \
    && mkdir -p /var/lib/diagnoser /etc/diagnoser \
    && chown diagnoser:diagnoser /var/lib/diagnoser
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY rules /etc/diagnoser/rules
COPY prompts /etc/diagnoser/prompts
USER diagnoser
ENV DIAGNOSER_DATA_DIR=/var/lib/diagnoser \
    DIAGNOSER_RULES_DIR=/etc/diagnoser/rules \
    DIAGNOSER_HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["diagnoser"]
CMD ["serve"]
