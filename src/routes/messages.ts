import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { snapshot } from '../agent/tool-call.ts'
import { wantsEventStream } from '../http/accept.ts'
import { ApiError, apiError, validationError } from '../http/errors.ts'
import { answer, errorResponses, ref } from '../schemas/common.ts'
import {
  AcceptedSchema, AckSchema, ApprovalBodySchema, CallParamsSchema, FinishedSchema, ListMessagesQuerySchema,
  MESSAGE_PAGE_SIZE, MessageListSchema, PostMessageBodySchema,
  PostMessageHeadersSchema, PostMessageQuerySchema, RunParamsSchema, RunSchema, ToolResultBodySchema
} from '../schemas/messages.ts'
import { SessionParamsSchema } from '../schemas/sessions.ts'
import { lastAssistantMessage, sessionOr404, toMessageView, toRunView } from './views.ts'

const badCursor = () => validationError([{ field: 'querystring.cursor', message: 'is not a valid cursor', keyword: 'cursor' }],
  'cursor is not a nextCursor this API returned for this session')
const encodeMessageCursor = (id: string) => Buffer.from(id, 'utf8').toString('base64url')
function decodeMessageCursor(cursor: string): string {
  const id = Buffer.from(cursor, 'base64url').toString('utf8')
  if (!/^msg_[0-9A-Za-z]{1,64}$/.test(id) || encodeMessageCursor(id) !== cursor) throw badCursor()
  return id
}

const SseSchema = Type.String({ description: 'Server-Sent Events: id, event and data (the Event as JSON) per frame' })

/** Messages, the runs they start, and the decisions and results runs wait for. */
export const messageRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { store, runs } = app.agentd

  app.post('/v1/sessions/:id/messages', {
    schema: {
      tags: ['messages'],
      operationId: 'sendMessage',
      summary: 'Send a message: starts a run (202), or waits for it (?wait=true), or streams its events (Accept: text/event-stream)',
      params: SessionParamsSchema,
      querystring: PostMessageQuerySchema,
      headers: PostMessageHeadersSchema,
      body: PostMessageBodySchema,
      response: {
        200: {
          description: 'The finished run (?wait=true), or its events as SSE until done (Accept: text/event-stream)',
          content: { 'application/json': { schema: FinishedSchema }, 'text/event-stream': { schema: SseSchema } }
        },
        202: answer('The message and the run it started (queued, or running)', AcceptedSchema),
        ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503)
      }
    }
  }, async (request, reply) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const streaming = wantsEventStream(request.headers.accept, false)
    // Refuse before the run exists: a 429 must not leave a run the client cannot watch.
    if (streaming) app.streams.assertCapacity(request.keyId)
    const { message, run } = await runs.submit({
      session, content: request.body.content, onBusy: request.body.onBusy ?? 'reject', requestId: request.id,
      traceparent: request.traceparent
    })
    request.log.info({ sessionId: session.id, runId: run.id }, 'run submitted')
    if (streaming) {
      await request.idempotency?.complete(200, { stream: { sessionId: session.id, runId: run.id }, message: toMessageView(message), run: toRunView(run) })
      app.streams.send(reply, request.keyId, { sessionId: session.id, after: session.lastSeq, runId: run.id, untilDone: true })
      return reply
    }
    if (request.query.wait) {
      // Answers when the run ends or pauses for someone else (an approval, a client tool).
      const settled = (await runs.waitFor(session.id, run.id, { untilPause: true })) ?? run
      if (settled.status === 'cancelled' && (app.agentd.state.draining || settled.error?.code === 'SERVICE_SHUTDOWN')) {
        // Not the client's final answer (and not kept under an Idempotency-Key): the service, or the
        // process that ran the run (PostgreSQL), went away.
        throw new ApiError('UNAVAILABLE', 'The service is shutting down and cancelled this run; send the message again', { runId: run.id },
          { 'retry-after': '5' })
      }
      if ((settled.status === 'queued' || settled.status === 'running') && app.agentd.state.draining) {
        // Drained, and the run goes on without this process (PostgreSQL keeps it queued for another,
        // or another runs it): accepted, as without ?wait, and kept so under an Idempotency-Key.
        return reply.status(202).send({ message: toMessageView(message), run: toRunView(settled) })
      }
      const last = await lastAssistantMessage(store, session.id, message.id, run.id)
      const pending = settled.status === 'awaiting_approval' || settled.status === 'awaiting_tool_result'
        ? (await store.listToolCalls(run.id)).findLast((c) => c.state === 'approval_required' || c.state === 'executing')
        : undefined
      return reply.status(200).send({
        run: toRunView(settled),
        message: last ? toMessageView(last) : null,
        ...(pending ? { pendingCall: snapshot(pending) } : {})
      })
    }
    return reply.status(202).send({ message: toMessageView(message), run: toRunView(run) })
  })

  app.get('/v1/sessions/:id/messages', {
    schema: {
      tags: ['messages'],
      operationId: 'listMessages',
      summary: 'The conversation: user, assistant (with toolCalls) and tool messages, in order, a page at a time',
      params: SessionParamsSchema,
      querystring: ListMessagesQuerySchema,
      response: { 200: answer('A page of the messages, in order', MessageListSchema), ...errorResponses(400, 401, 404, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const { limit = MESSAGE_PAGE_SIZE, cursor } = request.query
    const after = cursor === undefined ? undefined : decodeMessageCursor(cursor)
    const page = await store.pageMessages(session.id, after === undefined ? { limit: limit + 1 } : { limit: limit + 1, after })
    if (!page) throw badCursor()
    const data = page.slice(0, limit)
    return { data: data.map(toMessageView), nextCursor: page.length > limit ? encodeMessageCursor(data.at(-1)?.id ?? '') : null }
  })

  app.get('/v1/sessions/:id/runs/:runId', {
    schema: {
      tags: ['messages'],
      operationId: 'getRun',
      summary: 'Get a run',
      params: RunParamsSchema,
      response: { 200: answer('The run', ref(RunSchema)), ...errorResponses(400, 401, 404, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const run = await store.getRun(session.id, request.params.runId)
    if (!run) throw apiError('RUN_NOT_FOUND', `No run ${request.params.runId} in session ${session.id}`)
    return toRunView(run)
  })

  app.post('/v1/sessions/:id/interrupt', {
    schema: {
      tags: ['messages'],
      operationId: 'interruptRun',
      summary: 'Cancel the active run; answers once it has stopped',
      params: SessionParamsSchema,
      response: { 202: answer('The run, stopped (status cancelled)', ref(RunSchema)), ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503) }
    }
  }, async (request, reply) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const run = await runs.interrupt(session.id)
    return reply.status(202).send(toRunView((await store.getRun(session.id, run.id)) ?? run))
  })

  app.post('/v1/sessions/:id/approvals/:callId', {
    schema: {
      tags: ['messages'],
      operationId: 'decideApproval',
      summary: 'Allow or deny a tool call that waits for approval',
      params: CallParamsSchema,
      body: ApprovalBodySchema,
      response: { 200: answer('Taken; the run goes on', AckSchema), ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    await runs.decide(session.id, request.params.callId, { decision: request.body.decision, note: request.body.note ?? null })
    return { callId: request.params.callId, accepted: true as const }
  })

  app.post('/v1/sessions/:id/tool-results/:callId', {
    schema: {
      tags: ['messages'],
      operationId: 'submitToolResult',
      summary: 'Deliver the result of a client-side tool call',
      params: CallParamsSchema,
      body: ToolResultBodySchema,
      response: { 200: answer('Taken; the run goes on', AckSchema), ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const body = request.body as { output?: unknown; error?: string }
    await runs.submitToolResult(session.id, request.params.callId, 'error' in body ? { error: String(body.error) } : { output: body.output })
    return { callId: request.params.callId, accepted: true as const }
  })
}
