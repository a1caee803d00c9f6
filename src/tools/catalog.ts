import { apiError } from '../http/errors.ts'

/** The tools a session may select. */
export class ToolCatalog {
  readonly defaultNames = ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep']

  /** Checks a session's tool selection; an unknown name is a 400 naming it. */
  async validateSelection(selection: unknown[] | undefined): Promise<unknown[] | null> {
    if (selection === undefined) return null
    const unknown = selection.filter((item) => typeof item === 'string' && !this.defaultNames.includes(item))
    if (unknown.length > 0) {
      throw apiError('VALIDATION_ERROR', `Unknown tools: ${unknown.join(', ')}`, {
        fields: unknown.map((name) => ({ field: 'body.tools', message: `unknown tool ${String(name)}`, keyword: 'tool' }))
      })
    }
    return selection
  }
}
