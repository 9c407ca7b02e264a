import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The page's files. tsc copies no non-TS file, so the page is read from the source tree, located
 * from this module (dist/src/view/assets.js -> src/view/page/), as the sandbox finds zygote.py.
 */
export const PAGE_DIR = fileURLToPath(new URL('../../../src/view/page/', import.meta.url));

/** The page's files, served at `/page/NAME` and copied by `--export`. */
export const PAGE_FILES = ['app.js', 'charts.js', 'dom.js', 'highlight.js', 'style.css'] as const;

/** The page's ES modules, each after those it imports (the export joins them in this order). */
export const PAGE_MODULES = ['dom.js', 'highlight.js', 'charts.js', 'app.js'] as const;

const require = createRequire(import.meta.url);

/**
 * The charting library's browser build, from this install's node_modules (never a CDN: the page
 * works offline). Its package exports no path to the build, so it is found beside a file it does
 * export. Only vega: the page's charts are vega specs (page/charts.js), no vega-lite compiler.
 */
export function vendorFiles(): Record<string, string> {
  return {
    'vega.min.js': join(dirname(require.resolve('vega/vega-schema.json')), 'vega.min.js'),
  };
}

export const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
};
