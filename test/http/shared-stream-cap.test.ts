import t from 'tap'
import Fastify from 'fastify'
import fp from 'fastify-plugin'
import { Redis } from 'ioredis'
import { get } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { sharedStreamCapPlugin } from '../../src/http/shared-stream-cap.ts'

const TTL_MS = 600

t.test('open streams keep their shared slots past the slot TTL, and free them when they close', async (t) => {
  const redis = new Redis('redis://127.0.0.1:6379', { lazyConnect: true, maxRetriesPerRequest: 1 })
  try {
    await redis.connect()
  } catch {
    t.fail('Redis is not reachable on 127.0.0.1:6379 (see .ci/run)')
    return
  }
  const namespace = `agentd-test-${process.pid}-${Date.now()}:`
  const key = `${namespace}streams:k1`
  const app = Fastify()
  // The cap reads the caller's key from the auth plugin; this one names every caller k1.
  await app.register(fp(async (a) => {
    a.decorateRequest('keyId', 'k1')
  }, { name: 'agentd-auth' }))
  await app.register(sharedStreamCapPlugin, { redis, namespace, max: 2, slotTtlMs: TTL_MS })
  app.get('/v1/sessions/:id/events', (_request, reply) => {
    reply.hijack()
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream' })
    reply.raw.write('retry: 2000\n\n')
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  t.teardown(async () => {
    await app.close()
    await redis.del(key)
    redis.disconnect()
  })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/v1/sessions/s/events`
  const open = () => new Promise<{ status: number; close(): void }>((resolve, reject) => {
    const req = get(url, (res) => resolve({ status: res.statusCode ?? 0, close: () => req.destroy() }))
    req.on('error', reject)
  })

  const first = await open()
  const second = await open()
  t.same([first.status, second.status], [200, 200])
  await sleep(TTL_MS * 3)
  const live = await redis.zcount(key, Date.now(), '+inf')
  t.equal(live, 2, 'both slots were refreshed, with their set, well past one TTL')
  const third = await open()
  t.equal(third.status, 429, 'the cap still counts the two open streams')
  third.close()

  first.close()
  await sleep(200)
  t.equal(await redis.zcard(key), 1, 'a closed stream frees its slot')
  second.close()
})
