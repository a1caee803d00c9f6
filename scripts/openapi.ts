// Writes openapi/openapi.json, the document the app serves. `npm run openapi` after any route or schema change.
import { writeFileSync } from 'node:fs'
import { renderOpenApiDocument } from '../src/openapi-document.ts'

const target = new URL('../openapi/openapi.json', import.meta.url)
writeFileSync(target, await renderOpenApiDocument())
process.stdout.write(`wrote ${target.pathname}\n`)
