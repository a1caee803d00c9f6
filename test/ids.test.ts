import t from 'tap'
import { ID_PATTERN, newId } from '../src/ids.ts'

t.test('IDs match the documented pattern and sort in the order they were made', async (t) => {
  const ids = Array.from({ length: 5000 }, () => newId('ses'))
  for (const id of ids) if (!new RegExp(ID_PATTERN.session).test(id)) t.fail(`${id} does not match ${ID_PATTERN.session}`)
  t.same([...ids].sort(), ids, 'made within the same milliseconds, they still sort in order')
  t.equal(new Set(ids).size, ids.length, 'no two are equal')
})

t.test('the time part is the creation time: IDs of a later millisecond sort after', async (t) => {
  const first = newId('run')
  await new Promise((resolve) => setTimeout(resolve, 5))
  const later = newId('run')
  t.ok(later > first)
  const time = (id: string) => [...id.slice(4, 14)].reduce((n, c) => n * 32 + '0123456789ABCDEFGHJKMNPQRSTVWXYZ'.indexOf(c), 0)
  t.ok(Math.abs(time(later) - Date.now()) < 1000, 'the first ten characters encode the time in ms')
})
