import { readFileSync } from 'node:fs'
import { getEventListeners } from 'node:events'
import t from 'tap'
import { AgentdError, createAgentdClient, isToolProgress, type AgentdEvent } from '../../clients/typescript/src/index.ts'
import { generateSchema, schemaUrl } from '../../clients/typescript/scripts/generate.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { connectionRefusedError, failSessionReads } from '../helpers/store-faults.ts'

const KEY = 'key-of-tenant-a-0123456789abcdef'

t.test('clients/typescript/src/schema.ts is generated from the committed document (run `npm run openapi`)', async (t) => {
  t.equal(await generateSchema(), readFileSync(schemaUrl, 'utf8'))
})

/** A fetch that cuts the first event stream it opens after `bytes` bytes, mid-frame, as a dropped connection would. */
function cuttingFetch(bytes: number): { fetch: typeof fetch; cuts: () => number } {
  let cuts = 0
  const cutting: typeof fetch = async (input, init) => {
    const response = await fetch(input, init)
    const isStream = response.headers.get('content-type')?.startsWith('text/event-stream')
    if (!isStream || cuts > 0 || !response.body) return response
    cuts++
    let sent = 0
    const source = response.body.getReader()
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { value, done } = await source.read()
        if (done) return controller.close()
        const room = bytes - sent
        if (value.byteLength < room) {
          sent += value.byteLength
          return controller.enqueue(value)
        }
        controller.enqueue(value.subarray(0, room))
        await source.cancel()
        controller.error(new TypeError('terminated'))
      }
    })
    return new Response(body, { status: response.status, headers: response.headers })
  }
  return { fetch: cutting, cuts: () => cuts }
}

t.test('a whole run through the generated client: create, send, stream with narrowing, resume, a 404 envelope', async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `a:${KEY}` } })
  const baseUrl = await listen(app)
  const cut = cuttingFetch(1500)
  const { api, events } = createAgentdClient({ baseUrl, apiKey: KEY, fetch: cut.fetch })

  const created = await api.POST('/v1/sessions', { body: { tools: ['fs_list'], metadata: { from: 'typescript' } } })
  if (!created.data) throw new Error(`create failed: ${JSON.stringify(created.error)}`)
  const session = created.data
  t.match(session.id, /^ses_/)
  t.equal(session.status, 'idle')

  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'the folder is empty', chunks: 4 })
  const sent = await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'what is here?' } })
  t.equal(sent.response.status, 202)
  const runId = sent.data?.run.id

  let text = ''
  const tools: string[] = []
  let reason: string | undefined
  const seen: AgentdEvent[] = []
  for await (const e of events({ sessionId: session.id, until: 'done' })) {
    seen.push(e)
    // Narrowing on `type` gives each event its own data, with no cast.
    if (e.type === 'text_chunk') text += e.data.delta
    else if (e.type === 'tool:start') tools.push(e.data.call.name)
    else if (e.type === 'done') {
      reason = e.data.reason
      // @ts-expect-error a done event has no delta: the narrowing is real
      void e.data.delta
    } else if (isToolProgress(e)) t.fail(`no tool reports progress here: ${e.type} ${e.data.callId}`)
  }
  t.equal(cut.cuts(), 1, 'the first connection was cut mid-way')
  t.same(seen.map((e) => e.seq), seen.map((_, i) => i + 1), 'the resume after the cut lost, repeated and reordered nothing')
  t.equal(text, 'the folder is empty')
  t.same(tools, ['fs_list'])
  t.equal(reason, 'completed')
  t.equal(seen.at(-1)?.runId, runId)

  t.test('resume from a seq: the stream starts right after it', async (t) => {
    const middle = Math.floor(seen.length / 2)
    const rest: number[] = []
    for await (const e of events({ sessionId: session.id, after: middle, until: 'done' })) rest.push(e.seq)
    t.same(rest, seen.slice(middle).map((e) => e.seq))
  })

  t.test('?wait=true answers with the finished run and the assistant message, typed', async (t) => {
    devModel.script({ text: 'waited for' })
    const { data } = await api.POST('/v1/sessions/{id}/messages', {
      params: { path: { id: session.id }, query: { wait: true } }, body: { content: 'again' }
    })
    t.equal(data?.run.status, 'completed')
    t.equal(data?.message?.content, 'waited for')
  })

  t.test('errors come back as the typed envelope', async (t) => {
    const missing = await api.GET('/v1/sessions/{id}', { params: { path: { id: 'ses_00000000000000000000000000' } } })
    t.equal(missing.response.status, 404)
    t.equal(missing.error?.error.code, 'SESSION_NOT_FOUND')
    t.equal(missing.error?.error.requestId, missing.response.headers.get('x-request-id'))
    const failure = await events({ sessionId: 'ses_00000000000000000000000000' }).next().catch((err: unknown) => err)
    if (!(failure instanceof AgentdError)) throw new Error(`the stream threw ${String(failure)}, not an AgentdError`)
    t.equal(failure.status, 404)
    t.equal(failure.envelope?.error.code, 'SESSION_NOT_FOUND')
    const { error } = await createAgentdClient({ baseUrl }).api.GET('/v1/sessions', {})
    t.equal(error?.error.code, 'UNAUTHORIZED', 'without the key')
  })
})

t.test('a stream answered "try again later" (503, retryable) reconnects after its Retry-After; giving up throws it', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const cut = cuttingFetch(1200)
  const { api, events } = createAgentdClient({ baseUrl, fetch: cut.fetch })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'one two three four five six seven eight', chunks: 8, delayMs: 100 })
  await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'go' } })
  // The reconnection after the cut finds the store out of reach (a real ECONNREFUSED), once.
  const refusals = failSessionReads(app.agentd.store, await connectionRefusedError(), () => cut.cuts() > 0)
  const seen: AgentdEvent[] = []
  for await (const e of events({ sessionId: session.id, until: 'done' })) seen.push(e)
  t.equal(cut.cuts(), 1)
  t.equal(refusals.failed, 1, 'one reconnection was answered 503')
  t.same(seen.map((e) => e.seq), seen.map((_, i) => i + 1), 'nothing missed or repeated')
  t.equal(seen.at(-1)?.type, 'done')

  const always = failSessionReads(app.agentd.store, await connectionRefusedError(), () => true, 100)
  const started = Date.now()
  const failure = await events({ sessionId: session.id, maxReconnects: 1 }).next().catch((err: unknown) => err)
  if (!(failure instanceof AgentdError)) throw new Error(`the stream threw ${String(failure)}, not an AgentdError`)
  t.equal(failure.status, 503)
  t.equal(failure.envelope?.error.code, 'UNAVAILABLE')
  t.equal(always.failed, 2, 'tried twice (maxReconnects 1)')
  t.ok(Date.now() - started >= 900, `waited Retry-After (1 s) between them: ${Date.now() - started} ms`)
})

/** A fetch that rewrites each event stream's line ends as CRLF and hands it over one byte at a time. */
const crlfByteFetch: typeof fetch = async (input, init) => {
  const response = await fetch(input, init)
  if (!response.headers.get('content-type')?.startsWith('text/event-stream') || !response.body) return response
  const source = response.body.getReader()
  let pending: Uint8Array = new Uint8Array()
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      while (pending.byteLength === 0) {
        const { value, done } = await source.read()
        if (done) return controller.close()
        pending = Buffer.from(Buffer.from(value).toString('latin1').replaceAll('\n', '\r\n'), 'latin1')
      }
      controller.enqueue(pending.subarray(0, 1))
      pending = pending.subarray(1)
    },
    cancel: () => source.cancel()
  })
  return new Response(body, { status: response.status, headers: response.headers })
}

t.test('a CRLF stream split at every byte (a CR in one chunk, its LF in the next) loses no event; split UTF-8 arrives whole', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const { api, events } = createAgentdClient({ baseUrl, fetch: crlfByteFetch })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'naïve café ✓ 😀 done', chunks: 3 })
  await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'go' } })
  const seen: AgentdEvent[] = []
  for await (const e of events({ sessionId: session.id, until: 'done', maxReconnects: 0 })) seen.push(e)
  t.same(seen.map((e) => e.seq), seen.map((_, i) => i + 1), 'every event, in order')
  t.equal(seen.at(-1)?.type, 'done')
  t.equal(seen.filter((e) => e.type === 'text_chunk').map((e) => (e.type === 'text_chunk' ? e.data.delta : '')).join(''), 'naïve café ✓ 😀 done')
})

t.test("a caller's AbortSignal keeps no listener of the client's after reconnections", async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const cut = cuttingFetch(1200)
  // Node's fetch holds its own listener until garbage collection: kept away so that only the client's count.
  const fetchWithoutSignal: typeof fetch = (input, init) => cut.fetch(input, { ...init, signal: null })
  const { api, events } = createAgentdClient({ baseUrl, fetch: fetchWithoutSignal })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'one two three four five six', chunks: 6 })
  await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'go' } })
  const controller = new AbortController()
  const seen: AgentdEvent[] = []
  for await (const e of events({ sessionId: session.id, until: 'done', signal: controller.signal })) seen.push(e)
  t.equal(cut.cuts(), 1, 'it reconnected once')
  t.equal(seen.at(-1)?.type, 'done')
  t.equal(getEventListeners(controller.signal, 'abort').length, 0, 'the wait before reconnecting removed its listener')
})

t.test("a gateway's own JSON error (not agentd's envelope) in front of the stream throws an AgentdError with its status", async (t) => {
  const { app } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const gateway: typeof fetch = async (input, init) => String(input).includes('/events')
    ? new Response('{"message":"Bad Gateway"}', { status: 502, headers: { 'content-type': 'application/json' } })
    : fetch(input, init)
  const { api, events } = createAgentdClient({ baseUrl, fetch: gateway })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  const failure = await events({ sessionId: session.id }).next().catch((err: unknown) => err)
  if (!(failure instanceof AgentdError)) throw new Error(`the stream threw ${String(failure)}, not an AgentdError`)
  t.equal(failure.status, 502)
  t.equal(failure.envelope, null)
  t.equal(failure.message, 'HTTP 502')
})

t.test('until done with a filter that leaves done out still ends after the run, with only the events asked for', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const { api, events } = createAgentdClient({ baseUrl })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'alpha beta gamma', chunks: 3 })
  await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'go' } })
  const texts: string[] = []
  for await (const e of events({ sessionId: session.id, until: 'done', types: ['text_chunk'], maxReconnects: 1 })) {
    texts.push(e.type === 'text_chunk' ? e.data.delta : `unexpected ${e.type}`)
  }
  t.equal(texts.join(''), 'alpha beta gamma')
  const monitor: string[] = []
  for await (const e of events({ sessionId: session.id, until: 'done', channels: ['monitor'], maxReconnects: 1 })) monitor.push(e.channel)
  t.ok(monitor.length > 0 && monitor.every((channel) => channel === 'monitor'), monitor.join(' '))
})

t.test('a connection that goes silent (half-open, not even a ping) is taken for dead after idleTimeoutMs and resumed', { timeout: 20_000 }, async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  let stalls = 0
  // The first event stream delivers 1200 bytes, then nothing more, as a peer gone without a FIN.
  const stalling: typeof fetch = async (input, init) => {
    const response = await fetch(input, init)
    if (!response.headers.get('content-type')?.startsWith('text/event-stream') || !response.body || stalls > 0) return response
    stalls++
    const source = response.body.getReader()
    let sent = 0
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (sent >= 1200) return new Promise<void>(() => {})
        const { value, done } = await source.read()
        if (done) return controller.close()
        const piece = value.subarray(0, 1200 - sent)
        sent += piece.byteLength
        controller.enqueue(piece)
      },
      cancel: () => source.cancel()
    })
    return new Response(body, { status: response.status, headers: response.headers })
  }
  const { api, events } = createAgentdClient({ baseUrl, fetch: stalling })
  const session = (await api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'one two three four five six', chunks: 6 })
  await api.POST('/v1/sessions/{id}/messages', { params: { path: { id: session.id } }, body: { content: 'go' } })
  const seen: AgentdEvent[] = []
  for await (const e of events({ sessionId: session.id, until: 'done', idleTimeoutMs: 500 })) seen.push(e)
  t.equal(stalls, 1, 'the first connection went silent')
  t.same(seen.map((e) => e.seq), seen.map((_, i) => i + 1), 'nothing missed or repeated')
  t.equal(seen.at(-1)?.type, 'done')
})

// Aborting used to end the iteration quietly while events arrived, but throw an AbortError while
// the stream was being opened, or once the wait before a reconnection was over: the same abort,
// two outcomes, depending on timing.
t.test("a caller's abort ends the iteration quietly, whether the stream is opening, streaming or waiting to reconnect", async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const baseUrl = await listen(app)
  const session = (await createAgentdClient({ baseUrl }).api.POST('/v1/sessions', { body: {} })).data
  if (!session) throw new Error('no session')
  devModel.script({ text: 'one two three', chunks: 3 })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'go' } })

  /** Reads the session's events until the abort; resolves with what was seen, or what was thrown. */
  const readUntilAborted = async (fetchFor: (controller: AbortController) => typeof fetch, abortAfterEvents?: number) => {
    const controller = new AbortController()
    const { events } = createAgentdClient({ baseUrl, fetch: fetchFor(controller) })
    const seen: AgentdEvent[] = []
    try {
      for await (const e of events({ sessionId: session.id, signal: controller.signal })) {
        seen.push(e)
        if (seen.length === abortAfterEvents) controller.abort()
      }
      return { seen, thrown: null }
    } catch (err) {
      return { seen, thrown: err as Error }
    }
  }

  // While the stream opens: the abort comes before the answer's head.
  const opening = await readUntilAborted((controller) => async (input, init) => {
    controller.abort()
    return fetch(input, init)
  })
  t.same(opening, { seen: [], thrown: null }, 'aborted while opening: no error')

  // While events arrive (the stream stays open after them: no until).
  const streaming = await readUntilAborted(() => fetch, 2)
  t.equal(streaming.thrown, null, 'aborted while streaming: no error')
  t.equal(streaming.seen.length, 2)

  // While waiting to reconnect: every attempt is answered 503 (retryable), and the abort comes during the wait.
  const waiting = await readUntilAborted((controller) => async () => {
    setTimeout(() => controller.abort(), 50)
    return new Response(JSON.stringify({ error: { code: 'UNAVAILABLE', message: 'draining', retryable: true, requestId: 'req_x', timestamp: new Date().toISOString() } }),
      { status: 503, headers: { 'content-type': 'application/json', 'retry-after': '1' } })
  })
  t.same(waiting, { seen: [], thrown: null }, 'aborted while waiting to reconnect: no error')
})
