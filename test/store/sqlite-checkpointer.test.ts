import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import t from 'tap'
import { WalCheckpointer } from '../../src/store/sqlite-checkpointer.ts'
import { tempDir } from '../helpers/app.ts'
import { rowsInFileCopy } from './file-copy.ts'

t.test('the checkpoint thread copies the WAL into the database file while the writer keeps its connection', async (t) => {
  const dir = tempDir(t)
  const path = join(dir, 'a.db')
  const writer = new DatabaseSync(path)
  t.teardown(() => writer.close())
  writer.exec('PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (n INTEGER)')
  for (let n = 0; n < 50; n++) writer.exec(`INSERT INTO t VALUES (${n})`)
  const inFile = (): number => rowsInFileCopy(path, join(dir, 'copy.db'), 't')
  t.equal(inFile(), 0, 'before: every row is in the WAL only')

  const checkpointer = new WalCheckpointer(path)
  t.teardown(() => checkpointer.close())
  t.equal(checkpointer.request(), true, 'the thread takes the request')
  t.equal(checkpointer.request(), true, 'and one asked for meanwhile')
  await checkpointer.settled()
  t.equal(inFile(), 50, 'after: the database file alone holds every row')

  writer.exec('INSERT INTO t VALUES (50)')
  t.equal((writer.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n, 51, 'the writer goes on')
  await checkpointer.close()
  t.equal(checkpointer.request(), true, 'a request after close is answered and ignored')
})

t.test('a checkpoint thread that cannot open the database gives up and says why, once: the caller checkpoints itself', async (t) => {
  const failures: Error[] = []
  const checkpointer = new WalCheckpointer(join(tempDir(t), 'no', 'such', 'dir', 'a.db'), (err) => failures.push(err))
  t.teardown(() => checkpointer.close())
  t.equal(checkpointer.request(), true, 'the first request goes to the thread')
  await checkpointer.settled()
  t.equal(checkpointer.request(), false, 'once it has failed, requests are refused')
  t.equal(checkpointer.request(), false, 'every one of them')
  t.equal(failures.length, 1, 'the failure is reported once')
  t.match(failures[0]?.message, /unable to open database file/, "with SQLite's reason")
})
