/**
 * The worker thread of WalCheckpointer (sqlite-checkpointer.ts): a connection of its own to the
 * store's database file that copies the WAL into it on request, so that the copy and its fsyncs
 * never hold the service's event loop. Each 'checkpoint' message gets one answer; 'close' closes
 * the connection and lets the thread end.
 */
import { DatabaseSync } from 'node:sqlite'
import { parentPort, workerData } from 'node:worker_threads'

/** What the thread answers a 'checkpoint' with: done, or why it failed. */
export type CheckpointAnswer = { ok: true } | { ok: false; message: string }

const port = parentPort
if (!port) throw new Error('sqlite-checkpoint-worker.ts runs as a worker thread')

const db = new DatabaseSync((workerData as { path: string }).path)
// PASSIVE never waits for the writer or for readers: it copies what it can and answers.
const checkpoint = db.prepare('PRAGMA wal_checkpoint(PASSIVE)')

port.on('message', (message: 'checkpoint' | 'close') => {
  if (message === 'close') {
    db.close()
    port.close()
    return
  }
  let answer: CheckpointAnswer
  try {
    checkpoint.get()
    answer = { ok: true }
  } catch (err) {
    answer = { ok: false, message: (err as Error).message }
  }
  port.postMessage(answer)
})
