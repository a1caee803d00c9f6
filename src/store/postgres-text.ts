import pg from 'pg'

/**
 * PostgreSQL's `text` cannot hold the NUL character (U+0000): the server refuses the whole
 * statement ("invalid byte sequence for encoding UTF8: 0x00"). JSON strings can carry it, and so
 * can what agentd stores as plain text: a client's message, instructions or model name, a model's
 * answer, a tool's name as the model wrote it. The SQLite store keeps such text as it is; this
 * connection class makes the PostgreSQL store do the same, for every statement, whichever column.
 *
 * A string parameter that holds a NUL is written as U+0001 followed by its JSON encoding (which
 * escapes the NUL as `\u0000`); so is one that begins with U+0001 itself, so that reading back is
 * never ambiguous. Every other string, nearly all of them, is written unchanged, so SQL that
 * compares, orders or indexes text sees the same values as before. Text columns are read back
 * through `fromPgText`, which undoes it. A value written before this class that happens to begin
 * with U+0001 and is not JSON after it is read as it is.
 */

const MARK = 1

/** A string as a PostgreSQL text parameter can hold it (see the module's comment). */
export function toPgText(value: string): string {
  return value.charCodeAt(0) === MARK || value.includes('\u0000') ? `\u0001${JSON.stringify(value)}` : value
}

/** A text column's value as it was written through `toPgText`. */
export function fromPgText(value: string): string {
  if (value.charCodeAt(0) !== MARK) return value
  try {
    const decoded: unknown = JSON.parse(value.slice(1))
    return typeof decoded === 'string' ? decoded : value
  } catch {
    return value
  }
}

function toPgParam(value: unknown): unknown {
  if (typeof value === 'string') return toPgText(value)
  // Array parameters (unnest($1::text[]) …) carry strings too.
  if (Array.isArray(value)) return value.map(toPgParam)
  return value
}

const TEXT_OID = 25

/** Type parsers that read `text` through fromPgText and every other type as pg does. */
export const pgTextTypes = {
  getTypeParser(oid: number, format: 'text' | 'binary' = 'text'): (value: string) => unknown {
    if (format === 'binary') return pg.types.getTypeParser(oid, 'binary')
    return oid === TEXT_OID ? fromPgText : pg.types.getTypeParser(oid, 'text')
  }
}

/**
 * pg's Client with every string parameter written through toPgText. The pool makes its
 * connections with it (`Client` option) and the store's own connections are made with it, so
 * no statement can reach the server with a NUL in a parameter. Text inlined into SQL (the
 * store's units of work) goes through toPgText where it is inlined.
 */
export class PgTextClient extends pg.Client {
  constructor(config?: string | pg.ClientConfig) {
    super(typeof config === 'string' ? { connectionString: config, types: pgTextTypes } : { ...config, types: pgTextTypes })
  }

  // pg's query takes (text, values, callback) or (config, callback) or a Submittable; only values change.
  override query(...args: unknown[]): any {
    const [config, values] = args
    if (Array.isArray(values)) args[1] = values.map(toPgParam)
    else if (config !== null && typeof config === 'object' && typeof (config as pg.Submittable).submit !== 'function' &&
      Array.isArray((config as pg.QueryConfig).values)) {
      args[0] = { ...(config as pg.QueryConfig), values: (config as pg.QueryConfig).values!.map(toPgParam) }
    }
    return (super.query as (...a: unknown[]) => unknown)(...args)
  }
}
