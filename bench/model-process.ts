/**
 * Child process entry: a model server, so that the model never shares an event loop with the
 * service or the bench client. `node bench/model-process.ts dev` runs the dev model;
 * `node bench/model-process.ts stamping '{"chunks":20,"intervalMs":10,"toolName":"fs_list"}'` the stamping model.
 */
import { startDevModel } from '../src/model/dev-model.ts'
import { serveChild } from './child.ts'
import { startStampingModel, type StampingModelOptions } from './stamping-model.ts'

const [kind, options] = process.argv.slice(2)
const model = kind === 'dev'
  ? await startDevModel({ host: '127.0.0.1', port: 0 })
  : await startStampingModel(JSON.parse(options ?? '{}') as StampingModelOptions)
serveChild(model.url, () => model.close())
