import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { apiError, validationError } from '../http/errors.ts'
import { toModelToolResult } from '../tools/tool-errors.ts'
import { unfinishedCallError } from '../agent/recovery.ts'
import { newId } from '../ids.ts'
import { answer, emptyUsage, errorResponses, ref } from '../schemas/common.ts'
import {
  CreateSessionBodySchema, ForkBodySchema, ListSessionsQuerySchema, SESSION_PAGE_SIZE, SessionPageSchema, SessionParamsSchema, SessionSchema, type Session
} from '../schemas/sessions.ts'
import { isSessionGone, TenantFullError, type SessionRecord } from '../store/store.ts'
import { ToolSelectionError } from '../tools/catalog.ts'
import { bodyDefaultsToEmpty, sessionOr404 } from './views.ts'

/** The public view of a stored session. */
export function toSessionView(record: SessionRecord, defaultTools: string[]): Session {
  return {
    id: record.id,
    createdAt: record.createdAt,
    updatedAt: record.updatedAt,
    status: record.status,
    model: record.model,
    instructions: record.instructions,
    tools: (record.tools ?? defaultTools) as Session['tools'],
    approval: record.approval,
    limits: record.limits,
    metadata: record.metadata,
    lastSeq: record.lastSeq,
    usage: record.usage,
    forkedFrom: record.forkedFrom
  }
}

const encodeCursor = (id: string) => Buffer.from(id, 'utf8').toString('base64url')
function decodeCursor(cursor: string): string {
  const id = Buffer.from(cursor, 'base64url').toString('utf8')
  if (!/^ses_[0-9A-Z]{26}$/.test(id) || encodeCursor(id) !== cursor) {
    throw validationError([{ field: 'querystring.cursor', message: 'is not a valid cursor', keyword: 'cursor' }],
      'cursor is not a nextCursor this API returned')
  }
  return id
}

/** /v1/sessions: create, list, read and delete sessions. */
export const sessionRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { store, config } = app.agentd

  /**
   * A creation or fork the store refused at the tenant's limit. The store counts in the same
   * transaction as its insert: a check made here before it let concurrent creations past the
   * limit together (ten at once at a limit of 3 made 12 sessions).
   */
  function tenantFull(err: unknown): never {
    if (!(err instanceof TenantFullError)) throw err
    const max = err.maxSessions
    throw apiError('LIMIT_EXCEEDED', `This tenant has ${max} sessions, the most it may (AGENTD_MAX_SESSIONS_PER_TENANT); delete some first`, {
      limit: 'sessionsPerTenant', max
    })
  }

  app.post('/v1/sessions', {
    schema: {
      tags: ['sessions'],
      operationId: 'createSession',
      summary: 'Create a session',
      description: 'Every field is optional; no body at all is the same as `{}`.',
      body: CreateSessionBodySchema,
      response: { 201: answer('The new session', ref(SessionSchema)), ...errorResponses(400, 401, 409, 413, 415, 422, 429, 500, 503) }
    },
    preValidation: bodyDefaultsToEmpty
  }, async (request, reply) => {
    const body = request.body
    const limits = body.limits ?? {}
    const over = (
      [['maxSteps', config.maxSteps], ['toolTimeoutMs', config.toolTimeoutMs]] as const
    ).filter(([name, max]) => (limits[name] ?? 0) > max)
    if (over.length > 0) {
      throw validationError(over.map(([name, max]) => ({ field: `body.limits.${name}`, message: `must be <= ${max}`, keyword: 'maximum' })),
        'limits may only lower the server limits')
    }
    const tools = await app.agentd.tools.validateSelection(body.tools).catch((err: unknown) => {
      if (!(err instanceof ToolSelectionError)) throw err
      throw validationError(err.problems.map((p) => ({ field: `body.${p.field}`, message: p.message, keyword: 'tools' })),
        `Invalid tools: ${err.message}`)
    })
    const unguarded = app.agentd.tools.approvalProblems(body.approval, tools)
    if (unguarded.length > 0) {
      throw validationError(unguarded.map((p) => ({ field: `body.${p.field}`, message: p.message, keyword: 'tools' })),
        `Invalid approval: ${unguarded.map((p) => `${p.field} ${p.message}`).join('; ')}`)
    }
    const now = new Date().toISOString()
    const record: SessionRecord = {
      id: newId('ses'),
      tenant: request.tenant,
      createdAt: now,
      updatedAt: now,
      status: 'idle',
      model: body.model ?? config.defaultModel,
      instructions: body.instructions ?? null,
      tools,
      approval: body.approval ?? { mode: 'auto' },
      limits,
      metadata: body.metadata ?? {},
      lastSeq: 0,
      usage: emptyUsage(),
      forkedFrom: null
    }
    await store.createSession(record, config.limits.sessionsPerTenant).catch(tenantFull)
    request.log.info({ sessionId: record.id }, 'session created')
    // Made once the 201 is written, while the client prepares its first message.
    app.agentd.tools.prepareWorkspace(record)
    return reply.status(201).send(toSessionView(record, app.agentd.tools.defaultNames))
  })

  app.get('/v1/sessions', {
    schema: {
      tags: ['sessions'],
      operationId: 'listSessions',
      summary: 'List sessions, newest first',
      querystring: ListSessionsQuerySchema,
      response: { 200: answer('A page of sessions, newest first', SessionPageSchema), ...errorResponses(400, 401, 429, 500, 503) }
    }
  }, async (request) => {
    const { limit = SESSION_PAGE_SIZE, cursor } = request.query
    const before = cursor === undefined ? undefined : decodeCursor(cursor)
    const page = await store.listSessions(request.tenant, before === undefined ? { limit: limit + 1 } : { limit: limit + 1, before })
    const data = page.slice(0, limit)
    const last = data.at(-1)
    return {
      data: data.map((s) => toSessionView(s, app.agentd.tools.defaultNames)),
      nextCursor: page.length > limit && last ? encodeCursor(last.id) : null
    }
  })

  app.get('/v1/sessions/:id', {
    schema: {
      tags: ['sessions'],
      operationId: 'getSession',
      summary: 'Get a session',
      params: SessionParamsSchema,
      response: { 200: answer('The session', ref(SessionSchema)), ...errorResponses(400, 401, 404, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    return toSessionView(session, app.agentd.tools.defaultNames)
  })

  app.post('/v1/sessions/:id/fork', {
    schema: {
      tags: ['sessions'],
      operationId: 'forkSession',
      summary: 'Fork a session: a new session with the history up to an event (default: all of it)',
      params: SessionParamsSchema,
      body: ForkBodySchema,
      response: { 201: answer('The new session', ref(SessionSchema)), ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503) }
    },
    // No body means "fork the whole history".
    preValidation: bodyDefaultsToEmpty
  }, async (request, reply) => {
    const source = await sessionOr404(store, request.tenant, request.params.id)
    const atSeq = request.body?.atSeq ?? source.lastSeq
    if (atSeq > source.lastSeq) {
      throw validationError([{ field: 'body.atSeq', message: `must be <= ${source.lastSeq}`, keyword: 'maximum' }],
        `atSeq ${atSeq} is past the session's last event (${source.lastSeq})`)
    }
    const now = new Date().toISOString()
    const target: SessionRecord = {
      ...source,
      id: newId('ses'),
      createdAt: now,
      updatedAt: now,
      status: 'idle',
      lastSeq: atSeq,
      usage: emptyUsage(),
      forkedFrom: { sessionId: source.id, atSeq }
    }
    const fork = await store.forkSession(source.id, target, atSeq, {
      newMessageId: () => newId('msg'),
      sealedAnswer: (toolName) => JSON.stringify(toModelToolResult(unfinishedCallError(toolName, 'the session was forked before its result')))
    }, config.limits.sessionsPerTenant).catch((err: unknown) => {
      // Deleted while it was being forked: as if the request had come after the deletion.
      if (isSessionGone(err)) throw apiError('SESSION_NOT_FOUND', `No session ${source.id}`)
      return tenantFull(err)
    })
    request.log.info({ sessionId: fork.id, forkedFrom: source.id, atSeq: fork.lastSeq }, 'session forked')
    return reply.status(201).send(toSessionView(fork, app.agentd.tools.defaultNames))
  })

  app.delete('/v1/sessions/:id', {
    schema: {
      tags: ['sessions'],
      operationId: 'deleteSession',
      summary: 'Delete a session, cancelling its active run first',
      params: SessionParamsSchema,
      response: { 204: { type: 'null', description: 'Deleted' }, ...errorResponses(400, 401, 404, 413, 415, 429, 500, 503) }
    }
  }, async (request, reply) => {
    const { id } = request.params
    await sessionOr404(store, request.tenant, id)
    await app.agentd.runs.cancelSession(id)
    // False: a deletion asked for at the same time has it (still under way, on SQLite); a 204 here would come before the session is gone.
    if (!(await store.deleteSession(request.tenant, id))) throw apiError('SESSION_NOT_FOUND', `No session ${id}`)
    app.agentd.bus.endSession(id, 'session deleted')
    await app.agentd.tools.removeWorkspace(id)
    return reply.status(204).send()
  })
}
