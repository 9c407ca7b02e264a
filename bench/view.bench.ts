/**
 * `rstar view` on a run the size of the main job: 110 steps of 28 problems x 8 rollouts (24,640
 * trajectories of 384 response tokens, in three stages) plus its two evaluations, generated with the
 * real record shapes (test/support/view-run.ts). Opens it twice, in chromium: first without the
 * index cache (the trajectories are indexed after listening), then again (they come from the cache
 * the first open wrote). Prints, as a markdown table with the 1-minute load average at each figure:
 * the server's start, the first page load (the overview's charts in the window drawn), all charts
 * drawn, the trajectories indexed, the server's CPU time, the trajectories page over every row, and
 * one trajectory (HTTP and in the page).
 *
 *   npm run bench:view                      # figures only
 *   npm run bench:view -- --screenshots docs   # also docs/view-overview.png, view-steps.png, view-trajectory.png
 *   npm run bench:view -- --run runs/demo      # a real run folder instead of the generated one
 */
import { execSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
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
const load = () => loadavg()[0].toFixed(1);
const dir = mkdtempSync(join(tmpdir(), 'rstar-view-bench-'));
const given = args.includes('--run') ? args[args.indexOf('--run') + 1] : undefined;
const run = given ?? join(dir, 'demo');
/** Trajectories in the run: the generated run's, else what the first open indexed. */
let total = 110 * 28 * 8;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** CPU seconds (user + system) a process has used so far, from /proc. */
function cpu(pid: number | undefined): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** [figure, value, load average when measured] */
const rows: [string, string, string][] = [];
const row = (what: string, value: string) => rows.push([what, value, load()]);

type View = Awaited<ReturnType<typeof startView>>;

/** Starts `rstar view`, opens its overview in `page`; returns the view once its trajectories are indexed. */
async function open(page: Page, label: string): Promise<View> {
  let t0 = performance.now();
  const view = await startView([run, '--index-cache', join(dir, 'caches')]);
  const start = ms(t0);
  const cpuStart = cpu(view.pid);
  row(`${label}: server start (\`rstar view\` until listening)`, `${start} ms`);
  t0 = performance.now();
  await page.goto(view.url);
  await page.waitForSelector('main[data-ready="overview"]', { timeout: 60_000 });
  const first = ms(t0);
  row(`${label}: first page load (the overview's charts in the window drawn)`, `${first} ms`);
  row(`${label}: **open: start + first page load**`, `**${start + first} ms**`);
  await page.waitForSelector('.charts[data-drawn="all"]', { timeout: 60_000 });
  row(`${label}: every chart drawn (from the page's request)`, `${ms(t0)} ms`);
  await page.waitForSelector('.chart[data-chart="length"][data-points]', { timeout: 60_000 });
  row(`${label}: the trajectories' curves drawn (from the page's request)`, `${ms(t0)} ms`);
  const line = /(\d+) trajectories(?: \((\d+) from the index cache\))?, \d+ evaluations, indexed in (\d+) ms/;
  while (!line.test(view.output())) await new Promise((r) => setTimeout(r, 100));
  const m = line.exec(view.output());
  total = Number(m?.[1]);
  row(
    `${label}: trajectories indexed (${m?.[1]}, ${m?.[2] ?? 0} from the cache; after listening)`,
    `${m?.[3]} ms`,
  );
  row(
    `${label}: server CPU time: start / start + indexing`,
    `${cpuStart.toFixed(2)} / ${cpu(view.pid).toFixed(2)} s`,
  );
  return view;
}

try {
  let t0 = performance.now();
  if (!given)
    writeRun(run, {
      steps: 110,
      problems: 28,
      n: 8,
      keep: 4,
      stageStarts: [45, 89],
      tokens: 384,
      xss: false,
    });
  const size = execSync(`du -sm ${run}`, { encoding: 'utf8' }).split('\t')[0];
  process.stderr.write(
    `bench view: ${given ? 'opening' : 'generated'} ${run} (${size} MB) in ${ms(t0)} ms\n`,
  );

  const browser = await launch();
  let view: View | undefined;
  try {
    const { page, errors } = await watchedPage(browser);
    view = await open(page, 'first open');
    await view.stop();
    await page.goto('about:blank');
    view = await open(page, 'reopen (index cache)');
    const base = view.url;

    const http: number[] = [];
    for (let i = 0; i < 50; i++) {
      const n = Math.floor((i * 7919) % total);
      const t = performance.now();
      const res = await fetch(`${base}api/run/0/trajectory/${n}`);
      await res.json();
      http.push(performance.now() - t);
    }
    row(
      'one trajectory, HTTP (50 fetches: median / max)',
      `${median(http).toFixed(1)} / ${Math.max(...http).toFixed(1)} ms`,
    );

    t0 = performance.now();
    await page.goto(`${base}#/trajectories?run=0`);
    await page.waitForSelector('main[data-ready="trajectories"]', { timeout: 60_000 });
    row(`trajectories page (all ${total} rows loaded, first 200 shown)`, `${ms(t0)} ms`);
    const inPage: number[] = [];
    for (const n of [5, Math.floor(total / 2), total - 3]) {
      t0 = performance.now();
      await page.goto(`${base}#/trajectory?run=0&n=${n}`);
      await page.waitForSelector(`main[data-ready="trajectory"] h1`, { timeout: 60_000 });
      inPage.push(ms(t0));
      await page.goto(`${base}#/steps?run=0`);
      await page.waitForSelector('main[data-ready="steps"]');
    }
    row(
      'one trajectory in the page (3 views: median / max)',
      `${median(inPage)} / ${Math.max(...inPage)} ms`,
    );
    if (errors.length > 0) process.stderr.write(`bench view: console errors: ${errors.join('; ')}\n`);

    if (shots) {
      await page.goto(`${base}#/overview`);
      await page.reload();
      await page.waitForSelector('main[data-ready="overview"]');
      await page.screenshot({ path: join(shots, 'view-overview.png'), fullPage: false });
      await page.goto(`${base}#/steps?run=0`);
      await page.waitForSelector('main[data-ready="steps"]');
      await page.screenshot({ path: join(shots, 'view-steps.png') });
      await page.goto(`${base}#/trajectory?run=0&n=${Math.floor(total / 2)}`);
      await page.waitForSelector('main[data-ready="trajectory"]');
      await page.screenshot({ path: join(shots, 'view-trajectory.png') });
      process.stderr.write(`bench view: screenshots in ${shots}\n`);
    }
  } finally {
    await browser.close();
    await view?.stop();
  }
  process.stdout.write(
    `| rstar view, main-job-sized run (${total} trajectories, ${size} MB) | time | load avg (1 min) |\n| --- | --- | --- |\n`,
  );
  for (const [what, value, at] of rows) process.stdout.write(`| ${what} | ${value} | ${at} |\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
