# One image for every service of docker-compose.yml: the keo CLI, the API, the Spark job and
# the Node emulators. Build context: the repository root.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm openjdk-17-jre-headless make \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY pyproject.toml README.md ./
COPY producer ./producer
COPY dedupe_store ./dedupe_store
COPY api ./api
COPY spark_jobs ./spark_jobs
COPY emulators ./emulators
RUN pip install --no-cache-dir '.[spark]'

ENV AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=keo-local \
    AWS_SECRET_ACCESS_KEY=keo-local
