import t from 'tap'
import pino from 'pino'
import { PostgresRunCoordinator } from '../../src/agent/postgres-run-coordinator.ts'
import type { CallSignal, RunSignals } from '../../src/agent/run-coordinator.ts'
import type { ClusterChannel, ClusterMessage } from '../../src/events/cluster-channel.ts'
import type { EventBus } from '../../src/events/event-bus.ts'
import { PostgresStore } from '../../src/store/postgres.ts'
import type { RunRecord } from '../../src/store/store.ts'
import { postgresUrl, withSchema } from '../helpers/postgres.ts'
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
})
