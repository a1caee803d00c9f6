import {
  ROOT_CONTEXT, SpanKind, SpanStatusCode, context, defaultTextMapGetter, defaultTextMapSetter, trace,
  type Attributes, type Context, type Span, type Tracer
} from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { ExportResultCode, W3CTraceContextPropagator, type ExportResult } from '@opentelemetry/core'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { resourceFromAttributes } from '@opentelemetry/resources'
import { BatchSpanProcessor, TracerProvider, type ReadableSpan, type SpanExporter } from '@opentelemetry/sdk-trace'
import {
  ATTR_ERROR_TYPE, ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_HTTP_ROUTE, ATTR_SERVICE_NAME,
  ATTR_SERVICE_VERSION, ATTR_URL_PATH
} from '@opentelemetry/semantic-conventions'
import {
  ATTR_GEN_AI_AGENT_NAME, ATTR_GEN_AI_CONVERSATION_ID, ATTR_GEN_AI_OPERATION_NAME, ATTR_GEN_AI_PROVIDER_NAME,
  ATTR_GEN_AI_REQUEST_MODEL, ATTR_GEN_AI_TOOL_CALL_ID, ATTR_GEN_AI_TOOL_NAME, ATTR_GEN_AI_USAGE_INPUT_TOKENS,
  ATTR_GEN_AI_USAGE_OUTPUT_TOKENS
} from '@opentelemetry/semantic-conventions/incubating'
import type { ClassifiedError } from '../schemas/common.ts'
import type { RunRecord } from '../store/store.ts'
import type { ModelCallTrace, RunTrace, ToolCallTrace, Tracing, TracingOptions } from './tracing.ts'

/** agentd's own attributes, beside the OpenTelemetry conventions. */
export const ATTR_AGENTD_REQUEST_ID = 'agentd.request.id'
export const ATTR_AGENTD_RUN_ID = 'agentd.run.id'
export const ATTR_AGENTD_RUN_STATUS = 'agentd.run.status'
export const ATTR_AGENTD_ERROR_TYPE = 'agentd.error.type'
export const ATTR_AGENTD_ATTEMPT = 'agentd.model.attempt'
export const ATTR_AGENTD_RETRYING = 'agentd.model.retrying'

/** The most characters of a tool name the model made up that a span keeps (a real tool's name has at most 64). */
const MAX_UNKNOWN_TOOL_NAME = 64

/** Reads the caller's `traceparent` and writes the one sent upstream. */
const propagator = new W3CTraceContextPropagator()

/** The tracing of one app over the official SDK: OTLP/HTTP (JSON) export in batches, W3C trace context. */
export function startOtelTracing(options: TracingOptions & { endpoint: string }): Tracing {
  // Log lines find the active span through this; registering it twice (several apps in one process) is harmless.
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
  const exporter = new ReportingExporter(new OTLPTraceExporter({ url: options.endpoint }), options.onExportFailure)
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: options.serviceName, [ATTR_SERVICE_VERSION]: options.serviceVersion }),
    spanProcessors: [new BatchSpanProcessor({ exporter })]
  })
  const tracer = provider.getTracer('agentd', options.serviceVersion)
  const shutdownTimeoutMs = options.shutdownTimeoutMs ?? 3000

  return {
    enabled: true,
    startRequest(headers, request) {
      const parent = propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter)
      const span = tracer.startSpan(request.method, {
        kind: SpanKind.SERVER,
        attributes: { [ATTR_HTTP_REQUEST_METHOD]: request.method, [ATTR_URL_PATH]: request.path, [ATTR_AGENTD_REQUEST_ID]: request.requestId }
      }, parent)
      return {
        traceparent: traceparentOf(span),
        traceId: span.spanContext().traceId,
        end: once(({ route, statusCode }) => {
          if (route) span.updateName(`${request.method} ${route}`).setAttribute(ATTR_HTTP_ROUTE, route)
          // No response went out: error.type says so (a client's choice, not the server's failure, so the status stays unset).
          if (statusCode === null) span.setAttribute(ATTR_ERROR_TYPE, 'aborted')
          else span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, statusCode)
          if (statusCode !== null && statusCode >= 500) span.setAttribute(ATTR_ERROR_TYPE, String(statusCode)).setStatus({ code: SpanStatusCode.ERROR })
          span.end()
        })
      }
    },
    startRun(run, session, traceparent) {
      const parent = traceparent ? propagator.extract(ROOT_CONTEXT, { traceparent }, defaultTextMapGetter) : ROOT_CONTEXT
      const span = tracer.startSpan('invoke_agent', {
        kind: SpanKind.INTERNAL,
        attributes: {
          [ATTR_GEN_AI_OPERATION_NAME]: 'invoke_agent',
          [ATTR_GEN_AI_AGENT_NAME]: 'agentd',
          [ATTR_GEN_AI_CONVERSATION_ID]: session.id,
          [ATTR_GEN_AI_REQUEST_MODEL]: session.model,
          [ATTR_AGENTD_RUN_ID]: run.id,
          [ATTR_AGENTD_REQUEST_ID]: run.requestId
        }
      }, parent)
      return new SpanRunTrace(tracer, span, run.requestId)
    },
    logFields(): Record<string, string> {
      const span = trace.getSpan(context.active())
      // pino merges the line into this object, so it must be a fresh one.
      if (!span) return {}
      const { traceId, spanId } = span.spanContext()
      return { traceId, spanId }
    },
    async shutdown() {
      let timer: NodeJS.Timeout | undefined
      const timeout = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, shutdownTimeoutMs)
        timer.unref()
      })
      await Promise.race([provider.shutdown().catch(() => {}), timeout])
      clearTimeout(timer)
    }
  }
}

class SpanRunTrace implements RunTrace {
  readonly #tracer: Tracer
  readonly #span: Span
  readonly #context: Context
  readonly #requestId: string

  constructor(tracer: Tracer, span: Span, requestId: string) {
    this.#tracer = tracer
    this.#span = span
    this.#context = trace.setSpan(ROOT_CONTEXT, span)
    this.#requestId = requestId
  }

  within<T>(fn: () => Promise<T>): Promise<T> {
    return context.with(this.#context, fn)
  }

  startModelCall(model: string, attempt: number): ModelCallTrace {
    const span = this.#tracer.startSpan(`chat ${model}`, {
      kind: SpanKind.CLIENT,
      attributes: {
        [ATTR_GEN_AI_OPERATION_NAME]: 'chat',
        [ATTR_GEN_AI_PROVIDER_NAME]: 'openai',
        [ATTR_GEN_AI_REQUEST_MODEL]: model,
        [ATTR_AGENTD_ATTEMPT]: attempt,
        [ATTR_AGENTD_REQUEST_ID]: this.#requestId
      }
    }, this.#context)
    return {
      traceparent: traceparentOf(span),
      end: once((outcome) => {
        if ('error' in outcome) {
          setError(span, outcome.error)
          span.setAttribute(ATTR_AGENTD_RETRYING, outcome.retrying)
        } else if (outcome.usage) {
          span.setAttributes({
            [ATTR_GEN_AI_USAGE_INPUT_TOKENS]: outcome.usage.inputTokens,
            [ATTR_GEN_AI_USAGE_OUTPUT_TOKENS]: outcome.usage.outputTokens
          })
        }
        span.end()
      })
    }
  }

  startToolCall(name: string, callId: string, known: boolean): ToolCallTrace {
    // A name the session has no tool for is the model's text, of any length (a 50 kB name went
    // into the span's name and attribute) and any variety (each made a span name of its own):
    // such a span is plain execute_tool, with the name cut; the audit keeps it whole.
    const toolName = known ? name : name.slice(0, MAX_UNKNOWN_TOOL_NAME)
    const span = this.#tracer.startSpan(known ? `execute_tool ${name}` : 'execute_tool', {
      kind: SpanKind.INTERNAL,
      attributes: {
        [ATTR_GEN_AI_OPERATION_NAME]: 'execute_tool',
        [ATTR_GEN_AI_TOOL_NAME]: toolName,
        [ATTR_GEN_AI_TOOL_CALL_ID]: callId,
        [ATTR_AGENTD_REQUEST_ID]: this.#requestId
      }
    }, this.#context)
    return {
      end: once((outcome) => {
        if (!outcome.ok) setError(span, outcome.error)
        span.end()
      })
    }
  }

  end(run: RunRecord): void {
    const attributes: Attributes = {
      [ATTR_GEN_AI_USAGE_INPUT_TOKENS]: run.usage.inputTokens,
      [ATTR_GEN_AI_USAGE_OUTPUT_TOKENS]: run.usage.outputTokens,
      [ATTR_AGENTD_RUN_STATUS]: run.status
    }
    this.#span.setAttributes(attributes)
    if (run.error) setError(this.#span, run.error)
    this.#span.end()
  }
}

/** The W3C traceparent header value that makes a callee's span a child of this one. */
function traceparentOf(span: Span): string | undefined {
  const carrier: Record<string, string> = {}
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter)
  return carrier.traceparent
}

/**
 * The most characters of an error message a span's status keeps. A message can quote what a
 * provider or a tool answered (a model server's 300 kB HTML error page), and it went whole into
 * the chat span, again into invoke_agent, and into every retry's span: the batches held by the
 * exporter grew with it and backends refuse or cut such spans. The run's error keeps it all.
 */
const MAX_STATUS_MESSAGE = 1024

/** error.type is the classified code (what a dashboard groups by); the errorType sits beside it. */
function setError(span: Span, error: ClassifiedError): void {
  span.setAttributes({ [ATTR_ERROR_TYPE]: error.code, [ATTR_AGENTD_ERROR_TYPE]: error.errorType })
  const message = error.message.length > MAX_STATUS_MESSAGE ? `${error.message.slice(0, MAX_STATUS_MESSAGE - 1)}…` : error.message
  span.setStatus({ code: SpanStatusCode.ERROR, message })
}

/** A span may be ended from a success path and then again from the failure that followed it; the first wins. */
function once<A>(fn: (arg: A) => void): (arg: A) => void {
  let done = false
  return (arg) => {
    if (done) return
    done = true
    fn(arg)
  }
}

/** Passes spans to the OTLP exporter and reports failed exports, at most once a minute, instead of dropping them silently. */
class ReportingExporter implements SpanExporter {
  readonly #inner: SpanExporter
  readonly #report: TracingOptions['onExportFailure']
  #failed = 0
  #lastReport = 0

  constructor(inner: SpanExporter, report: TracingOptions['onExportFailure']) {
    this.#inner = inner
    this.#report = report
  }

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.#inner.export(spans, (result) => {
      if (result.code !== ExportResultCode.SUCCESS) {
        this.#failed++
        if (Date.now() - this.#lastReport >= 60_000) {
          this.#lastReport = Date.now()
          this.#report(withShortData(result.error), this.#failed)
        }
      }
      done(result)
    })
  }

  async shutdown(): Promise<void> {
    await this.#inner.shutdown()
  }

  async forceFlush(): Promise<void> {
    await this.#inner.forceFlush?.()
  }
}

/** The most characters of a backend's answer that a failed export's log line keeps. */
const MAX_EXPORT_ERROR_DATA = 1024

/**
 * The exporter's error carries the backend's whole answer as `data`: a collector or proxy that
 * refused spans with a 200 kB page made a 200 kB log line. The start says what went wrong.
 */
function withShortData(error: Error | undefined): Error | undefined {
  const data = (error as { data?: unknown } | undefined)?.data
  if (error && typeof data === 'string' && data.length > MAX_EXPORT_ERROR_DATA) {
    (error as { data?: unknown }).data = `${data.slice(0, MAX_EXPORT_ERROR_DATA)}…`
  }
  return error
}
