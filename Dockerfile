# syntax=docker/dockerfile:1
# One image for every service of docker-compose.yml: keo (the CLI, the API, the reconciler),
# the Spark job and the Node emulators. Build context: the repository root.
#
#   docker build -t kinesis-exactly-once .
#
# No credentials are baked in: on AWS they come the standard way at run time (an instance role,
# IRSA, the environment); the local stack's dummy keys are set by docker-compose.yml only.

# Debian 12 (bookworm), pinned: it has openjdk-17-jre-headless (Spark 4); the next Debian does not.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim

# --- 1. the wheels: keo's own, and every dependency's (Spark included) ------------------------
FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli ./cli
COPY devstack ./devstack
COPY spark_jobs ./spark_jobs
COPY producer ./producer
COPY kinesis_store ./kinesis_store
COPY dedupe_store ./dedupe_store
COPY api ./api
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[spark]'

# --- 2. the emulators: Node 20 (dynalite needs it; bookworm has 18) and their packages ---------
FROM ${NODE_IMAGE} AS emulators
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --omit=dev

# --- 3. the runtime: the wheels installed, Java for Spark, Node for the emulators --------------
FROM ${PYTHON_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels 'kinesis-exactly-once[spark]'
COPY --from=emulators /usr/local/bin/node /usr/local/bin/node
COPY --from=emulators /app/node_modules /app/node_modules
COPY emulators /app/emulators

# A user of its own, and the folders the services write (a named volume mounted on /data
# starts as a copy of them, with their owner).
RUN useradd --create-home --uid 10001 --user-group keo \
 && mkdir -p /data/events /data/checkpoint /data/dead-letter /data/kinesalite /data/dynalite \
 && chown -R keo:keo /data
ENV KEO_NODE_MODULES=/app/node_modules \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER keo
CMD ["keo", "--help"]
