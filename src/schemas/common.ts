import { Type, type Static, type TSchema } from '@sinclair/typebox'

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

export const ErrorTypeSchema = Type.Union([
  Type.Literal('validation'),
  Type.Literal('runtime'),
  Type.Literal('logical'),
  Type.Literal('aborted'),
  Type.Literal('exception')
])
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
      code: Type.String(),
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

/** Every response status an operation can answer with an error envelope. */
export const errorResponses = (...statuses: number[]) =>
  Object.fromEntries(statuses.map((status) => [status, ref(ErrorEnvelopeSchema)]))
