import t from 'tap'
import { errnoFamily, errnoOf, tlsFailureOf } from '../../src/errors/errno.ts'
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

t.test('a certificate or TLS verification failure is found anywhere in the cause chain; a handshake timeout is not one', async (t) => {
  for (const code of ['DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
    'CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID', 'ERR_TLS_CERT_ALTNAME_INVALID', 'HOSTNAME_MISMATCH', 'ERR_SSL_WRONG_VERSION_NUMBER',
    'ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE', 'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION', 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED',
    'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE', 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA', 'ERR_SSL_TLSV1_ALERT_UNRECOGNIZED_NAME',
    'ERR_SSL_UNSUPPORTED_PROTOCOL', 'ERR_SSL_DH_KEY_TOO_SMALL']) {
    t.equal(tlsFailureOf(thrown(code)), code, code)
  }
  // Alerts a broken or busy peer may send once, and a connection that ended mid-record: a retry may get through.
  for (const code of ['ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR', 'ERR_SSL_SSL/TLS_ALERT_BAD_RECORD_MAC', 'ERR_SSL_TLSV1_ALERT_DECODE_ERROR',
    'ERR_SSL_UNEXPECTED_EOF_WHILE_READING', 'ERR_SSL_DECRYPTION_FAILED_OR_BAD_RECORD_MAC']) {
    t.equal(tlsFailureOf(thrown(code)), undefined, code)
  }
  const wrapped = new TypeError('fetch failed', { cause: Object.assign(new Error('connect failed'), { code: 'UND_ERR_CONNECT', cause: thrown('CERT_HAS_EXPIRED') }) })
  t.equal(tlsFailureOf(wrapped), 'CERT_HAS_EXPIRED', 'under fetch\'s TypeError and undici\'s own code')
  for (const code of ['ERR_TLS_HANDSHAKE_TIMEOUT', 'ECONNRESET', 'UND_ERR_SOCKET']) t.equal(tlsFailureOf(thrown(code)), undefined, code)
  t.equal(tlsFailureOf('CERT_HAS_EXPIRED'), undefined, 'a string is not an error')
})
