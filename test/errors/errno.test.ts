import t from 'tap'
import { errnoFamily, errnoOf } from '../../src/errors/errno.ts'
import { classifyModelError } from '../../src/model/model-errors.ts'
import { classifyToolError } from '../../src/tools/tool-errors.ts'

const thrown = (code: string) => Object.assign(new Error(`failed with ${code}`), { code })

t.test('errno and undici codes fall into one family each; other codes into none', async (t) => {
  t.equal(errnoFamily('ENOENT'), 'not_found')
  t.equal(errnoFamily('EPERM'), 'permission')
  t.equal(errnoFamily('UND_ERR_HEADERS_TIMEOUT'), 'timeout')
  t.equal(errnoFamily('ECONNRESET'), 'network')
  t.equal(errnoFamily('EISDIR'), 'filesystem')
  t.equal(errnoFamily('ERR_SOMETHING_ELSE'), undefined)
  t.equal(errnoFamily(undefined), undefined)
  t.equal(errnoOf(thrown('EIO')), 'EIO')
  t.equal(errnoOf({ code: 42 }), undefined, 'only a string code counts')
  t.equal(errnoOf('ENOENT'), undefined)
})

t.test('a timeout or network code means the same to a tool and to a model call', async (t) => {
  for (const code of ['ETIMEDOUT', 'ESOCKETTIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']) {
    t.equal(classifyToolError({ name: 'webhook' }, thrown(code)).code, 'TIMEOUT', `${code} from a tool`)
    t.equal(classifyModelError(thrown(code)).classified.code, 'TIMEOUT', `${code} from the model`)
  }
  for (const code of ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ENOTFOUND', 'ENETDOWN', 'UND_ERR_SOCKET', 'UND_ERR_DESTROYED']) {
    t.equal(classifyToolError({ name: 'webhook' }, thrown(code)).code, 'IO_ERROR', `${code} from a tool`)
    t.equal(classifyModelError(thrown(code)).classified.code, 'NETWORK_ERROR', `${code} from the model`)
  }
})
