import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { newId } from '../ids.ts'

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/** SPEC 6: the caller's X-Request-Id when it is well formed, else a new one. Fastify's `genReqId`. */
export function requestIdFor(request: IncomingMessage): string {
  const given = request.headers['x-request-id']
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : newId('req')
}

/** Echoes the request ID on every response, errors and unknown routes included. */
export const requestIdPlugin = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', async (request, reply) => {
      reply.header('x-request-id', request.id)
    })
  },
  { name: 'agentd-request-id' }
)
