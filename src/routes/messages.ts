import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { apiError } from '../http/errors.ts'
import { answer, errorResponses, ref } from '../schemas/common.ts'
import {
  AcceptedSchema, AckSchema, ApprovalBodySchema, CallParamsSchema, FinishedSchema, MessageListSchema, PostMessageBodySchema,
  PostMessageQuerySchema, RunParamsSchema, RunSchema, ToolResultBodySchema
} from '../schemas/messages.ts'
import { SessionParamsSchema } from '../schemas/sessions.ts'
import { sessionOr404, toMessageView, toRunView, wantsEventStream } from './views.ts'

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
    const streaming = wantsEventStream(request.headers.accept)
    // Refuse before the run exists: a 429 must not leave a run the client cannot watch.
    if (streaming) app.agentd.assertStreamCapacity(request)
    const { message, run } = await runs.submit({
      session, content: request.body.content, onBusy: request.body.onBusy ?? 'reject', requestId: request.id
    })
    request.log.info({ sessionId: session.id, runId: run.id }, 'run submitted')
    if (streaming) {
      await request.idempotency?.complete(200, { stream: { sessionId: session.id, runId: run.id }, message: toMessageView(message), run: toRunView(run) })
      app.agentd.openStream(request, reply, { sessionId: session.id, after: session.lastSeq, runId: run.id, untilDone: true })
      return reply
    }
    if (request.query.wait) {
      const finished = (await runs.waitFor(run.id)) ?? (await store.getRun(session.id, run.id)) ?? run
      const messages = await store.listMessages(session.id)
      const last = messages.findLast((m) => m.runId === run.id && m.role === 'assistant')
      return reply.status(200).send({ run: toRunView(finished), message: last ? toMessageView(last) : null })
    }
    return reply.status(202).send({ message: toMessageView(message), run: toRunView(run) })
  })

  app.get('/v1/sessions/:id/messages', {
    schema: {
      tags: ['messages'],
      operationId: 'listMessages',
      summary: 'The conversation: user, assistant (with toolCalls) and tool messages, in order',
      params: SessionParamsSchema,
      response: { 200: answer('The messages, in order', MessageListSchema), ...errorResponses(400, 401, 404, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    return { data: (await store.listMessages(session.id)).map(toMessageView) }
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
      response: { 202: answer('The run, stopped (status cancelled)', ref(RunSchema)), ...errorResponses(400, 401, 404, 409, 422, 429, 500, 503) }
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
      response: { 200: answer('Taken; the run goes on', AckSchema), ...errorResponses(400, 401, 404, 409, 422, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    runs.decide(session.id, request.params.callId, { decision: request.body.decision, note: request.body.note ?? null })
    return { callId: request.params.callId, accepted: true as const }
  })

  app.post('/v1/sessions/:id/tool-results/:callId', {
    schema: {
      tags: ['messages'],
      operationId: 'submitToolResult',
      summary: 'Deliver the result of a client-side tool call',
      params: CallParamsSchema,
      body: ToolResultBodySchema,
      response: { 200: answer('Taken; the run goes on', AckSchema), ...errorResponses(400, 401, 404, 409, 413, 422, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const body = request.body as { output?: unknown; error?: string }
    runs.submitToolResult(session.id, request.params.callId, 'error' in body ? { error: String(body.error) } : { output: body.output })
    return { callId: request.params.callId, accepted: true as const }
  })
}
