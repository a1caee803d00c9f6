import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'

/** One span as an OTLP/HTTP JSON export carries it, with its attributes flattened to plain values. */
export interface ReceivedSpan {
  traceId: string
  spanId: string
  parentSpanId: string
  name: string
  kind: number
  /** Nanoseconds since the epoch, as a string (it does not fit a double). */
  startTimeUnixNano: string
  attributes: Record<string, string | number | boolean>
  status: { code?: number; message?: string }
  serviceName: string
}

export interface OtlpReceiver {
  /** Base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it. */
  readonly url: string
  readonly spans: ReceivedSpan[]
  /** Export requests that arrived, answered or not. */
  readonly exports: number
  close(): Promise<void>
}

interface AnyValue { stringValue?: string; intValue?: string | number; doubleValue?: number; boolValue?: boolean }
interface KeyValue { key: string; value: AnyValue }

const plain = (value: AnyValue): string | number | boolean =>
  value.stringValue ?? (value.intValue !== undefined ? Number(value.intValue) : undefined) ?? value.doubleValue ?? value.boolValue ?? ''

const flatten = (list: KeyValue[] = []): Record<string, string | number | boolean> =>
  Object.fromEntries(list.map(({ key, value }) => [key, plain(value)]))

/**
 * A plain OTLP/HTTP trace receiver on loopback: it decodes JSON exports posted to /v1/traces.
 * With `hang`, it reads each export and never answers (a backend that stalls).
 */
export async function startOtlpReceiver(options: { hang?: boolean } = {}): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = []
  let exports = 0
  const server = createServer((req, res) => {
    exports++
    if (options.hang) {
      req.resume()
      return
    }
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      if (req.url !== '/v1/traces' || !String(req.headers['content-type']).startsWith('application/json')) {
        res.writeHead(415).end()
        return
      }
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        resourceSpans: Array<{ resource: { attributes: KeyValue[] }; scopeSpans: Array<{ spans: Array<Record<string, unknown>> }> }>
      }
      for (const resourceSpans of body.resourceSpans) {
        const serviceName = String(flatten(resourceSpans.resource.attributes)['service.name'])
        for (const scope of resourceSpans.scopeSpans) {
          for (const span of scope.spans) {
            spans.push({
              traceId: String(span.traceId),
              spanId: String(span.spanId),
              parentSpanId: String(span.parentSpanId ?? ''),
              name: String(span.name),
              kind: Number(span.kind),
              startTimeUnixNano: String(span.startTimeUnixNano),
              attributes: flatten(span.attributes as KeyValue[]),
              status: (span.status ?? {}) as ReceivedSpan['status'],
              serviceName
            })
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    get exports() {
      return exports
    },
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections()
    })
  }
}
