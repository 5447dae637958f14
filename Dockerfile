# The spillway worker image (docker-compose.yml builds it for `worker` and `spillway-init`).
# Python dependencies: exactly requirements.lock (as constraints), runtime ones only, no [dev].
FROM python:3.11.14-slim-bookworm

# SPILLWAY_ROUTING_TIERS: the console script `spillway` imports the installed package, whose
# default tiers path would point into site-packages; the file lives in /app.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPILLWAY_ROUTING_TIERS=/app/routing_tiers.json

RUN groupadd --system --gid 10001 spillway \
    && useradd --system --uid 10001 --gid spillway --home-dir /app \
        --shell /usr/sbin/nologin spillway

WORKDIR /app

# The lock pins every package of the project and its dev extras; used as constraints it pins
# exactly what the runtime dependencies pull in, and nothing of [dev] is installed.
COPY pyproject.toml requirements.lock README.md ./
COPY spillway/ spillway/
COPY workflows/ workflows/
COPY activities/ activities/
COPY worker.py routing_tiers.json ./
RUN pip install -c requirements.lock . \
    && pip check \
    && rm -rf build ./*.egg-info
# Bytecode now, while /app is writable: with PYTHONDONTWRITEBYTECODE nothing caches it later,
# and every import from /app (every re-import in a workflow sandbox too) would compile again.
RUN python -m compileall -q spillway workflows activities worker.py

# SPILLWAY_OUTPUT_DIR (default `outputs`, relative to /app): owned by the worker user, so the
# named volume mounted here starts out writable. The code itself stays root-owned, read-only.
# SPILLWAY_SECRETS_DIR in the compose stack: `spillway init` makes the spend ledger's secret in
# the volume mounted here (owned by the worker user, readable by it only), the workers read it.
RUN mkdir -p /app/outputs /app/secrets \
    && chown spillway:spillway /app/outputs /app/secrets \
    && chmod 700 /app/secrets

USER spillway

# SPILLWAY_METRICS_PORT (Prometheus), for a scraper on the compose network.
EXPOSE 9464

CMD ["python", "worker.py"]
