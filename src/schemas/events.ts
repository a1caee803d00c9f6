import { Type } from '@sinclair/typebox'

export const EventSchema = Type.Object(
  {
    seq: Type.Integer({ minimum: 1 }),
    sessionId: Type.String(),
    runId: Type.Union([Type.String(), Type.Null()]),
    channel: Type.Union([Type.Literal('progress'), Type.Literal('control'), Type.Literal('monitor')]),
    type: Type.String({ description: 'text_chunk, tool:start, done, …  (SPEC section 4)' }),
    at: Type.String({ format: 'date-time' }),
    requestId: Type.Union([Type.String(), Type.Null()]),
    data: Type.Record(Type.String(), Type.Unknown())
  },
  { $id: 'Event' }
)

export const EventsQuerySchema = Type.Object(
  {
    after: Type.Optional(Type.Integer({ minimum: 0, description: 'replay events with a larger seq (overrides Last-Event-ID)' })),
    channels: Type.Optional(Type.String({ pattern: '^(progress|control|monitor)(,(progress|control|monitor))*$', description: 'comma list' })),
    types: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_:]+(,[A-Za-z0-9_:]+)*$', maxLength: 1000, description: 'comma list of event types' })),
    until: Type.Optional(Type.Literal('done', { description: 'end the stream after the next done event' })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100, description: 'page size of the JSON form' }))
  },
  { additionalProperties: false }
)

export const EventsHeadersSchema = Type.Object({
  'last-event-id': Type.Optional(Type.String({ pattern: '^[0-9]{1,15}$' }))
})
