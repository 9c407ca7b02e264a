/**
 * src/rollout has no import circle: its modules read their defaults from the defaults leaf, not
 * from the flags module (which imports their types). Type imports count: a type-only circle is
 * still a tangle, and a value import added later would make it a load-order bug.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../../../src/', import.meta.url));

/** Each module of `dir` (by file name) -> the modules of `dir` it imports or re-exports. */
export function importGraph(dir: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
    const text = readFileSync(join(dir, file), 'utf8');
    const targets = [...text.matchAll(/^(?:import|export)\b[^;]*?\bfrom\s+'\.\/([\w-]+)\.js'/gms)].map(
      (m) => `${m[1]}.ts`,
    );
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/** The first import circle found, as the path that closes it (`a.ts -> b.ts -> a.ts`); none: undefined. */
export function findCycle(graph: Map<string, string[]>): string[] | undefined {
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'done') return undefined;
    if (state.get(node) === 'open') return [...path.slice(path.indexOf(node)), node];
    state.set(node, 'open');
    path.push(node);
    for (const next of graph.get(node) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    path.pop();
    state.set(node, 'done');
    return undefined;
  };
  for (const node of [...graph.keys()].sort()) {
    const cycle = visit(node);
    if (cycle) return cycle;
  }
  return undefined;
}

describe('import graph', () => {
  it('finds a circle when there is one (the checker itself)', () => {
    const graph = new Map([
      ['a.ts', ['b.ts']],
      ['b.ts', ['c.ts']],
      ['c.ts', ['a.ts']],
      ['d.ts', ['a.ts']],
    ]);
    assert.deepEqual(findCycle(graph), ['a.ts', 'b.ts', 'c.ts', 'a.ts']);
    assert.equal(findCycle(new Map([['a.ts', ['b.ts']]])), undefined);
  });

  it('src/rollout has no import circle, and the defaults leaf imports nothing from it', () => {
    const graph = importGraph(join(SRC, 'rollout'));
    assert.ok((graph.get('engines.ts') ?? []).includes('defaults.ts'), 'the graph reads imports');
    assert.deepEqual(graph.get('defaults.ts'), []);
    const cycle = findCycle(graph);
    assert.equal(cycle, undefined, `import circle: ${cycle?.join(' -> ')}`);
  });
});
