# syntax=docker/dockerfile:1
# agentd: multi-stage build on Node 24. The service runs its TypeScript through Node's own
# type stripping, so the runtime image holds the sources and production dependencies only.

FROM node:24-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# The image has Node 24 already: the optional `node` package (Node 24 for older machines) is left out.
RUN npm ci --omit=dev --omit=optional --no-audit --no-fund

FROM node:24-bookworm-slim AS runtime
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000 \
    AGENTD_DB=/data/agentd.db \
    AGENTD_WORKSPACES=/data/workspaces
WORKDIR /app
# bash for the bash_run tool (off unless AGENTD_BASH_ENABLED=true); tini reaps tool process groups.
RUN apt-get update && apt-get install -y --no-install-recommends tini bash ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system agentd && useradd --system --gid agentd --home-dir /app agentd \
    && mkdir -p /data && chown agentd:agentd /data
COPY --from=deps /app/node_modules ./node_modules
COPY package.json ./
COPY src ./src
COPY openapi ./openapi
USER agentd
VOLUME ["/data"]
EXPOSE 3000
# A non-loopback HOST needs AGENTD_API_KEYS: pass them at run time (docker run -e AGENTD_API_KEYS=…).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||3000)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
ENTRYPOINT ["/usr/bin/tini", "--"]
# The Node flags of `npm start` (package.json): a young generation of at most 2 × 32 MB (README, "Running it in production").
CMD ["node", "--max-semi-space-size=32", "src/server.ts"]
