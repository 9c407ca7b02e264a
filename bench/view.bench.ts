/**
 * `rstar view` on a run the size of the main job: 110 steps of 28 problems x 8 rollouts (24,640
 * trajectories of 384 response tokens, in three stages) plus its two evaluations, generated with the
 * real record shapes (test/support/view-run.ts). Prints, as a markdown table: the server's start and
 * index time, the first page load (the overview's charts rendered, in chromium), the trajectories
 * page over every row, and one trajectory (HTTP and in the page).
 *
 *   npm run bench:view                      # figures only
 *   npm run bench:view -- --screenshots docs   # also docs/view-overview.png, view-steps.png, view-trajectory.png
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { browserMissing, launch, startView, watchedPage } from '../test/support/browser.js';
import { writeRun } from '../test/support/view-run.js';

const args = process.argv.slice(2);
const shots = args.includes('--screenshots') ? args[args.indexOf('--screenshots') + 1] : undefined;
const missing = browserMissing();
if (missing) {
  process.stderr.write(`bench view: ${missing}\n`);
  process.exit(1);
}
const ms = (t0: number) => Math.round(performance.now() - t0);
const dir = mkdtempSync(join(tmpdir(), 'rstar-view-bench-'));
const run = join(dir, 'demo');
const total = 110 * 28 * 8;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

try {
  let t0 = performance.now();
  writeRun(run, { steps: 110, problems: 28, n: 8, keep: 4, stageStarts: [45, 89], tokens: 384, xss: false });
  const { execSync } = await import('node:child_process');
  const size = execSync(`du -sm ${run}`, { encoding: 'utf8' }).split('\t')[0];
  process.stderr.write(`bench view: generated ${run} (${size} MB) in ${ms(t0)} ms\n`);

  const rows: [string, string][] = [];
  t0 = performance.now();
  const view = await startView([run]);
  const startup = ms(t0);
  rows.push([
    'server start (`rstar view` until listening: layout, steps, curves, reports read)',
    `${startup} ms`,
  ]);
  const browser = await launch();
  try {
    const { page, errors } = await watchedPage(browser);
    t0 = performance.now();
    await page.goto(view.url);
    await page.waitForSelector('main[data-ready="overview"]', { timeout: 60_000 });
    const load = ms(t0);
    rows.push(['first page load (overview charts rendered)', `${load} ms`]);
    rows.push(['open: start + first page load', `${startup + load} ms`]);
    // the trajectories are indexed in the background, from the moment the server listens
    while (!/indexed in (\d+) ms/.test(view.output())) await new Promise((r) => setTimeout(r, 100));
    const indexed = /(\d+) trajectories, \d+ evaluations, indexed in (\d+) ms/.exec(view.output());
    rows.push([
      `trajectories indexed (${indexed?.[1]}, in the background, after listening)`,
      `${indexed?.[2]} ms`,
    ]);

    const base = view.url;

    const http: number[] = [];
    for (let i = 0; i < 50; i++) {
      const n = Math.floor((i * 7919) % total);
      const t = performance.now();
      const res = await fetch(`${base}api/run/0/trajectory/${n}`);
      await res.json();
      http.push(performance.now() - t);
    }
    rows.push([
      'one trajectory, HTTP (50 fetches: median / max)',
      `${median(http).toFixed(1)} / ${Math.max(...http).toFixed(1)} ms`,
    ]);

    t0 = performance.now();
    await page.goto(`${base}#/trajectories?run=0`);
    await page.waitForSelector('main[data-ready="trajectories"]', { timeout: 60_000 });
    rows.push([`trajectories page (all ${total} rows loaded, first 200 shown)`, `${ms(t0)} ms`]);
    const inPage: number[] = [];
    for (const n of [5, 12_345, total - 3]) {
      t0 = performance.now();
      await page.goto(`${base}#/trajectory?run=0&n=${n}`);
      await page.waitForSelector(`main[data-ready="trajectory"] h1`, { timeout: 60_000 });
      inPage.push(ms(t0));
      await page.goto(`${base}#/steps?run=0`);
      await page.waitForSelector('main[data-ready="steps"]');
    }
    rows.push([
      'one trajectory in the page (3 views: median / max)',
      `${median(inPage)} / ${Math.max(...inPage)} ms`,
    ]);
    if (errors.length > 0) process.stderr.write(`bench view: console errors: ${errors.join('; ')}\n`);

    if (shots) {
      await page.goto(`${base}#/overview`);
      await page.reload();
      await page.waitForSelector('main[data-ready="overview"]');
      await page.screenshot({ path: join(shots, 'view-overview.png'), fullPage: false });
      await page.goto(`${base}#/steps?run=0`);
      await page.waitForSelector('main[data-ready="steps"]');
      await page.screenshot({ path: join(shots, 'view-steps.png') });
      await page.goto(`${base}#/trajectory?run=0&n=12345`);
      await page.waitForSelector('main[data-ready="trajectory"]');
      await page.screenshot({ path: join(shots, 'view-trajectory.png') });
      process.stderr.write(`bench view: screenshots in ${shots}\n`);
    }
  } finally {
    await browser.close();
    await view.stop();
  }
  process.stdout.write(
    `| rstar view, main-job-sized run (${total} trajectories, ${size} MB) | time |\n| --- | --- |\n`,
  );
  for (const [what, value] of rows) process.stdout.write(`| ${what} | ${value} |\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
