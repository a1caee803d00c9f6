import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import pino from 'pino'
import { PostgresRunCoordinator } from '../../src/agent/postgres-run-coordinator.ts'
import type { CallSignal, RunSignals } from '../../src/agent/run-coordinator.ts'
import { PostgresChannel, type ClusterChannel, type ClusterMessage } from '../../src/events/cluster-channel.ts'
import type { EventBus } from '../../src/events/event-bus.ts'
import { PostgresStore } from '../../src/store/postgres.ts'
import type { RunRecord } from '../../src/store/store.ts'
import { buildTestApp } from '../helpers/app.ts'
import { postgresUrl, schemaUrl, withSchema } from '../helpers/postgres.ts'
import { testSession } from '../store/contract.ts'

/** One channel for the processes of the test, in memory; it loses every 'answer' (a channel that dropped them on the way back). */
function channelLosingAnswers(): ClusterChannel {
  const listeners = new Set<(message: ClusterMessage) => void>()
  return {
    kind: 'postgres',
    async send(message) {
      if (message.type === 'answer') return
      for (const listener of listeners) queueMicrotask(() => listener(message))
    },
    onMessage(listener) {
      listeners.add(listener)
      return () => listeners.delete(listener)
    },
    async sweep() {},
    onReconnect: () => () => undefined,
    async close() {}
  }
}

// Process A takes an approval for a call of a run that process B executes, and signals B. B applies
// it (the run stores permission_decided), but its answer is lost: A answered 503 after 5 s though the
// decision was taken, and the client's retry got 409 NOT_AWAITING.
t.test("an approval whose owner's answer is lost is answered by the decision stored, not 503", async (t) => {
  const schema = await withSchema(t)
  const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  t.teardown(() => store.close())
  await store.migrate()
  const channel = channelLosingAnswers()
  const options = { store, bus: {} as EventBus, channel, leaseMs: 60_000, logger: pino({ level: 'silent' }), signalTimeoutMs: 200 }
  const a = new PostgresRunCoordinator({ ...options, ownerId: 'own_a' })
  const b = new PostgresRunCoordinator({ ...options, ownerId: 'own_b' })
  t.teardown(async () => { await a.close(); await b.close() })

  const session = testSession('ses_lost')
  await store.createSession(session)
  const now = new Date().toISOString()
  const record: RunRecord = {
    id: 'run_lost', sessionId: session.id, status: 'queued', requestId: 'req_lost', steps: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 },
    error: null, messageId: 'msg_lost', input: 'go', createdAt: now, startedAt: null, endedAt: null
  }
  await a.admit(session, record, 'reject', 10)
  t.equal((await b.claimNext(session.id))?.run.id, record.id, 'B executes the run')
  const call = (id: string) => ({
    type: 'toolCall' as const,
    call: { id, sessionId: session.id, runId: record.id, step: 1, name: 'fs_write', input: {}, state: 'approval_required' as const, startedAt: now, endedAt: null, durationMs: null }
  })
  await store.commit([call('call_taken'), call('call_unanswered')])

  // B's run: a decision it takes is stored, as the run loop stores it (tool-call.ts, approve()).
  const taken = new Map<string, string>()
  const signals: RunSignals = {
    cancel: () => undefined,
    signal: (callId: string, signal: CallSignal) => {
      if (signal.kind !== 'approval' || taken.has(callId)) return false
      taken.set(callId, signal.decision.decision)
      if (callId === 'call_taken') {
        void store.commit([{ type: 'event', event: {
          sessionId: session.id, runId: record.id, channel: 'control', type: 'permission_decided', at: now, requestId: null,
          data: { callId, decision: signal.decision.decision, note: null }
        } }])
      }
      return true
    }
  }
  b.attach(record.id, signals)

  const allow: CallSignal = { kind: 'approval', decision: { decision: 'allow', note: null } }
  await t.resolves(a.deliver(session.id, 'call_taken', allow), 'the decision B stored answers the request (it was 503)')
  await t.rejects(a.deliver(session.id, 'call_taken', { kind: 'approval', decision: { decision: 'deny', note: null } }),
    { code: 'NOT_AWAITING' }, 'another decision for the same call is refused, as it would be by B')
  await t.rejects(a.deliver(session.id, 'call_unanswered', allow), { code: 'UNAVAILABLE' },
    'a decision B took but did not store (it stopped before) is still a 503: the request may be retried')
  // A client result for a call whose end is not stored (B took it and has not made it the call's outcome yet): 503 too.
  await t.rejects(a.deliver(session.id, 'call_unanswered', { kind: 'toolResult', result: { output: 'yes' } }, async () => {
    t.fail('a call that has not ended is not compared')
    return true
  }), { code: 'UNAVAILABLE' }, 'a client result whose call has no stored end is a 503')
})

// The same for a client tool's result, through the whole service: process A takes the result of a
// call that process B's run waits on; B applies it, and its answer is lost on the way back. A
// answered 503 though B's run went on with the result, and the client's retry got 409 NOT_AWAITING.
t.test("a client tool result whose owner's answer is lost is answered by the call's stored outcome, not 503", async (t) => {
  const schema = await withSchema(t)
  // Every 'answer' between the processes is lost (both are in this test's process, on PostgresChannel).
  const send = PostgresChannel.prototype.send
  PostgresChannel.prototype.send = function (this: PostgresChannel, message: ClusterMessage) {
    return message.type === 'answer' ? Promise.resolve() : send.call(this, message)
  }
  t.teardown(() => {
    PostgresChannel.prototype.send = send
  })
  const options = { env: { DATABASE_URL: schemaUrl(schema) }, app: { signalTimeoutMs: 1000 } }
  const a = await buildTestApp(t, options)
  const b = await buildTestApp(t, { ...options, devModel: a.devModel })
  const api = async (server: typeof a, method: 'GET' | 'POST', url: string, payload?: object) => {
    const res = await server.app.inject({ method, url, ...(payload ? { payload } : {}), headers: { accept: 'application/json' } })
    return { status: res.statusCode, json: res.json() }
  }
  const spec = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object' } }
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [spec] })).json
  const waiting = async (count: number) => {
    for (let tries = 0; tries < 500; tries++) {
      const events = (await api(a, 'GET', `/v1/sessions/${session.id}/events?limit=1000`)).json.data as Array<{ type: string; data: any }>
      const required = events.filter((e) => e.type === 'tool_result_required')
      if (required.length >= count) return { callId: String(required[count - 1]!.data.call.id), events }
      await sleep(10)
    }
    throw new Error(`no tool_result_required #${count}`)
  }

  a.devModel.script({ toolCalls: [{ name: 'ask', arguments: {} }] }, { toolCalls: [{ name: 'ask', arguments: { again: true } }] }, { text: 'thanks' })
  const { run } = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'ask me' })).json
  const first = (await waiting(1)).callId
  const db = new pg.Client({ connectionString: schemaUrl(schema) })
  await db.connect()
  t.teardown(() => db.end())
  const { rows } = await db.query('SELECT owner FROM runs WHERE id = $1', [run.id])
  t.equal(rows[0]?.owner, b.app.agentd.coordinator.ownerId, 'B executes the run')

  const answered = await api(a, 'POST', `/v1/sessions/${session.id}/tool-results/${first}`, { output: { answer: 42 } })
  t.equal(answered.status, 200, `the output B stored answers the request (it was 503): ${JSON.stringify(answered.json)}`)
  // B's run goes on to its second call, so the run is still B's when A is asked about the first again.
  const second = (await waiting(2)).callId
  const other = await api(a, 'POST', `/v1/sessions/${session.id}/tool-results/${first}`, { output: { answer: 43 } })
  t.equal(other.status, 409, 'another output for the answered call is refused, as it would be by B')
  t.equal(other.json.error?.code, 'NOT_AWAITING')
  const failed = await api(a, 'POST', `/v1/sessions/${session.id}/tool-results/${first}`, { error: 'no answer' })
  t.equal(failed.status, 409, 'so is an error for it')

  const erred = await api(a, 'POST', `/v1/sessions/${session.id}/tool-results/${second}`, { error: 'the user left' })
  t.equal(erred.status, 200, `an error B stored answers the request too: ${JSON.stringify(erred.json)}`)
  for (let tries = 0; tries < 500 && (await api(a, 'GET', `/v1/sessions/${session.id}/runs/${run.id}`)).json.status !== 'completed'; tries++) await sleep(10)
  t.equal((await api(a, 'GET', `/v1/sessions/${session.id}/runs/${run.id}`)).json.status, 'completed', 'the run completes')
  const calls = (await api(a, 'GET', `/v1/sessions/${session.id}/tool-calls`)).json.data
  t.match(calls, [
    { id: first, state: 'completed', result: { answer: 42 } },
    { id: second, state: 'failed', error: { message: "The client's ask failed: the user left" } }
  ], 'with the result and the error that were posted')
})
