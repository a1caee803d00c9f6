// The agentd console: plain DOM, no build step. It speaks only the public HTTP API, so anything it
// does any other client can do. Events are read with fetch + a stream reader rather than
// EventSource, which cannot send Authorization or a chosen Last-Event-ID.

const $ = (id) => document.getElementById(id)
const KEY_STORE = 'agentd.apiKey'
const OPEN_STORE = 'agentd.openSession'
const RECONNECT_MS = 2000
/**
 * A stream silent this long, three of the pings the server sends every 15 s missed, is taken for
 * dead and reopened: a connection that stops carrying anything without being closed (a NAT that
 * forgot it, a server host that lost power) is never ended by the browser.
 */
const STREAM_IDLE_MS = 45_000
/** Stored events read per request when a session opens (the most the API gives at once). */
const EVENT_PAGE = 1000

/** An HTTP failure carrying the service's error envelope (or a stand-in for a network failure). */
class ApiFailure extends Error {
  constructor(status, envelope) {
    super(envelope.message)
    this.status = status
    this.envelope = envelope
  }
}

// ---------------------------------------------------------------- API

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE)
  return key ? { authorization: `Bearer ${key}` } : {}
}

async function api(method, path, body) {
  const headers = { accept: 'application/json', ...authHeaders() }
  if (body !== undefined) headers['content-type'] = 'application/json'
  let response
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
  } catch (err) {
    throw new ApiFailure(0, { code: 'NETWORK_ERROR', message: `The service cannot be reached (${err.message})` })
  }
  if (response.status === 204) return null
  const text = await response.text()
  let json = null
  try {
    json = text ? JSON.parse(text) : null
  } catch {
    // Not JSON (a proxy's error page): shown below as it came.
  }
  if (!response.ok) {
    const envelope = json?.error ?? { code: `HTTP_${response.status}`, message: text.slice(0, 300) || response.statusText }
    throw new ApiFailure(response.status, envelope)
  }
  return json
}

// ---------------------------------------------------------------- errors

function showError(err) {
  const envelope = err instanceof ApiFailure ? err.envelope : { code: 'CONSOLE_ERROR', message: String(err?.message ?? err) }
  const box = el('div', { class: 'error-card', role: 'alert' },
    el('div', { class: 'error-title' },
      el('strong', {}, envelope.code),
      err instanceof ApiFailure && err.status ? el('span', { class: 'muted' }, ` HTTP ${err.status}`) : null,
      envelope.retryable ? el('span', { class: 'badge warn' }, 'retryable') : null,
      el('button', { class: 'link close', title: 'Dismiss', onclick: () => box.remove() }, '×')),
    el('div', { class: 'error-message' }, envelope.message),
    envelope.details ? el('pre', { class: 'small' }, JSON.stringify(envelope.details, null, 2)) : null,
    envelope.requestId ? el('div', { class: 'muted small' }, 'request ', copyable(envelope.requestId)) : null)
  // A modal dialog covers the page and takes every click: its own failures show in it.
  const host = $('new-dialog').open ? $('new-errors') : $('errors')
  host.prepend(box)
  if (err instanceof ApiFailure && err.status === 401) $('api-key').focus()
}

/**
 * Runs an action started by the user; failures are shown, never thrown into the void. The action
 * starts at once, not a tick later: its `event.preventDefault()` must come while the event is
 * being dispatched (a form sent with requestSubmit() was otherwise also submitted the browser's way).
 */
const guarded = (action) => (...args) => new Promise((resolve) => resolve(action(...args))).catch(showError)

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value)
    else if (name === 'dataset') Object.assign(node.dataset, value)
    else node.setAttribute(name, value === true ? '' : value)
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    node.append(child instanceof Node ? child : document.createTextNode(String(child)))
  }
  return node
}

function copyable(text) {
  const button = el('button', { class: 'copy', title: 'Copy to the clipboard' }, 'copy')
  button.addEventListener('click', async (event) => {
    event.stopPropagation()
    try {
      await navigator.clipboard.writeText(text)
      button.textContent = 'copied'
    } catch {
      // Clipboard access needs a secure context; select the text so Ctrl+C works instead.
      getSelection().selectAllChildren(code)
      button.textContent = 'press Ctrl+C'
    }
    setTimeout(() => { button.textContent = 'copy' }, 1500)
  })
  const code = el('code', {}, text)
  return el('span', { class: 'copyable' }, code, button)
}

/** JSON for people: one line when it is short, indented when it is not. */
const json = (value) => {
  const line = JSON.stringify(value)
  return line !== undefined && line.length <= 90 ? line : JSON.stringify(value, null, 2)
}
const time = (iso) => (iso ? new Date(iso).toLocaleTimeString() : '')
const short = (value, max = 160) => {
  const text = typeof value === 'string' ? value : JSON.stringify(value)
  return text.length > max ? `${text.slice(0, max)}…` : text
}

// ---------------------------------------------------------------- sessions list

const list = { cursor: null }

async function loadSessions(reset = true) {
  if (reset) {
    list.cursor = null
    $('session-list').replaceChildren()
  }
  const query = new URLSearchParams({ limit: '20' })
  if (list.cursor) query.set('cursor', list.cursor)
  const page = await api('GET', `/v1/sessions?${query}`)
  for (const session of page.data) $('session-list').append(sessionItem(session))
  list.cursor = page.nextCursor
  $('more-sessions').hidden = !page.nextCursor
  markOpenSession()
}

function sessionItem(session) {
  return el('li', { dataset: { id: session.id } },
    el('button', { class: 'session-item', onclick: guarded(() => openSession(session.id)) },
      el('span', { class: 'mono' }, session.id),
      el('span', { class: `badge ${session.status}` }, session.status),
      el('span', { class: 'muted small' }, `${session.model} · ${new Date(session.createdAt).toLocaleString()}`)))
}

function markOpenSession() {
  for (const item of $('session-list').children) item.classList.toggle('active', item.dataset.id === view?.session.id)
}

// ---------------------------------------------------------------- new session

let toolCatalog = null

async function openNewDialog() {
  toolCatalog ??= (await api('GET', '/v1/tools')).data
  $('new-tools').replaceChildren(...toolCatalog.map((tool) =>
    el('div', { class: 'tool-choice' },
      el('label', { title: tool.description },
        el('input', { type: 'checkbox', name: 'use', value: tool.name, checked: tool.name.startsWith('fs_') }), ' ',
        el('span', { class: 'mono' }, tool.name)),
      el('label', { class: 'small muted' }, el('input', { type: 'checkbox', name: 'ask', value: tool.name }), ' ask'))))
  $('new-errors').replaceChildren()
  $('new-dialog').showModal()
}

async function createSession(event) {
  event.preventDefault()
  const form = $('new-form')
  const tools = [...form.querySelectorAll('input[name=use]:checked')].map((input) => input.value)
  const clientText = $('new-client-tools').value.trim()
  if (clientText) {
    let specs
    try {
      specs = JSON.parse(clientText)
    } catch (err) {
      throw new ApiFailure(0, { code: 'INVALID_JSON', message: `Client tools: ${err.message}` })
    }
    for (const spec of Array.isArray(specs) ? specs : [specs]) tools.push({ type: 'client', parameters: { type: 'object' }, description: '', ...spec })
  }
  const body = { tools }
  if ($('new-model').value.trim()) body.model = $('new-model').value.trim()
  if ($('new-instructions').value.trim()) body.instructions = $('new-instructions').value.trim()
  const mode = $('new-approval').value
  body.approval = mode === 'tools'
    ? { mode, tools: [...form.querySelectorAll('input[name=ask]:checked')].map((input) => input.value) }
    : { mode }
  const session = await api('POST', '/v1/sessions', body)
  $('new-dialog').close()
  await loadSessions()
  await openSession(session.id)
}

// ---------------------------------------------------------------- one session

/** What is shown of the open session: its timeline items and the stream feeding them. */
let view = null
/** Counts the opens begun: one that a later click overtook while it read gives way to it. */
let opens = 0

async function openSession(id) {
  const open = ++opens
  const session = await api('GET', `/v1/sessions/${encodeURIComponent(id)}`)
  const opened = {
    session,
    stream: new AbortController(),
    lastSeq: 0,
    /** Each run's user message, by run ID: what a run's item shows first. */
    prompts: new Map(),
    /** The messages page read last (readPrompts goes on from there), and the read in flight. */
    messages: { cursor: null, reading: null },
    /** While the stored events are read as JSON pages: the page is drawn, and scrolled, once. */
    catchingUp: false,
    runs: new Map(),
    calls: new Map(),
    blocks: new Map()
  }
  await readPrompts(opened)
  // Shown and followed only if no session was clicked since: an earlier, slower open would
  // replace the one asked for last, and its stream would never be closed.
  if (open !== opens) return
  // The session shown so far stops following only now: one that cannot be opened (deleted by
  // another client) leaves it on screen and live, not frozen under a "live" badge.
  view?.stream.abort()
  sessionStorage.setItem(OPEN_STORE, id)
  view = opened
  $('empty').hidden = true
  $('session').hidden = false
  $('session-id').replaceChildren(copyable(session.id))
  renderSessionHead()
  $('timeline').replaceChildren()
  $('raw').replaceChildren()
  markOpenSession()
  follow(view)
}

function renderSessionHead() {
  const { session } = view
  const tools = session.tools.map((tool) => (typeof tool === 'string' ? tool : `${tool.name} (${tool.type})`))
  const usage = session.usage
  $('session-meta').textContent = [
    session.model,
    `tools: ${tools.join(', ') || 'none'}`,
    `approval: ${session.approval.mode}${session.approval.tools?.length ? ` (${session.approval.tools.join(', ')})` : ''}`,
    `tokens: ${usage.inputTokens} in / ${usage.outputTokens} out`
  ].join(' · ')
  setBadge($('session-status'), session.status)
  // The list too: state_changed left the run's last state there ("completed", "failed").
  for (const badge of document.querySelectorAll(`#session-list li[data-id="${session.id}"] .badge`)) setBadge(badge, session.status)
}

function setBadge(node, status) {
  node.textContent = status
  node.className = `badge ${status}`
}

/**
 * Follows the session's events for as long as it is open: first the stored ones as JSON pages
 * (after a reload this rebuilds the timeline), then the live SSE stream from the last seq seen
 * (Last-Event-ID), reconnecting after any drop (server restart, network) from wherever it got to.
 * Events at or below the last seq are dropped, so nothing is shown twice across a reconnect.
 */
async function follow(current) {
  const { signal } = current.stream
  const id = encodeURIComponent(current.session.id)
  let refusedWith = null
  /** Gives the stream up when it stays silent (see STREAM_IDLE_MS); every chunk read restarts it. */
  let silence
  while (!signal.aborted) {
    try {
      setBadge($('stream-status'), current.lastSeq === 0 ? 'loading' : 'catching up')
      current.catchingUp = true
      try {
        for (;;) {
          const page = await api('GET', `/v1/sessions/${id}/events?after=${current.lastSeq}&limit=${EVENT_PAGE}`)
          if (signal.aborted) return
          page.data.forEach((event) => receive(current, event))
          scrollToEnd()
          if (page.data.length < EVENT_PAGE) break
        }
      } finally {
        current.catchingUp = false
      }
      // Once for all the runs that ended while it was away (each `done` read live refreshes it).
      refreshSession(current)
      const connection = new AbortController()
      const heard = () => {
        clearTimeout(silence)
        silence = setTimeout(() => connection.abort(), STREAM_IDLE_MS)
      }
      const closed = AbortSignal.any([signal, connection.signal])
      heard()
      const response = await fetch(`/v1/sessions/${id}/events`, {
        headers: { accept: 'text/event-stream', 'last-event-id': String(current.lastSeq), ...authHeaders() },
        signal: closed
      })
      if (!response.ok) {
        const failure = new ApiFailure(response.status, (await response.json().catch(() => null))?.error ?? { code: `HTTP_${response.status}`, message: response.statusText })
        if (response.status === 404 || response.status === 401) throw failure
        // Shown once per kind of refusal (a 429 repeats at every retry), not every two seconds.
        if (failure.envelope.code !== refusedWith) showError(failure)
        refusedWith = failure.envelope.code
      } else {
        refusedWith = null
        setBadge($('stream-status'), 'live')
        await readSse(response.body, closed, (event) => receive(current, event), heard)
      }
    } catch (err) {
      if (signal.aborted) return
      if (err instanceof ApiFailure && (err.status === 404 || err.status === 401)) {
        setBadge($('stream-status'), 'stopped')
        showError(err)
        return
      }
    } finally {
      clearTimeout(silence)
    }
    if (signal.aborted) return
    setBadge($('stream-status'), 'reconnecting')
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS))
  }
}

/** Parses an SSE body into events (the `data:` of each frame is the event as JSON); `heard` is told of every chunk, pings included. */
async function readSse(body, signal, onEvent, heard) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader()
  signal.addEventListener('abort', () => reader.cancel().catch(() => {}), { once: true })
  let buffer = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) return
    heard()
    buffer += value.replaceAll('\r\n', '\n')
    let end
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end)
      buffer = buffer.slice(end + 2)
      const data = frame.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trimStart()).join('\n')
      if (data) onEvent(JSON.parse(data))
    }
  }
}

function receive(current, event) {
  if (current !== view || event.seq <= current.lastSeq) return
  current.lastSeq = event.seq
  $('raw').append(el('li', { dataset: { seq: event.seq } }, el('pre', {}, JSON.stringify(event))))
  render(current, event)
  // Reading the timeline's height lays the page out: once per event live, once per page when
  // catching up (per event, a session of 10 000 events took 15 s to open).
  if (!current.catchingUp) scrollToEnd()
}

function scrollToEnd() {
  const timeline = $('timeline')
  const nearEnd = timeline.scrollHeight - timeline.scrollTop - timeline.clientHeight < 160
  if (nearEnd) timeline.scrollTop = timeline.scrollHeight
}

// ---------------------------------------------------------------- timeline

/** One timeline entry: a header line, a body, its events as raw JSON one click away, and fork. */
function item(current, event, kind, title, ...body) {
  const raw = el('pre', { class: 'raw-json', hidden: true })
  const events = [event]
  const node = el('li', { class: `item ${kind}`, dataset: { seq: event.seq, type: event.type } },
    el('div', { class: 'item-head' },
      el('span', { class: 'item-title' }, title),
      el('span', { class: 'item-tools' },
        el('span', { class: 'muted small' }, time(event.at)),
        el('button', { class: 'link small', title: 'Show the raw events', onclick: () => {
          raw.hidden = !raw.hidden
          raw.textContent = events.map((e) => json(e)).join('\n')
        } }, `#${event.seq}`),
        el('button', { class: 'link small fork', title: 'Fork a new session with the history up to this event', onclick: guarded(() => fork(current, Number(node.dataset.lastSeq))) }, 'fork'))),
    el('div', { class: 'item-body' }, ...body),
    raw)
  node.dataset.lastSeq = event.seq
  node.addEvent = (next) => {
    events.push(next)
    node.dataset.lastSeq = next.seq
    if (!raw.hidden) raw.textContent = events.map((e) => json(e)).join('\n')
  }
  $('timeline').append(node)
  return node
}

function runOf(current, event) {
  let run = current.runs.get(event.runId)
  if (run || !event.runId) return run
  const prompt = current.prompts.get(event.runId)
  const node = item(current, event, 'run', el('span', {}, 'Run ', el('span', { class: 'mono' }, event.runId)),
    prompt !== undefined ? el('div', { class: 'bubble user' }, prompt) : null,
    el('div', { class: 'muted small' }, 'request ID ', copyable(event.requestId ?? '—')))
  run = { node }
  current.runs.set(event.runId, run)
  if (prompt === undefined) fillPrompt(current, event.runId, node)
  return run
}

/**
 * Reads the conversation's user messages into `current.prompts`, a page of 1000 at a time, from
 * the page read last (its cursor kept): at the start all of them, later only what is new.
 * One read at a time; a caller during a read waits for it.
 */
async function readPrompts(current) {
  const { messages } = current
  if (!messages.reading) {
    messages.reading = (async () => {
      for (;;) {
        const query = new URLSearchParams({ limit: '1000' })
        if (messages.cursor) query.set('cursor', messages.cursor)
        const page = await api('GET', `/v1/sessions/${encodeURIComponent(current.session.id)}/messages?${query}`)
        for (const m of page.data) if (m.role === 'user') current.prompts.set(m.runId, m.content)
        // The last page is read again next time, from the cursor that led to it: it may have grown.
        if (!page.nextCursor) return
        messages.cursor = page.nextCursor
      }
    })().finally(() => {
      messages.reading = null
    })
  }
  return messages.reading
}

/** A run started after the conversation was read (by this or another client): its user message is read now. */
async function fillPrompt(current, runId, node) {
  await readPrompts(current).catch(() => undefined)
  // A read already under way may have passed the message by: one more, from where it ended.
  if (!current.prompts.has(runId)) await readPrompts(current).catch(() => undefined)
  const prompt = current.prompts.get(runId)
  if (prompt !== undefined) node.querySelector('.item-body').prepend(el('div', { class: 'bubble user' }, prompt))
}

function render(current, event) {
  runOf(current, event)
  const { data, type } = event
  const blockKey = `${event.runId}:${data?.step}`
  switch (type) {
    case 'text_chunk_start': {
      const text = el('div', { class: 'bubble assistant streaming' })
      current.blocks.set(`text:${blockKey}`, { node: item(current, event, 'text', 'Answer', text), text })
      return
    }
    case 'text_chunk':
    case 'text_chunk_end': {
      const block = current.blocks.get(`text:${blockKey}`) ?? startLate(current, event, 'text', 'Answer', 'bubble assistant streaming')
      block.node.addEvent(event)
      if (type === 'text_chunk') block.text.textContent += data.delta
      else {
        block.text.textContent = data.text
        block.text.classList.remove('streaming')
      }
      return
    }
    case 'think_chunk_start': {
      const text = el('div', { class: 'thinking-text' })
      const details = el('details', {}, el('summary', {}, 'Thinking…'), text)
      current.blocks.set(`think:${blockKey}`, { node: item(current, event, 'think', 'Thinking', details), text })
      return
    }
    case 'think_chunk':
    case 'think_chunk_end': {
      const block = current.blocks.get(`think:${blockKey}`) ?? startLate(current, event, 'think', 'Thinking', 'thinking-text')
      block.node.addEvent(event)
      if (type === 'think_chunk') block.text.textContent += data.delta ?? ''
      else if (typeof data.text === 'string') block.text.textContent = data.text
      return
    }
    case 'tool:start':
    case 'tool:end':
    case 'tool_executed':
    case 'permission_required':
    case 'tool_result_required':
      return toolCard(current, event, data.call)
    case 'tool:error': {
      const card = toolCard(current, event, data.call)
      card.error.replaceChildren(classifiedError(data.error))
      return
    }
    case 'permission_decided': {
      const card = current.calls.get(data.callId)
      if (!card) return
      card.node.addEvent(event)
      card.actions.replaceChildren(el('div', {},
        el('span', { class: `badge ${data.decision === 'allow' ? 'completed' : 'failed'}` }, data.decision === 'allow' ? 'allowed' : 'denied'),
        data.note ? el('span', { class: 'muted small' }, ` ${data.note}`) : null))
      return
    }
    case 'state_changed':
      setBadge($('session-status'), data.to)
      for (const badge of document.querySelectorAll(`#session-list li[data-id="${current.session.id}"] .badge`)) setBadge(badge, data.to)
      return void item(current, event, 'line', `state ${data.from} → ${data.to}`)
    case 'token_usage':
      return void item(current, event, 'line', `tokens: ${data.inputTokens} in, ${data.outputTokens} out, ${data.totalTokens} total`)
    case 'step_complete':
      return void item(current, event, 'line', `step ${data.step} complete in ${data.durationMs} ms`)
    case 'model_retry':
      return void item(current, event, 'retry', `model retry ${data.attempt} in ${data.delayMs} ms (${data.code}${data.status ? `, HTTP ${data.status}` : ''})`)
    case 'error':
      // A tool's error is already on its card; the monitor copy only needs a line.
      if (data.phase === 'tool') return void item(current, event, 'retry', `${data.severity} in tool: ${data.detail?.code ?? ''} ${data.message}`)
      return void item(current, event, `monitor-error ${data.severity}`, `${data.severity} in ${data.phase}: ${data.message}`,
        data.detail ? classifiedError(data.detail) : null)
    case 'run_recovered': {
      // sealedCalls holds the IDs of the calls that got a sealed result.
      const sealed = data.sealedCalls?.length ?? 0
      return void item(current, event, 'retry', `run recovered after a restart (was ${data.previousStatus}; ${sealed} call${sealed === 1 ? '' : 's'} sealed)`)
    }
    case 'done':
      if (!current.catchingUp) refreshSession(current)
      return void item(current, event, `done ${data.reason}`, `run ${data.reason}`)
    default:
      return void item(current, event, 'line', type, data ? el('code', { class: 'small' }, short(data)) : null)
  }
}

/** A text or thinking block whose start event this view did not get (a fork starting mid-block). */
function startLate(current, event, kind, title, textClass) {
  const text = el('div', { class: textClass })
  const block = { node: item(current, event, kind, title, text), text }
  current.blocks.set(`${kind}:${event.runId}:${event.data?.step}`, block)
  return block
}

function toolCard(current, event, call) {
  let card = current.calls.get(call.id)
  if (!card) {
    const state = el('span', { class: 'badge' })
    const result = el('div', { class: 'tool-result' })
    const error = el('div', {})
    const actions = el('div', { class: 'tool-actions' })
    const node = item(current, event, 'tool', el('span', {}, 'Tool ', el('span', { class: 'mono strong' }, call.name), ' ', state),
      el('div', { class: 'muted small' }, 'call ', el('span', { class: 'mono' }, call.id)),
      el('div', { class: 'label' }, 'input'), el('pre', { class: 'tool-input' }, json(call.input)),
      actions, result, error)
    node.dataset.tool = call.name
    card = { node, state, result, error, actions }
    current.calls.set(call.id, card)
  } else card.node.addEvent(event)
  setBadge(card.state, call.state)
  if (call.durationMs !== undefined && call.durationMs !== null) card.state.textContent = `${call.state} · ${call.durationMs} ms`
  if (event.type === 'permission_required') card.actions.replaceChildren(approvalButtons(current, call))
  if (event.type === 'tool_result_required') card.actions.replaceChildren(resultForm(current, call))
  if (call.result !== undefined && call.state === 'completed') {
    card.result.replaceChildren(el('div', { class: 'label' }, 'result'), el('pre', {}, typeof call.result === 'string' ? call.result : json(call.result)))
  }
  if (call.state !== 'approval_required' && call.state !== 'pending' && event.type === 'tool:end') {
    card.actions.querySelector('.approval, .client-form')?.remove()
  }
  return card
}

function classifiedError(error) {
  return el('div', { class: 'classified' },
    el('div', {},
      el('span', { class: `badge ${error.errorType}` }, error.errorType), ' ',
      el('strong', { class: 'mono' }, error.code), ' ',
      el('span', { class: 'badge' }, error.retryable ? 'retryable' : 'not retryable'),
      error.fatal ? el('span', { class: 'badge failed' }, 'fatal') : null),
    el('div', { class: 'error-message' }, error.message),
    error.recommendations?.length ? el('ul', { class: 'recommendations' }, error.recommendations.map((r) => el('li', {}, r))) : null)
}

/**
 * Runs `post` with `buttons` disabled: a call takes one answer, and a second click (a double
 * click, or a click while the first is on its way) would be refused with 409 NOT_AWAITING.
 * They come back only when the answer failed, to try again.
 */
async function answering(buttons, post) {
  for (const button of buttons) button.disabled = true
  try {
    await post()
  } catch (err) {
    for (const button of buttons) button.disabled = false
    throw err
  }
}

function approvalButtons(current, call) {
  const decide = (decision) => guarded(() => answering([allow, deny], () =>
    api('POST', `/v1/sessions/${encodeURIComponent(current.session.id)}/approvals/${encodeURIComponent(call.id)}`, { decision })))
  const allow = el('button', { class: 'primary allow', onclick: decide('allow') }, 'Allow')
  const deny = el('button', { class: 'danger deny', onclick: decide('deny') }, 'Deny')
  return el('div', { class: 'approval' }, el('span', { class: 'strong' }, 'Waiting for approval '), allow, deny)
}

function resultForm(current, call) {
  const output = el('textarea', { rows: 3, class: 'client-output', spellcheck: 'false', placeholder: 'the output, as JSON or plain text' })
  const submit = (asError) => guarded(async (event) => {
    event.preventDefault()
    const text = output.value
    let body
    if (asError) body = { error: text || 'The user gave no answer' }
    else {
      try {
        body = { output: JSON.parse(text) }
      } catch {
        body = { output: text }
      }
    }
    await answering([send, fail], () =>
      api('POST', `/v1/sessions/${encodeURIComponent(current.session.id)}/tool-results/${encodeURIComponent(call.id)}`, body))
  })
  const send = el('button', { type: 'submit', class: 'primary send-result' }, 'Send result')
  const fail = el('button', { type: 'button', class: 'danger', onclick: submit(true) }, 'Send as error')
  return el('form', { class: 'client-form', onsubmit: submit(false) },
    el('div', { class: 'strong' }, `Your answer for ${call.name}`),
    output,
    el('div', {}, send, ' ', fail))
}

async function refreshSession(current) {
  const session = await api('GET', `/v1/sessions/${encodeURIComponent(current.session.id)}`).catch(() => null)
  if (!session || current !== view) return
  current.session = session
  renderSessionHead()
}

async function fork(current, atSeq) {
  const session = await api('POST', `/v1/sessions/${encodeURIComponent(current.session.id)}/fork`, { atSeq })
  await loadSessions()
  await openSession(session.id)
}

// ---------------------------------------------------------------- composer

/** True while a message is on its way: the box is emptied only once it is accepted. */
let sending = false

async function send(event) {
  event.preventDefault()
  const content = $('message').value
  // Another Enter before the answer would send the same text again.
  if (!content.trim() || !view || sending) return
  sending = true
  try {
    const answer = await api('POST', `/v1/sessions/${encodeURIComponent(view.session.id)}/messages`, { content, onBusy: $('on-busy').value })
    view.prompts.set(answer.run.id, content)
    $('message').value = ''
  } finally {
    sending = false
  }
}

async function interrupt() {
  if (!view) return
  // Disabled until the run has stopped (the answer waits for it): a second click would find none.
  $('interrupt').disabled = true
  try {
    await api('POST', `/v1/sessions/${encodeURIComponent(view.session.id)}/interrupt`)
  } finally {
    $('interrupt').disabled = false
  }
}

// ---------------------------------------------------------------- start

function start() {
  $('api-key').value = sessionStorage.getItem(KEY_STORE) ?? ''
  $('key-form').addEventListener('submit', guarded(async (event) => {
    event.preventDefault()
    const key = $('api-key').value.trim()
    // fetch refuses such a key before sending, as a failure of the network; the password field
    // hides the curly quote that was pasted with it.
    const bad = /[^\0-\xff]/u.exec(key)
    if (bad) {
      const code = bad[0].codePointAt(0).toString(16).toUpperCase().padStart(4, '0')
      throw new ApiFailure(0, { code: 'INVALID_KEY', message: `The key holds a character an HTTP header cannot carry (U+${code} at position ${bad.index + 1}): was it copied with a curly quote?` })
    }
    if (key) sessionStorage.setItem(KEY_STORE, key)
    else sessionStorage.removeItem(KEY_STORE)
    $('errors').replaceChildren()
    await loadSessions()
    const open = view?.session.id ?? sessionStorage.getItem(OPEN_STORE)
    if (open) await openSession(open)
  }))
  $('new-session').addEventListener('click', guarded(openNewDialog))
  $('new-form').addEventListener('submit', guarded(createSession))
  $('new-cancel').addEventListener('click', () => $('new-dialog').close())
  $('more-sessions').addEventListener('click', guarded(() => loadSessions(false)))
  $('composer').addEventListener('submit', guarded(send))
  $('message').addEventListener('keydown', (event) => {
    // An Enter that confirms an input method's composition (Japanese, Chinese, Korean) is not a
    // send; Safari reports it with isComposing already false, but with keyCode 229.
    if (event.isComposing || event.keyCode === 229) return
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault()
      $('composer').requestSubmit()
    }
  })
  $('interrupt').addEventListener('click', guarded(interrupt))
  $('toggle-raw').addEventListener('click', () => {
    $('raw').hidden = !$('raw').hidden
    $('timeline').hidden = !$('raw').hidden
    $('toggle-raw').textContent = $('raw').hidden ? 'Raw events' : 'Timeline'
  })
  guarded(async () => {
    await loadSessions()
    const open = sessionStorage.getItem(OPEN_STORE)
    if (open) {
      await openSession(open).catch((err) => {
        // Deleted since (by another client): said once, not at every reload of the tab.
        if (err instanceof ApiFailure && err.status === 404) sessionStorage.removeItem(OPEN_STORE)
        throw err
      })
    }
  })()
}

start()
