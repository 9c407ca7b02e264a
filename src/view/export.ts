import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { evalsPayload, overviewPayload, rowsPayload, runsPayload, trajectoryPayload } from './api.js';
import { PAGE_DIR, PAGE_FILES, vendorFiles } from './assets.js';
import type { RunIndex } from './run-index.js';

/** Trajectories per data file of an export: a page opens one file, ~100 trajectories, per trajectory viewed. */
export const EXPORT_CHUNK = 100;

/**
 * The file of an API path in an export. A page opened from disk cannot fetch() files, so each
 * payload is a script that hands its JSON to the page (`rstarData(key, json)`); page/app.js maps
 * paths to files the same way.
 */
export function dataFile(key: string): string {
  return `${key.replace(/[^A-Za-z0-9]+/g, '_')}.js`;
}

async function put(dir: string, key: string, body: unknown): Promise<void> {
  await writeFile(
    join(dir, 'data', dataFile(key)),
    `rstarData(${JSON.stringify(key)}, ${JSON.stringify(body)});\n`,
  );
}

/**
 * Writes a static copy of the runs into `dir`: the page, the charting libraries and every payload
 * the server would answer (trajectories without the per-token shading, which needs the tokenizer).
 * Returns the number of trajectories written.
 */
export async function exportRuns(runs: readonly RunIndex[], dir: string): Promise<number> {
  await mkdir(join(dir, 'page'), { recursive: true });
  await mkdir(join(dir, 'vendor'), { recursive: true });
  await mkdir(join(dir, 'data'), { recursive: true });
  for (const name of PAGE_FILES) await copyFile(join(PAGE_DIR, name), join(dir, 'page', name));
  for (const [name, path] of Object.entries(vendorFiles())) await copyFile(path, join(dir, 'vendor', name));
  const html = await readFile(join(PAGE_DIR, 'index.html'), 'utf8');
  // The static marker script is loaded before the app, so the app knows to read data/ files.
  await writeFile(
    join(dir, 'index.html'),
    html.replace('<!--static-->', '<script src="data/static.js"></script>'),
  );
  await writeFile(join(dir, 'data', 'static.js'), 'window.RSTAR_STATIC = true;\n');
  await put(dir, 'runs', runsPayload(runs));
  let written = 0;
  for (let i = 0; i < runs.length; i++) {
    const ix = runs[i];
    await put(dir, `run/${i}/overview`, overviewPayload(ix));
    await put(dir, `run/${i}/rows`, rowsPayload(ix));
    await put(dir, `run/${i}/evals`, await evalsPayload(ix));
    for (let start = 0; start < ix.rows.length; start += EXPORT_CHUNK) {
      const chunk: Record<number, unknown> = {};
      for (let n = start; n < Math.min(start + EXPORT_CHUNK, ix.rows.length); n++) {
        chunk[n] = await trajectoryPayload(ix, n);
        written += 1;
      }
      await put(dir, `run/${i}/trajectories/${start / EXPORT_CHUNK}`, chunk);
    }
  }
  return written;
}
