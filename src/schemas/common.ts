import { Type, type SchemaOptions, type Static, type TSchema, type TUnsafe } from '@sinclair/typebox'
import { API_ERRORS, type ApiErrorCode } from '../http/errors.ts'

/**
 * A string that is one of `values`, as one JSON Schema `enum` (not a union of constants): client
 * generators turn it into an enum, and a bad value gets one error that lists the allowed ones.
 */
export const StringEnum = <const T extends readonly string[]>(values: T, options: SchemaOptions = {}): TUnsafe<T[number]> =>
  Type.Unsafe<T[number]>({ ...options, type: 'string', enum: [...values] })

/** Token counts, summed per model call, per run and per session. */
export const UsageSchema = Type.Object(
  {
    inputTokens: Type.Integer({ minimum: 0 }),
    outputTokens: Type.Integer({ minimum: 0 }),
    totalTokens: Type.Integer({ minimum: 0 })
  },
  { $id: 'Usage' }
)
export type Usage = Static<typeof UsageSchema>

export const ErrorTypeSchema = StringEnum(['validation', 'runtime', 'logical', 'aborted', 'exception'])
export type ErrorType = Static<typeof ErrorTypeSchema>

/** SPEC 5.1: the one shape of every tool, model and system error. */
export const ClassifiedErrorSchema = Type.Object(
  {
    errorType: ErrorTypeSchema,
    code: Type.String(),
    message: Type.String(),
    retryable: Type.Boolean(),
    fatal: Type.Boolean(),
    recommendations: Type.Array(Type.String()),
    detail: Type.Optional(Type.Record(Type.String(), Type.Unknown()))
  },
  { $id: 'ClassifiedError' }
)
export type ClassifiedError = Static<typeof ClassifiedErrorSchema>

/** SPEC 5.2: the body of every non-2xx response. */
export const ErrorEnvelopeSchema = Type.Object(
  {
    error: Type.Object({
      code: StringEnum(Object.keys(API_ERRORS) as ApiErrorCode[], { description: 'what went wrong; clients branch on this, never on message' }),
      message: Type.String(),
      details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
      retryable: Type.Boolean(),
      requestId: Type.String(),
      timestamp: Type.String({ format: 'date-time' })
    })
  },
  { $id: 'ErrorEnvelope' }
)
export type ErrorEnvelope = Static<typeof ErrorEnvelopeSchema>

export const emptyUsage = (): Usage => ({ inputTokens: 0, outputTokens: 0, totalTokens: 0 })

/** Adds b into a fresh copy of a. */
export function addUsage(a: Usage, b: Usage): Usage {
  return {
    inputTokens: a.inputTokens + b.inputTokens,
    outputTokens: a.outputTokens + b.outputTokens,
    totalTokens: a.totalTokens + b.totalTokens
  }
}

/** A reference to a shared schema by its $id; app.ts registers each with addSchema, OpenAPI shows it as a component. */
export const ref = <T extends TSchema>(schema: T) => Type.Unsafe<Static<T>>(Type.Ref(schema.$id as string))

/** A success response's schema with the description the OpenAPI document shows for it. */
export const answer = <T extends TSchema>(description: string, schema: T) => Type.Unsafe<Static<T>>({ ...schema, description })

/** The error envelope's description at one status: the catalogue's codes that answer with it. */
const errorCodesAt = (status: number) =>
  `ErrorEnvelope; error.code is one of ${Object.entries(API_ERRORS).filter(([, e]) => e.status === status).map(([code]) => code).join(', ')}`

/** Every response status an operation can answer with an error envelope. */
export const errorResponses = (...statuses: number[]) =>
  Object.fromEntries(statuses.map((status) => [status, Type.Unsafe<ErrorEnvelope>({ $ref: 'ErrorEnvelope', description: errorCodesAt(status) })]))
