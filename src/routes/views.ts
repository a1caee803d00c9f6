import type { FastifyRequest } from 'fastify'
import { apiError } from '../http/errors.ts'
import type { Message, Run } from '../schemas/messages.ts'
import type { MessageRecord, RunRecord, SessionRecord, Store } from '../store/store.ts'

/** The tenant's session, or 404 SESSION_NOT_FOUND (also for another tenant's: no existence leak). */
export async function sessionOr404(store: Store, tenant: string, id: string): Promise<SessionRecord> {
  const session = await store.getSession(tenant, id)
  if (!session) throw apiError('SESSION_NOT_FOUND', `No session ${id}`)
  return session
}

/** The public view of a stored run. */
export function toRunView(run: RunRecord): Run {
  return {
    id: run.id, sessionId: run.sessionId, status: run.status, requestId: run.requestId, steps: run.steps,
    usage: run.usage, error: run.error, startedAt: run.startedAt, endedAt: run.endedAt
  }
}

/** The public view of a stored message. */
export function toMessageView(message: MessageRecord): Message {
  const view: Message = {
    id: message.id, sessionId: message.sessionId, runId: message.runId, role: message.role,
    content: message.content, createdAt: message.createdAt
  }
  if (message.toolCalls) view.toolCalls = message.toolCalls
  if (message.toolCallId) view.toolCallId = message.toolCallId
  if (message.replacesMessages !== undefined) view.replacesMessages = message.replacesMessages
  return view
}

/**
 * The last assistant message of a run, read from the run's own user message on, a page at a
 * time: a wait=true answer costs the run's messages, not the whole conversation's.
 */
export async function lastAssistantMessage(store: Store, sessionId: string, userMessageId: string, runId: string): Promise<MessageRecord | null> {
  let last: MessageRecord | null = null
  let after = userMessageId
  for (;;) {
    const page = (await store.pageMessages(sessionId, { limit: 500, after })) ?? []
    last = page.findLast((m) => m.runId === runId && m.role === 'assistant') ?? last
    const end = page.at(-1)
    if (!end || page.length < 500) return last
    after = end.id
  }
}

/**
 * preValidation of routes whose body fields are all optional: no body is the same as `{}`
 * (the OpenAPI document marks such bodies optional).
 */
export async function bodyDefaultsToEmpty(request: FastifyRequest): Promise<void> {
  request.body ??= {}
}
