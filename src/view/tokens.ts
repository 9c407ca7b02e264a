import type { TokenText } from './api.js';

/**
 * Per-token text for the log-prob shading: each response token decoded alone with the run's own
 * tokenizer (found in the run folder or given by --tokenizer). Loaded on first use, once per run;
 * a run without a tokenizer simply has no shading.
 */
export class TokenTexts {
  #loaded = new Map<number, Promise<((ids: number[]) => string[]) | undefined>>();

  constructor(
    private readonly dirs: readonly (string | undefined)[],
    private readonly log: (line: string) => void = () => {},
  ) {}

  forRun(run: number): TokenText | undefined {
    const dir = this.dirs[run];
    if (dir === undefined) return undefined;
    let loading = this.#loaded.get(run);
    if (!loading) {
      loading = import('../rollout/tokenizer.js')
        .then(({ loadTokenizer }) => loadTokenizer(dir))
        .then((tk) => (ids: number[]) => ids.map((id) => tk.decode([id])))
        .catch((error: Error) => {
          this.log(`view: tokenizer ${dir}: ${error.message} (no log-prob shading)`);
          return undefined;
        });
      this.#loaded.set(run, loading);
    }
    return async (ids) => (await loading)?.(ids);
  }
}
