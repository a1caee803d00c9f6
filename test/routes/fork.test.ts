import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

t.test('fork copies history up to an event and leaves the original untouched', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], instructions: 'Be kind.', metadata: { k: 'v' } } })).json()
  devModel.script({ text: 'first answer' }, { text: 'second answer' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'one' } })
  const middle = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().lastSeq
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'two' } })
  const original = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
  const originalEvents = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data
  const originalMessages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data

  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork`, payload: { atSeq: middle } })
  t.equal(res.statusCode, 201)
  const fork = res.json()
  t.not(fork.id, session.id)
  t.same(fork.forkedFrom, { sessionId: session.id, atSeq: middle })
  t.equal(fork.lastSeq, middle)
  t.equal(fork.instructions, 'Be kind.')
  t.same(fork.metadata, { k: 'v' })

  const forkEvents = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.same(forkEvents.map((e) => [e.seq, e.type]), originalEvents.filter((e: StreamedEvent) => e.seq <= middle).map((e: StreamedEvent) => [e.seq, e.type]))
  t.ok(forkEvents.every((e) => e.sessionId === fork.id), 'copied events belong to the fork')
  const forkMessages = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/messages` })).json().data
  t.same(forkMessages.map((m: { content: string }) => m.content), ['one', 'first answer'])

  // The fork goes on by itself, from seq middle + 1.
  devModel.script({ text: 'fork answer' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${fork.id}/messages?wait=true`, payload: { content: 'three' } })
  const next = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/events?after=${middle}`, headers: { accept: 'application/json' } })).json().data
  t.equal(next[0].seq, middle + 1, 'the fork numbers on without a gap')
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  t.same(sent.messages.map((m) => m.content), ['Be kind.', 'one', 'first answer', 'three'], 'the model sees the forked history')

  t.same((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json(), original, 'the original session is untouched')
  t.same((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data, originalMessages)

  const whole = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork` })).json()
  t.equal(whole.lastSeq, original.lastSeq, 'without atSeq the whole history is copied')
  const past = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork`, payload: { atSeq: original.lastSeq + 1 } })
  t.equal(past.statusCode, 400)
  t.equal((await app.inject({ method: 'POST', url: '/v1/sessions/ses_none/fork', payload: {} })).statusCode, 404)
})

t.test('a fork at a point inside a run holds only the runs finished before it', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'first' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'one' } })
  devModel.script({ toolCalls: [{ name: 'missing_tool', arguments: {} }] }, { text: 'done' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'two' } })
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  const atSeq = events.find((e) => e.type === 'tool:start')?.seq ?? 0
  const secondRun = events.find((e) => e.type === 'tool:start')?.runId
  const firstEventOfSecond = events.find((e) => e.runId === secondRun)?.seq ?? 0

  const fork = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork`, payload: { atSeq } })).json()
  t.equal(fork.lastSeq, firstEventOfSecond - 1, 'the fork point moves back to just before the unfinished run')
  const forkEvents = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.notOk(forkEvents.some((e) => e.runId === secondRun), 'none of the half run is copied')
  t.equal(forkEvents.at(-1)?.type, 'done', 'the fork ends with a finished run')
  const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/messages` })).json().data
  t.same(messages.map((m: { content: string }) => m.content), ['one', 'first'])
  devModel.script({ text: 'continued' })
  const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${fork.id}/messages?wait=true`, payload: { content: 'again' } })).json()
  t.equal(next.run.status, 'completed', 'the next message to the fork works')
})

t.test('forking a session while its run is going copies no part of that run', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'first' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'one' } })
  devModel.script({ hang: true, afterChunks: 1 })
  const running = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'two' } })).json()
  for (let tries = 0; tries < 200; tries++) {
    const seen = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=text_chunk`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
    if (seen.some((e) => e.runId === running.run.id)) break
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  const fork = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork` })).json()
  const forkEvents = (await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.notOk(forkEvents.some((e) => e.runId === running.run.id), 'the running run is not in the fork')
  t.equal(forkEvents.at(-1)?.type, 'done', 'it ends with the finished run, so ?until=done has nothing to wait for')
  t.same((await app.inject({ method: 'GET', url: `/v1/sessions/${fork.id}/messages` })).json().data.map((m: { content: string }) => m.content), ['one', 'first'])
  t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })).statusCode, 202)
})

t.test('a session deleted while it is being forked answers the fork 404, and leaves no fork', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  for (let i = 0; i < 100_000; i += 2000) {
    await app.agentd.store.commit(Array.from({ length: 2000 }, (_, j) => ({
      type: 'event' as const,
      event: { sessionId: session.id, runId: null, channel: 'monitor' as const, type: 'tick', at: new Date().toISOString(), requestId: null, data: { i: i + j } }
    })))
  }
  const [forked, deleted] = await Promise.all([
    app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/fork`, payload: {} }),
    new Promise((resolve) => setTimeout(resolve, 5)).then(() => app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` }))
  ])
  t.equal(deleted.statusCode, 204)
  t.equal(forked.statusCode, 404, 'not a 500, and not a fork missing what the deletion took')
  t.match(forked.json(), { error: { code: 'SESSION_NOT_FOUND' } })
  const listed = (await app.inject({ method: 'GET', url: '/v1/sessions' })).json().data
  t.same(listed, [], 'no session is left, fork or source')
})
