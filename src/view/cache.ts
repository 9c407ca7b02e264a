import { createHash } from 'node:crypto';
import { readdir, stat, unlink } from 'node:fs/promises';
import { homedir } from 'node:os';
import { basename, join } from 'node:path';

/**
 * Where `rstar view` keeps its index caches (run-index.ts): one file per run folder in the user's
 * cache directory, never in the run folder (the viewer does not write runs: they may be shared,
 * synced or read-only, and a training job is writing them).
 */
export function defaultCacheDir(): string {
  return join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'rstar', 'view');
}

/** The cache file of the run folder `root` (absolute): its name, and a hash of its whole path. */
export function cacheFile(dir: string, root: string): string {
  const hash = createHash('sha256').update(root).digest('hex').slice(0, 16);
  return join(dir, `${basename(root).replace(/[^\w.-]+/g, '_')}-${hash}.json`);
}

/** A cache not written or read for this long is deleted (its run was likely deleted or moved). */
export const CACHE_MAX_AGE_MS = 30 * 24 * 3600 * 1000;

/** Deletes the caches in `dir` last used before CACHE_MAX_AGE_MS; returns how many. */
export async function pruneCaches(dir: string, now = Date.now()): Promise<number> {
  let pruned = 0;
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    if (!name.endsWith('.json') && !name.endsWith('.tmp')) continue;
    const path = join(dir, name);
    const info = await stat(path).catch(() => undefined);
    if (
      info &&
      now - info.mtimeMs > CACHE_MAX_AGE_MS &&
      (await unlink(path).then(
        () => true,
        () => false,
      ))
    )
      pruned += 1;
  }
  return pruned;
}
