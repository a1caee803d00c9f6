import type { ClassifiedError, Usage } from '../schemas/common.ts'
import type { RunRecord, SessionRecord } from '../store/store.ts'

/** A span per HTTP request. */
export interface RequestTrace {
  /**
   * The W3C `traceparent` of this request's span, which a run it starts continues; a string, so it
   * can travel with the run wherever it executes. Undefined when tracing is off.
   */
  readonly traceparent: string | undefined
  /** The trace ID for the request's log lines; undefined when tracing is off. */
  readonly traceId: string | undefined
  /** statusCode null: the client left before any response was sent (no status code went out). */
  end(outcome: { route: string | undefined; statusCode: number | null }): void
}

/** A span per model call attempt (`chat <model>`). */
export interface ModelCallTrace {
  /** The W3C `traceparent` of this call, sent upstream to the model; undefined when tracing is off. */
  readonly traceparent: string | undefined
  end(outcome: { usage: Usage | null } | { error: ClassifiedError; retrying: boolean }): void
}

/** A span per tool call (`execute_tool <name>`). */
export interface ToolCallTrace {
  end(outcome: { ok: true } | { ok: false; error: ClassifiedError }): void
}

/** A span per run (`invoke_agent`); the model and tool spans of the run nest under it. */
export interface RunTrace {
  /** Runs fn with this run's span active, so that its log lines carry the trace ID. */
  within<T>(fn: () => Promise<T>): Promise<T>
  startModelCall(model: string, attempt: number): ModelCallTrace
  /** `known`: whether the session has a tool of that name (else it is whatever the model wrote). */
  startToolCall(name: string, callId: string, known: boolean): ToolCallTrace
  end(run: RunRecord): void
}

/** Spans for requests, runs, model calls and tool calls; a no-op unless an OTLP endpoint is configured. */
export interface Tracing {
  readonly enabled: boolean
  startRequest(headers: Record<string, string | string[] | undefined>, request: { method: string; path: string; requestId: string }): RequestTrace
  startRun(run: RunRecord, session: SessionRecord, traceparent: string | undefined): RunTrace
  /** A pino mixin: the trace and span IDs of the active span, if any (a new object each call: pino writes into it). */
  logFields(): Record<string, string>
  /** Sends what is buffered and stops, within a bounded time; an exporter that hangs or fails is given up on. */
  shutdown(): Promise<void>
}

export interface TracingOptions {
  /** The OTLP/HTTP traces URL (…/v1/traces); null turns tracing off. */
  endpoint: string | null
  serviceName: string
  serviceVersion: string
  /** Called when spans could not be exported (at most once a minute); runs go on regardless. */
  onExportFailure(error: Error | undefined, failedExports: number): void
  /** Upper bound of the flush at shutdown; default 3 s. */
  shutdownTimeoutMs?: number
}

const noopModelCall: ModelCallTrace = { traceparent: undefined, end() {} }
const noopToolCall: ToolCallTrace = { end() {} }
/** A run without tracing: the loop pays a property read and an empty call per span. */
export const NO_RUN_TRACE: RunTrace = {
  within: (fn) => fn(),
  startModelCall: () => noopModelCall,
  startToolCall: () => noopToolCall,
  end() {}
}
const noopRequest: RequestTrace = { traceparent: undefined, traceId: undefined, end() {} }

/** Tracing switched off: no SDK, no exporter, no context manager. */
export const NO_TRACING: Tracing = {
  enabled: false,
  startRequest: () => noopRequest,
  startRun: () => NO_RUN_TRACE,
  logFields: () => ({}),
  shutdown: async () => {}
}

/** Builds the tracing of one app: the OpenTelemetry SDK when an endpoint is configured (loaded only then), else NO_TRACING. */
export async function createTracing(options: TracingOptions): Promise<Tracing> {
  if (options.endpoint === null) return NO_TRACING
  const { startOtelTracing } = await import('./otel.ts')
  return startOtelTracing({ ...options, endpoint: options.endpoint })
}
