import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { errorResponses } from '../schemas/common.ts'
import type { EventRecord } from '../store/store.ts'

/** The final run status that each `done` reason stands for (max_steps ends the run as failed). */
const STATUS_BY_DONE_REASON: Readonly<Record<string, string>> = {
  completed: 'completed',
  interrupted: 'cancelled',
  failed: 'failed',
  max_steps: 'failed'
}

/** A label value taken from event data: codes come from fixed catalogues, anything else is UNKNOWN. */
const label = (value: unknown): string => (typeof value === 'string' && /^[A-Za-z0-9_]{1,64}$/.test(value) ? value : 'UNKNOWN')
/** Hook names as the hooks file allows them (and the `preToolUse#0` default). */
const hookLabel = (value: unknown): string => (typeof value === 'string' && /^[A-Za-z0-9._:#-]{1,64}$/.test(value) ? value : 'UNKNOWN')

declare module 'fastify' {
  interface FastifyInstance {
    /** Counts an answered request in the latency histogram; onResponse calls it, and so do answers Fastify's hooks never see (app.ts). */
    observeRequest(request: FastifyRequest, reply: FastifyReply, seconds: number): void
  }
}

/**
 * GET /metrics in the Prometheus text format, fed by the event log (runs, tool and model errors,
 * retries, tokens) and by HTTP hooks (request latency). Each app has its own registry, so several
 * apps in one process (tests) never share or collide on a metric.
 */
export const metricsPlugin = fp(
  async (app: FastifyInstance) => {
    const registry = new Registry()
    collectDefaultMetrics({ register: registry, prefix: 'agentd_' })
    const registers = [registry]
    const { runs, bus } = app.agentd

    const runsTotal = new Counter({
      name: 'agentd_runs_total', help: 'Runs that ended, by final status', labelNames: ['status'], registers
    })
    for (const status of ['completed', 'failed', 'cancelled']) runsTotal.inc({ status }, 0)
    new Gauge({
      name: 'agentd_runs_active', help: 'Runs this process is executing now (queued runs, and runs of other processes, not counted)', registers,
      collect() { this.set(runs.activeCount) }
    })
    const toolErrors = new Counter({
      name: 'agentd_tool_errors_total', help: 'Tool calls that ended in a classified error', labelNames: ['errorType', 'code'], registers
    })
    const modelCalls = new Counter({ name: 'agentd_model_calls_total', help: 'Model calls that completed', registers })
    const modelRetries = new Counter({
      name: 'agentd_model_retries_total', help: 'Model calls retried after a retryable error', labelNames: ['code'], registers
    })
    const modelErrors = new Counter({
      name: 'agentd_model_errors_total', help: 'Model errors that failed a run', labelNames: ['code'], registers
    })
    // Hook names come from the operator's file, so the label stays small.
    const hookDecisions = new Counter({
      name: 'agentd_hook_decisions_total', help: 'Answers of operator hooks (or what onFailure decided), by hook and decision', labelNames: ['hook', 'decision'], registers
    })
    const hookFailures = new Counter({
      name: 'agentd_hook_failures_total', help: 'Hook deliveries that failed (timeout, unreachable, HTTP error, bad answer), by hook and code', labelNames: ['hook', 'code'], registers
    })
    const tokens = new Counter({
      name: 'agentd_tokens_total', help: 'Model tokens used, by kind', labelNames: ['kind'], registers
    })
    new Gauge({
      name: 'agentd_sse_connections', help: 'SSE event streams open now', registers,
      collect() { this.set(app.streams.count) }
    })
    new Gauge({
      name: 'agentd_sse_held_bytes', help: 'Bytes written to SSE streams that their readers have not taken yet', registers,
      collect() { this.set(app.streams.heldBytes) }
    })
    new Gauge({
      name: 'agentd_sse_held_bytes_peak', help: 'The most bytes SSE streams held at once since start (to size AGENTD_MAX_STREAM_BYTES)', registers,
      collect() { this.set(app.streams.peakHeldBytes) }
    })
    const requestDuration = new Histogram({
      name: 'agentd_http_request_duration_seconds',
      help: 'HTTP request latency by method, route pattern and status (SSE streams excluded)',
      labelNames: ['method', 'route', 'status_code'],
      // prom-client's default stops at 10 s: a ?wait=true answer lasts as long as its run, often
      // longer, and every one of them fell in +Inf. Most other answers take a millisecond or less.
      buckets: [0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
      registers
    })

    // Every run emits exactly one `done`, also a queued run that is cancelled before it starts
    // (which has no state_changed), so `done` counts each run once.
    const record = (event: EventRecord): void => {
      const data = event.data as Record<string, any>
      switch (event.type) {
        case 'done': {
          const status = STATUS_BY_DONE_REASON[data.reason]
          if (status) runsTotal.inc({ status })
          break
        }
        case 'tool:error':
          toolErrors.inc({ errorType: label(data.error?.errorType), code: label(data.error?.code) })
          break
        case 'model_retry':
          modelRetries.inc({ code: label(data.code) })
          break
        case 'error':
          // Only the error that ends a run (severity error): a failed summary is a model-phase
          // warn that the run survives by truncating, and it was counted as SUMMARY_FAILED here.
          if (data.phase === 'model' && data.severity === 'error') modelErrors.inc({ code: label(data.detail?.code) })
          if (data.phase === 'system' && typeof data.detail?.detail?.hook === 'string') {
            hookFailures.inc({ hook: hookLabel(data.detail.detail.hook), code: label(data.detail.code) })
          }
          break
        case 'hook_decided':
          hookDecisions.inc({ hook: hookLabel(data.hook), decision: label(data.decision) })
          break
        case 'token_usage':
          // One token_usage per completed model call.
          modelCalls.inc()
          tokens.inc({ kind: 'input' }, Number(data.inputTokens) || 0)
          tokens.inc({ kind: 'output' }, Number(data.outputTokens) || 0)
          break
      }
    }
    const unsubscribe = bus.subscribeAll(record)

    // SSE responses are hijacked and last until the client leaves, so their duration is not a
    // latency; they are left out of the histogram (agentd_sse_connections counts them instead).
    // A hijacked reply never passes onSend, which is how they are told apart.
    const replied = new WeakSet<FastifyRequest>()
    app.addHook('onSend', async (request) => {
      replied.add(request)
    })
    app.decorate('observeRequest', (request: FastifyRequest, reply: FastifyReply, seconds: number) => {
      // The route pattern, never the raw URL: IDs in labels would grow without bound.
      const route = request.is404 ? 'unmatched' : (request.routeOptions.url ?? 'unmatched')
      requestDuration.observe({ method: request.method, route, status_code: String(reply.statusCode) }, seconds)
    })
    app.addHook('onResponse', async (request, reply) => {
      if (replied.has(request)) app.observeRequest(request, reply, reply.elapsedTime / 1000)
    })

    app.addHook('onClose', async () => {
      unsubscribe()
      registry.clear()
    })

    app.get('/metrics', {
      schema: {
        tags: ['health'],
        operationId: 'getMetrics',
        summary: 'Prometheus metrics: runs, tool and model errors, retries, tokens, SSE streams, request latency',
        response: {
          200: {
            description: 'The Prometheus text exposition format, version 0.0.4',
            content: { 'text/plain': { schema: Type.String() } }
          },
          ...errorResponses(401, 500, 503)
        }
      }
    }, async (_request, reply) => {
      reply.type(registry.contentType)
      return registry.metrics()
    })
  },
  { name: 'agentd-metrics', decorators: { fastify: ['agentd', 'streams'] } }
)
