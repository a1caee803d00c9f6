import type { ChatCompletionTool } from 'openai/resources/chat/completions'
import type { ModelRequest } from './types.ts'

/**
 * The JSON text of a chat-completions request, made here rather than by the SDK. The tool
 * definitions are most of a request's bytes (3.8 KB of 3.9 for the default tools and a short
 * history) and the same at every call, so each definition's JSON is made once and reused by
 * every run that offers it (the tool catalog hands out the same definition object for a tool
 * each time); the SDK would serialise them again at every call, through a replacer that
 * observes every key (~3 % of agentd's CPU under load, `npm run bench -- throughput`).
 * `askUsage: false` leaves out stream_options, and `completionTokens` asks for max_completion_tokens
 * whatever the model's name, for a server that refuses the other (provider.ts).
 */
export function chatRequestJson(
  request: ModelRequest, { askUsage = true, completionTokens = false }: { askUsage?: boolean; completionTokens?: boolean } = {}
): string {
  let text = `{"model":${JSON.stringify(request.model)},"messages":${JSON.stringify(request.messages)},"stream":true` +
    (askUsage ? ',"stream_options":{"include_usage":true}' : '')
  if (request.tools && request.tools.length > 0) text += `,"tools":${toolsJson(request.tools)}`
  if (request.maxTokens !== undefined) {
    text += `,"${completionTokens ? 'max_completion_tokens' : maxTokensField(request.model)}":${JSON.stringify(request.maxTokens)}`
  }
  return text + '}'
}

/** OpenAI's reasoning models (o1, o3, o4-mini, gpt-5…), which refuse max_tokens with a 400. */
const completionTokensModels = /^(?:azure\/|openai\/)?(?:o\d|gpt-5)/i

/**
 * max_tokens for every server that reads it (Ollama, vLLM, llama.cpp and OpenAI's older models);
 * OpenAI's reasoning models take only max_completion_tokens.
 */
function maxTokensField(model: string): 'max_tokens' | 'max_completion_tokens' {
  return completionTokensModels.test(model) ? 'max_completion_tokens' : 'max_tokens'
}

const definitionJson = new WeakMap<ChatCompletionTool, string>()
const listJson = new WeakMap<readonly ChatCompletionTool[], string>()

/**
 * `JSON.stringify(tools)`, remembered per list and per definition. A definition must not be
 * changed once offered (the catalog's never are; a changed tool is a new object).
 */
export function toolsJson(tools: readonly ChatCompletionTool[]): string {
  let json = listJson.get(tools)
  if (json === undefined) {
    json = `[${tools.map(definitionText).join(',')}]`
    listJson.set(tools, json)
  }
  return json
}

function definitionText(tool: ChatCompletionTool): string {
  let json = definitionJson.get(tool)
  if (json === undefined) {
    json = JSON.stringify(tool)
    definitionJson.set(tool, json)
  }
  return json
}
