import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout } from 'node:timers/promises'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { buildTestApp, tempDir } from '../helpers/app.ts'

t.test('creating a session', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_MODEL: 'test-model' } })

  t.test('with no body fields gives the server defaults', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })
    t.equal(res.statusCode, 201)
    const session = res.json()
    t.match(session.id, /^ses_[0-9A-Z]{26}$/)
    t.equal(session.status, 'idle')
    t.equal(session.model, 'test-model')
    t.equal(session.instructions, null)
    t.same(session.tools, ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep'])
    t.same(session.approval, { mode: 'auto' })
    t.same(session.limits, {})
    t.same(session.metadata, {})
    t.equal(session.lastSeq, 0)
    t.same(session.usage, { inputTokens: 0, outputTokens: 0, totalTokens: 0 })
    t.equal(session.forkedFrom, null)
    t.equal(session.createdAt, session.updatedAt)
  })

  t.test('keeps every field it was given', async (t) => {
    const body = {
      model: 'other', instructions: 'Be brief.', tools: [], approval: { mode: 'tools', tools: ['fs_write'] },
      limits: { maxSteps: 5, toolTimeoutMs: 1000, maxTokens: 5000 }, metadata: { user: 'u1' }
    }
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', payload: body })
    t.equal(res.statusCode, 201)
    t.match(res.json(), body)
    t.same(res.json().tools, [])
  })

  t.test('refuses an approval naming a tool no session of this server can have: a typo would leave the tool meant unguarded', async (t) => {
    const typo = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'tools', tools: ['fs_read', 'fs_writ'] } } })
    t.equal(typo.statusCode, 400)
    t.equal(typo.json().error.code, 'VALIDATION_ERROR')
    t.match(typo.json().error.details.fields, [{ field: 'body.approval.tools[1]', keyword: 'tools' }], 'names the entry')
    t.match(typo.json().error.message, /fs_writ/)
    // A session's own client or webhook tool, a pattern and a built-in it did not select are names a policy may hold.
    const ask = { type: 'client', name: 'ask_user', description: 'Ask the user', parameters: { type: 'object' } }
    const fine = await app.inject({
      method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_read', ask], approval: { mode: 'tools', tools: ['ask_user', 'fs_wr*', 'fs_write'] } }
    })
    t.equal(fine.statusCode, 201)
    t.same(fine.json().approval.tools, ['ask_user', 'fs_wr*', 'fs_write'])
    const otherSession = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'tools', tools: ['ask_user'] } } })
    t.equal(otherSession.statusCode, 400, "another session's client tool is not one of this session's")
    const notTools = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always', tools: ['anything'] } } })
    t.equal(notTools.statusCode, 201, 'the names matter only in tools mode')
  })

  t.test('refuses an unknown tool name with a 400 naming it', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_read', 'rm_rf'] } })
    t.equal(res.statusCode, 400)
    t.equal(res.json().error.code, 'VALIDATION_ERROR')
    t.match(res.json().error.message, /rm_rf/)
  })

  t.test('refuses limits above the server limits', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { limits: { maxSteps: 26 } } })
    t.equal(res.statusCode, 400)
    t.same(res.json().error.details.fields.map((f: { field: string }) => f.field), ['body.limits.maxSteps'])
  })
})

t.test('reading and deleting a session', async (t) => {
  const { app } = await buildTestApp(t)
  const created = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { metadata: { a: 'b' } } })).json()

  const got = await app.inject({ method: 'GET', url: `/v1/sessions/${created.id}` })
  t.equal(got.statusCode, 200)
  t.same(got.json(), created)

  const deleted = await app.inject({ method: 'DELETE', url: `/v1/sessions/${created.id}` })
  t.equal(deleted.statusCode, 204)
  t.equal(deleted.body, '')

  const again = await app.inject({ method: 'DELETE', url: `/v1/sessions/${created.id}` })
  t.equal(again.statusCode, 404)
  t.equal(again.json().error.code, 'SESSION_NOT_FOUND')
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${created.id}` })).statusCode, 404)
})

t.test('deleting a session removes its workspace files', async (t) => {
  const { app, devModel, dir } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'secret.txt', content: 'x' } }] }, { text: 'ok' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'write' } })
  const workspace = join(dir, 'workspaces', session.id)
  t.ok(existsSync(join(workspace, 'secret.txt')), 'the tool wrote into the workspace')
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })).statusCode, 204)
  t.notOk(existsSync(workspace), 'the workspace is gone')
})

t.test('a session with server tools has its workspace made before its first message', async (t) => {
  const { app, dir } = await buildTestApp(t)
  const folder = (id: string) => join(dir, 'workspaces', id)
  const withTools = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const without = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  // Deleted at once: its removal waits for the workspace being made, so no folder is left behind.
  const gone = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${gone.id}` })).statusCode, 204)
  await setTimeout(50)
  t.ok(existsSync(folder(withTools.id)), 'the default tools read and write files: the folder is there')
  t.notOk(existsSync(folder(without.id)), 'a session without server tools gets none')
  t.notOk(existsSync(folder(gone.id)), 'a session deleted right after it was created leaves none')
})

t.test('listing sessions pages newest first with a cursor', async (t) => {
  const { app } = await buildTestApp(t)
  const ids: string[] = []
  for (let i = 0; i < 7; i++) ids.push((await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json().id)
  const newestFirst = [...ids].reverse()

  const seen: string[] = []
  let cursor: string | null = null
  let pages = 0
  do {
    const url: string = `/v1/sessions?limit=3${cursor ? `&cursor=${cursor}` : ''}`
    const res = await app.inject({ method: 'GET', url })
    t.equal(res.statusCode, 200)
    const page = res.json()
    seen.push(...page.data.map((s: { id: string }) => s.id))
    cursor = page.nextCursor
    pages++
  } while (cursor)
  t.equal(pages, 3, '7 sessions in pages of 3')
  t.same(seen, newestFirst, 'every session once, newest first')

  const bad = await app.inject({ method: 'GET', url: '/v1/sessions?cursor=not-a-cursor' })
  t.equal(bad.statusCode, 400)
  t.equal(bad.json().error.code, 'VALIDATION_ERROR')
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions?limit=0' })).statusCode, 400)
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions?limit=101' })).statusCode, 400)
})

t.test('sessions survive a restart on the same SQLite file', async (t) => {
  const db = join(tempDir(t), 'agentd.db')
  const first = await buildTestApp(t, { env: { AGENTD_DB: db } })
  const created = (await first.app.inject({ method: 'POST', url: '/v1/sessions', payload: { instructions: 'keep me' } })).json()
  await first.app.close()

  const second = await buildTestApp(t, { env: { AGENTD_DB: db } })
  const got = await second.app.inject({ method: 'GET', url: `/v1/sessions/${created.id}` })
  t.equal(got.statusCode, 200)
  t.same(got.json(), created)
  await second.app.close()

  const store = new SqliteStore(db)
  t.teardown(() => store.close())
  await store.migrate()
  t.equal(await store.countSessions('default'), 1, 'migrations run again without harm')
})

t.test('two DELETEs of one session at once: one 204 once it is gone, the other 404, and the tenant has room at once after the 204', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_MAX_SESSIONS_PER_TENANT: '1' } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  // Enough events that removing them takes several writes.
  for (let i = 0; i < 20_000; i += 2000) {
    await app.agentd.store.commit(Array.from({ length: 2000 }, () => ({
      type: 'event' as const,
      event: { sessionId: session.id, runId: null, channel: 'monitor' as const, type: 'tick', at: new Date().toISOString(), requestId: null, data: {} }
    })))
  }
  const deleteThenCreate = async () => {
    const deleted = await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })
    const created = deleted.statusCode === 204 ? await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} }) : null
    return { deleted, created }
  }
  const answers = await Promise.all([deleteThenCreate(), deleteThenCreate()])
  t.same(answers.map((a) => a.deleted.statusCode).sort(), [204, 404], 'one deletion, and the other finds nothing to delete')
  t.equal(answers.find((a) => a.deleted.statusCode === 404)?.deleted.json().error.code, 'SESSION_NOT_FOUND')
  t.same(answers.filter((a) => a.deleted.statusCode === 204).map((a) => a.created?.statusCode), [201], 'after a 204 the session no longer counts against the limit')
})
