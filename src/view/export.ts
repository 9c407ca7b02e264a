import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { evalsPayload, overviewPayload, rowsPayload, runsPayload, trajectoryPayload } from './api.js';
import { PAGE_DIR, PAGE_MODULES, vendorFiles } from './assets.js';
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
 * The page's modules as one classic script: Chrome loads no ES module from file:// (CORS), so the
 * export joins them in dependency order, their import lines dropped and `export` keywords removed.
 * The modules share one scope then; a clash of top-level names fails the export's browser test.
 */
export async function bundle(): Promise<string> {
  const parts: string[] = [];
  for (const name of PAGE_MODULES) {
    const text = await readFile(join(PAGE_DIR, name), 'utf8');
    parts.push(`// ${name}\n${text.replace(/^import [^;]+;\n/gm, '').replace(/^export /gm, '')}`);
  }
  return `(() => {\n${parts.join('\n')}\n})();\n`;
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
  await copyFile(join(PAGE_DIR, 'style.css'), join(dir, 'page', 'style.css'));
  await writeFile(join(dir, 'page', 'bundle.js'), await bundle());
  for (const [name, path] of Object.entries(vendorFiles())) await copyFile(path, join(dir, 'vendor', name));
  const html = await readFile(join(PAGE_DIR, 'index.html'), 'utf8');
  // The static marker script is loaded before the app, so the app knows to read data/ files.
  const page = html
    .replace('<!--static-->', '<script src="data/static.js"></script>')
    .replace('<script type="module" src="page/app.js"></script>', '<script src="page/bundle.js"></script>');
  if (!page.includes('page/bundle.js'))
    throw new Error('export: index.html has no page/app.js script to replace');
  await writeFile(join(dir, 'index.html'), page);
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
