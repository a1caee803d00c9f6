import { connect } from 'node:net'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse, type StreamedEvent } from '../helpers/sse.ts'

/** A session with one finished run of `chunks` text chunks; returns its events from the JSON form. */
async function sessionWithHistory(app: Awaited<ReturnType<typeof buildTestApp>>['app'], devModel: Awaited<ReturnType<typeof buildTestApp>>['devModel'], chunks = 6) {
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: Array.from({ length: chunks }, (_, i) => `w${i}`).join(' '), chunks })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'go' } })
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  return { session, events }
}

t.test('replay and resume', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const { session, events } = await sessionWithHistory(app, devModel)
  const last = events.length
  t.ok(last >= 10, 'enough history')

  t.test('a fresh reader gets every stored event in order, then stays open', async (t) => {
    const res = await readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 300 })
    t.same(res.events.map((e) => e.seq), events.map((e) => e.seq))
    t.notOk(res.endedByServer, 'live streams stay open')
  })

  t.test('Last-Event-ID and ?after resume after the given seq at every point', async (t) => {
    for (const point of [0, 1, Math.floor(last / 2), last - 1, last]) {
      const byHeader = await readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { headers: { 'last-event-id': String(point) }, timeoutMs: 300 })
      t.same(byHeader.events.map((e) => e.seq), events.filter((e) => e.seq > point).map((e) => e.seq), `Last-Event-ID: ${point}`)
      const byQuery = await readSse(`${base}/v1/sessions/${session.id}/events?after=${point}&until=done`, { timeoutMs: 300 })
      t.same(byQuery.events.map((e) => e.seq), events.filter((e) => e.seq > point).map((e) => e.seq), `?after=${point}`)
    }
  })

  t.test('a reconnect to a URL with ?after resumes from its Last-Event-ID, as an EventSource opened at ?after=n does', async (t) => {
    // The browser keeps the URL it was opened with (…?after=1) and sends the last seq it got.
    const point = Math.floor(last / 2)
    const res = await readSse(`${base}/v1/sessions/${session.id}/events?after=1&until=done`, { headers: { 'last-event-id': String(point) }, timeoutMs: 300 })
    t.same(res.events.map((e) => e.seq), events.filter((e) => e.seq > point).map((e) => e.seq), 'nothing it already has comes again')
    const page = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=1`, headers: { accept: 'application/json', 'last-event-id': String(point) } })
    t.same(page.json().data.map((e: StreamedEvent) => e.seq), events.filter((e) => e.seq > point).map((e) => e.seq), 'the same for a JSON page')
    const beyond = await readSse(`${base}/v1/sessions/${session.id}/events?after=1`, { headers: { 'last-event-id': String(last + 1) }, timeoutMs: 2000 })
    t.equal(beyond.status, 400)
    t.equal(JSON.parse(beyond.body).error.details.fields[0].field, 'headers.last-event-id', 'the 400 names the point it resumed from')
  })

  t.test('?until=done ends the stream after the done event', async (t) => {
    const res = await readSse(`${base}/v1/sessions/${session.id}/events?until=done`)
    t.ok(res.endedByServer)
    t.equal(res.events.at(-1)?.type, 'done')
  })

  t.test('channels and types filter', async (t) => {
    const monitor = await readSse(`${base}/v1/sessions/${session.id}/events?channels=monitor`, { timeoutMs: 300 })
    t.same(monitor.events.map((e) => e.seq), events.filter((e) => e.channel === 'monitor').map((e) => e.seq))
    const chunks = await readSse(`${base}/v1/sessions/${session.id}/events?types=text_chunk,done&until=done`, { timeoutMs: 300 })
    t.same(chunks.events.map((e) => e.type), events.filter((e) => ['text_chunk', 'done'].includes(e.type)).map((e) => e.type))
    const bad = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?channels=secret` })
    t.equal(bad.statusCode, 400)
    t.equal(bad.json().error.code, 'VALIDATION_ERROR')
  })

  t.test('the JSON form pages with nextAfter', async (t) => {
    const seen: number[] = []
    let after = 0
    for (;;) {
      const page = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=${after}&limit=4`, headers: { accept: 'application/json' } })).json()
      if (page.data.length === 0) {
        t.equal(page.nextAfter, after, 'an empty page keeps the position')
        break
      }
      seen.push(...page.data.map((e: StreamedEvent) => e.seq))
      after = page.nextAfter
    }
    t.same(seen, events.map((e) => e.seq))
  })

  t.test('a resume point is decimal digits: 1e309, 0x10 and twenty nines are a 400 in both forms', async (t) => {
    for (const value of ['1e309', '99999999999999999999', '0x10', '1.5', '1e1', ' 5', '-1']) {
      const json = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=${encodeURIComponent(value)}`, headers: { accept: 'application/json' } })
      t.equal(json.statusCode, 400, `JSON ?after=${value}`)
      t.equal(json.json().error.code, 'VALIDATION_ERROR')
      t.equal(json.json().error.details.fields[0].field, 'querystring.after')
      const sse = await readSse(`${base}/v1/sessions/${session.id}/events?after=${encodeURIComponent(value)}`, { timeoutMs: 2000 })
      t.equal(sse.status, 400, `SSE ?after=${value} is answered, not a stream that never delivers`)
    }
    const hex = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=0x10`, headers: { accept: 'application/json' } })
    t.equal(hex.statusCode, 400, 'every integer of a query string follows the rule: limit too')
    const sessions = await app.inject({ method: 'GET', url: '/v1/sessions?limit=1e1' })
    t.equal(sessions.statusCode, 400, 'and on other routes')
    t.equal(sessions.json().error.details.fields[0].field, 'querystring.limit')
  })

  t.test('a query parameter given twice is a 400 saying so, on every route', async (t) => {
    for (const url of [`/v1/sessions/${session.id}/events?after=1&after=2`, `/v1/sessions/${session.id}/events?types=done&types=error`, '/v1/sessions?limit=1&limit=2']) {
      const res = await app.inject({ method: 'GET', url, headers: { accept: 'application/json' } })
      t.equal(res.statusCode, 400, url)
      const [field] = res.json().error.details.fields
      t.match(field, { keyword: 'repeated', message: /more than once/ }, `${url}: names what is wrong`)
    }
    const sse = await readSse(`${base}/v1/sessions/${session.id}/events?after=1&after=1`, { timeoutMs: 2000 })
    t.equal(sse.status, 400, 'the SSE form too')
  })

  t.test('a resume point beyond the last event is a 400 naming the last seq, never a silent skip', async (t) => {
    const byHeader = await readSse(`${base}/v1/sessions/${session.id}/events`, { headers: { 'last-event-id': String(last + 4) }, timeoutMs: 2000 })
    t.equal(byHeader.status, 400)
    const body = JSON.parse(byHeader.body)
    t.equal(body.error.code, 'VALIDATION_ERROR')
    t.equal(body.error.details.lastSeq, last)
    t.equal(body.error.details.fields[0].field, 'headers.last-event-id')
    const byQuery = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=${last + 1}`, headers: { accept: 'application/json' } })
    t.equal(byQuery.statusCode, 400)
    t.equal(byQuery.json().error.details.fields[0].field, 'querystring.after')
    const atEnd = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=${last}`, headers: { accept: 'application/json' } })
    t.equal(atEnd.statusCode, 200, 'the last seq itself is a valid resume point')
    t.same(atEnd.json(), { data: [], nextAfter: last })
  })

  t.test('an unknown session is 404 in the envelope', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/v1/sessions/ses_missing/events' })
    t.equal(res.statusCode, 404)
    t.equal(res.json().error.code, 'SESSION_NOT_FOUND')
  })
})

t.test('resuming across the replay/live seam misses, repeats and reorders nothing', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  // A long answer, streamed slowly enough that readers connect and drop while it is live.
  devModel.script({ text: Array.from({ length: 60 }, (_, i) => `t${i}`).join(' '), chunks: 60, delayMs: 20 })
  const runId = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'go' } })).json().run.id

  // Read a few events, drop the connection, resume from the last one seen; repeat until done.
  const received: StreamedEvent[] = []
  let lastId = 0
  for (let round = 0; round < 50; round++) {
    const res = await readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { headers: { 'last-event-id': String(lastId) }, stopAfter: 3 + (round % 4) })
    received.push(...res.events)
    lastId = received.at(-1)?.seq ?? lastId
    if (res.events.some((e) => e.type === 'done')) break
  }
  await app.agentd.runs.waitFor(session.id, runId)
  const stored = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.equal(received.at(-1)?.type, 'done')
  t.same(received.map((e) => e.seq), stored.map((e) => e.seq), 'every event exactly once, in seq order')
})

t.test('a reader that does not read is dropped instead of buffering without bound', async (t) => {
  const { app, devModel } = await buildTestApp(t, { app: { sseMaxBufferedBytes: 256 * 1024 } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const { port } = new URL(base)
  // A raw socket that sends the request and never reads.
  const socket = connect(Number(port), '127.0.0.1')
  socket.pause()
  socket.write(`GET /v1/sessions/${session.id}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n`)
  t.teardown(() => socket.destroy())
  let received = 0
  socket.on('data', (chunk: Buffer) => (received += chunk.length))
  const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()))
  // Enough traffic to overflow the kernel's socket buffers and the stream's limit.
  const big = 'x'.repeat(64 * 1024)
  devModel.script(...Array.from({ length: 3 }, () => ({ text: Array.from({ length: 60 }, () => big).join(' '), chunks: 60 })))
  for (let i = 0; i < 3; i++) {
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `round ${i}` } })
  }
  const produced = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).body.length
  // Now read what the kernel holds: the stream must end (the server dropped it) short of everything.
  socket.resume()
  const wasClosed = await Promise.race([closed.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 3000))])
  t.ok(wasClosed, 'the server closed the slow connection')
  t.ok(received < produced, `the reader got ${received} of ${produced} bytes before it was dropped`)
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, 'and keeps serving')
})

t.test('deleting a session ends its open streams', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const stream = readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 3000 })
  await new Promise((r) => setTimeout(r, 100))
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })).statusCode, 204)
  const res = await stream
  t.ok(res.endedByServer, 'the stream ended')
  t.equal(res.frames.at(-1)?.comment, 'session deleted')
})

t.test('HEAD on the events route answers the stream head and ends, so the connection serves its next request', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const socket = connect(Number(new URL(base).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  let received = ''
  socket.on('data', (chunk: Buffer) => { received += chunk.toString() })
  // Two requests on one keep-alive connection: HEAD of the stream, then the probe.
  socket.write(`HEAD /v1/sessions/${session.id}/events HTTP/1.1\r\nHost: agentd\r\n\r\nGET /healthz HTTP/1.1\r\nHost: agentd\r\n\r\n`)
  const deadline = Date.now() + 3000
  while (received.split('HTTP/1.1 ').length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
  const [head, probe] = received.split(/(?=HTTP\/1\.1 )/)
  t.match(head, /^HTTP\/1\.1 200 /, 'the HEAD is answered 200')
  t.match(head, /content-type: text\/event-stream/i, 'with the head a GET would get')
  t.match(head, /cache-control: no-cache, no-transform/i)
  t.match(probe, /^HTTP\/1\.1 200 /, 'the next request on the connection is answered too')
  t.equal(app.streams.count, 0, 'no stream was opened')
})

t.test('a session deleted after its stream request found it, before the stream opened, still ends that stream', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  // The stream request's read of the session answers only once the deletion is done.
  const store = app.agentd.store
  const getSession = store.getSession
  let release = () => {}
  const deleted = new Promise<void>((resolve) => { release = resolve })
  let held = false
  store.getSession = async (tenant, id) => {
    const found = await getSession.call(store, tenant, id)
    if (!held && id === session.id) {
      held = true
      await deleted
    }
    return found
  }
  const stream = readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 3000 })
  while (!held) await new Promise((r) => setTimeout(r, 10))
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })).statusCode, 204)
  release()
  const res = await stream
  t.ok(res.endedByServer, 'the stream ended instead of waiting for events that never come')
  t.equal(res.frames.at(-1)?.comment, 'session deleted')
  t.equal(app.streams.count, 0, 'its slot is free')
})

t.test('?until=done ends the stream at the next done also when the channel or type filter leaves done out', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const { session, events } = await sessionWithHistory(app, devModel, 3)
  const done = events.find((e) => e.type === 'done')
  t.ok(done, 'the history holds a done')

  const replayed = await readSse(`${base}/v1/sessions/${session.id}/events?channels=monitor&until=done`, { timeoutMs: 3000 })
  t.ok(replayed.endedByServer, 'a replay ends at the stored done')
  t.same(replayed.events.map((e) => e.seq), events.filter((e) => e.channel === 'monitor').map((e) => e.seq), 'with the monitor events before it, and nothing else')

  // Live: the stream opens at the session's end; a new run's done ends it.
  const live = readSse(`${base}/v1/sessions/${session.id}/events?types=text_chunk&until=done`, { headers: { 'last-event-id': String(events.length) }, timeoutMs: 3000 })
  await new Promise((r) => setTimeout(r, 100))
  devModel.script({ text: 'again and again', chunks: 3 })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'more' } })
  const res = await live
  t.ok(res.endedByServer, 'a live stream ends at the next done')
  t.ok(res.events.length > 0 && res.events.every((e) => e.type === 'text_chunk'), 'having sent only the text chunks before it')
})
