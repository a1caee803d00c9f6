import { readFileSync } from 'node:fs'
import t from 'tap'
import { renderOpenApiDocument } from '../src/openapi-document.ts'

t.test('openapi/openapi.json is what the app serves (run `npm run openapi` after changing a route)', async (t) => {
  const committed = readFileSync(new URL('../openapi/openapi.json', import.meta.url), 'utf8')
  t.equal(await renderOpenApiDocument(), committed)
})

t.test('every operation has a summary, tags and an error envelope response', async (t) => {
  const doc = JSON.parse(readFileSync(new URL('../openapi/openapi.json', import.meta.url), 'utf8'))
  t.equal(doc.openapi, '3.1.0')
  t.ok(doc.components.schemas.ErrorEnvelope, 'ErrorEnvelope is a component')
  const operations = Object.entries(doc.paths as Record<string, Record<string, any>>).flatMap(([path, methods]) =>
    Object.entries(methods).map(([method, op]) => ({ name: `${method.toUpperCase()} ${path}`, op }))
  )
  t.ok(operations.length >= 6, 'has the routes')
  for (const { name, op } of operations) {
    t.ok(op.summary, `${name} has a summary`)
    t.ok(op.tags?.length, `${name} has tags`)
    const errorStatuses = Object.keys(op.responses).filter((s) => Number(s) >= 400)
    if (name.startsWith('GET /healthz')) continue
    t.ok(errorStatuses.length > 0, `${name} declares error responses`)
    for (const status of errorStatuses) {
      const schema = op.responses[status].content['application/json'].schema
      t.equal(schema.$ref, '#/components/schemas/ErrorEnvelope', `${name} ${status} is the envelope`)
    }
  }
})
