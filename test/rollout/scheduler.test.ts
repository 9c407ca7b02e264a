import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { AsyncScheduler, Scheduler, type TurnRequest } from '../../src/rollout/scheduler.js';
import { lengthsByProblem, priorFor } from '../../src/rollout/scheduler-prior.js';

const turn = (key: string, contextLen: number, maxNewTokens: number, group = 0): TurnRequest => ({
  key,
  group,
  contextLen,
  maxNewTokens,
});

describe('KV-cache-aware scheduler', () => {
  it('sends each turn to the engine with the most free KV and reserves context + max_new_tokens', () => {
    const s = new Scheduler([1000, 3000], { clock: () => 0 });
    s.submit(turn('a', 100, 400));
    s.submit(turn('b', 100, 400));
    s.submit(turn('c', 100, 400));
    s.submit(turn('d', 100, 400));
    s.submit(turn('e', 100, 400));
    const got = s.poll().map((a) => [a.request.key, a.engine, a.reserved]);
    // Engine 1 takes turns until it has no more free than engine 0; a tie goes to fewer in flight.
    assert.deepEqual(got, [
      ['a', 1, 500],
      ['b', 1, 500],
      ['c', 1, 500],
      ['d', 1, 500],
      ['e', 0, 500],
    ]);
    assert.deepEqual(
      s.stats().map((x) => x.free),
      [500, 1000],
    );
  });

  it('holds turns that fit nowhere and releases them when capacity returns', () => {
    const s = new Scheduler([1000], { clock: () => 0 });
    s.submit(turn('a', 200, 600));
    s.submit(turn('b', 200, 600));
    const [a] = s.poll();
    assert.equal(a.request.key, 'a');
    assert.equal(s.poll().length, 0, 'b waits: 200 free < 800');
    assert.equal(s.queued, 1);
    s.release(a);
    assert.deepEqual(
      s.poll().map((x) => x.request.key),
      ['b'],
    );
  });

  it('lets an idle engine take a turn larger than its capacity', () => {
    const s = new Scheduler([100], { clock: () => 0 });
    s.submit(turn('big', 500, 500));
    const [a] = s.poll();
    assert.equal(a.engine, 0);
    assert.equal(s.stats()[0].overcommits, 1);
  });

  it('counts free capacity from the last scrape minus reservations since, capped by all reservations', () => {
    const s = new Scheduler([10_000], { clock: () => 0 });
    s.submit(turn('a', 1000, 3000));
    const [a] = s.poll();
    assert.equal(s.free(0), 6000);
    // The engine reports what the turn holds now (1200) plus 500 of someone else's: the scrape
    // alone would say 8300 free, but a may still grow to its 4000-token reservation.
    s.observe(0, { total: 10_000, used: 1700 });
    assert.equal(s.free(0), 6000);
    s.submit(turn('b', 1000, 1000));
    const [b] = s.poll();
    assert.equal(s.free(0), 4000);
    s.release(a);
    assert.equal(
      s.free(0),
      6300,
      'a was counted by the scrape: its release frees nothing until the next one',
    );
    s.release(b);
    assert.equal(s.free(0), 8300);
    // KV used by others shows up through the scrape.
    s.observe(0, { total: 10_000, used: 9000 });
    assert.equal(s.free(0), 1000);
    // A scrape started before a dispatch does not count it: the reservation stays.
    const seq = s.sequence;
    s.submit(turn('c', 500, 400));
    assert.equal(s.poll().length, 1);
    s.observe(0, { total: 10_000, used: 0 }, seq);
    assert.equal(s.free(0), 9100);
  });

  it("prefers the engine holding a trajectory's prefix, unless it is short, and waits a while for it", () => {
    let now = 0;
    const s = new Scheduler([2000, 2500], { clock: () => now, prefixWaitMs: 1000 });
    s.submit(turn('t', 100, 500));
    const [a] = s.poll();
    assert.equal(a.engine, 1);
    s.release(a);
    s.submit(turn('other', 100, 900));
    assert.equal(s.poll()[0].engine, 1);
    // free 2000 / 1500: t's engine has less free than the best but room enough, so t stays.
    s.submit(turn('t', 700, 400));
    const [b] = s.poll();
    assert.equal(b.engine, 1);
    s.release(b);
    // Now t needs 1700 and its engine has 1500: t waits for it while other turns pass.
    s.submit(turn('t', 1300, 400));
    s.submit(turn('new', 100, 100));
    assert.deepEqual(
      s.poll().map((x) => [x.request.key, x.engine]),
      [['new', 0]],
    );
    now = 1500;
    assert.deepEqual(
      s.poll().map((x) => [x.request.key, x.engine]),
      [['t', 0]],
      'after prefixWaitMs it moves',
    );
  });

  it('serves trajectories in the order they started', () => {
    const s = new Scheduler([1000], { clock: () => 0 });
    s.submit(turn('first', 100, 800));
    const [a] = s.poll();
    s.submit(turn('second', 100, 800));
    s.submit(turn('third', 100, 800));
    assert.equal(s.poll().length, 0);
    s.release(a);
    s.submit(turn('first', 300, 600)); // back from its tool call
    assert.deepEqual(
      s.poll().map((x) => x.request.key),
      ['first'],
    );
  });

  it('returns a failed turn to the front of the queue and skips dead engines', () => {
    const s = new Scheduler([1000, 1000], { clock: () => 0 });
    s.submit(turn('a', 100, 100));
    const [a] = s.poll();
    s.setAlive(a.engine, false);
    s.fail(a);
    assert.equal(s.inflight, 0);
    const [again] = s.poll();
    assert.equal(again.request.key, 'a');
    assert.notEqual(again.engine, a.engine);
    s.setAlive(again.engine, false);
    s.submit(turn('b', 1, 1));
    assert.equal(s.poll().length, 0, 'no engine alive');
  });

  it('implements the baselines: round-robin, least-requests and static', () => {
    const rr = new Scheduler([1, 1, 1], { policy: 'round-robin', clock: () => 0 });
    for (const k of ['a', 'b', 'c', 'd']) rr.submit(turn(k, 10, 10));
    assert.deepEqual(
      rr.poll().map((x) => x.engine),
      [0, 1, 2, 0],
    );
    const lr = new Scheduler([1, 1], { policy: 'least-requests', clock: () => 0 });
    for (const k of ['a', 'b', 'c']) lr.submit(turn(k, 10, 10));
    const [x, , z] = lr.poll();
    lr.release(x);
    lr.release(z);
    lr.submit(turn('d', 10, 10));
    lr.submit(turn('e', 10, 10));
    assert.deepEqual(
      lr.poll().map((y) => y.engine),
      [0, 0],
    );
    const st = new Scheduler([1, 1, 1], { policy: 'static', clock: () => 0 });
    for (const g of [0, 1, 2, 3, 4, 5]) st.submit(turn(`p${g}`, 10, 10, g));
    assert.deepEqual(
      st.poll().map((y) => y.engine),
      [0, 1, 2, 0, 1, 2],
    );
  });

  it('resolves acquire() when a turn is dispatched', async () => {
    const s = new AsyncScheduler(new Scheduler([1000], { clock: () => 0 }));
    const a = await s.acquire(turn('a', 100, 800));
    let got = false;
    const pending = s.acquire(turn('b', 100, 800)).then((b) => {
      got = true;
      return b;
    });
    await new Promise((r) => setImmediate(r));
    assert.equal(got, false);
    s.release(a);
    const b = await pending;
    assert.equal(b.request.key, 'b');
  });

  it('starts one sample of every problem first, then the problems whose turns run longest', () => {
    let now = 0;
    // One engine that holds three turns of 100 + 200 at a time; one probing round.
    const s = new Scheduler([900], { clock: () => now, probes: 1 });
    for (const g of [0, 1, 2]) for (const k of [0, 1, 2]) s.submit(turn(`p${g}/${k}`, 100, 200, g));
    const first = s.poll();
    assert.deepEqual(
      first.map((a) => a.request.key),
      ['p0/0', 'p1/0', 'p2/0'],
      'a probe of each problem before a second sample of any',
    );
    // Problem 2's turn is quick, problem 0's takes 10 s, problem 1's is still running at 30 s.
    now = 1000;
    s.release(first[2]);
    s.forget('p2/0');
    now = 10_000;
    s.release(first[0]);
    s.forget('p0/0');
    now = 30_000;
    assert.deepEqual(
      s.poll().map((a) => a.request.key),
      ['p1/1', 'p1/2'],
      'problem 1 (oldest running turn, 30 s) goes before problem 0 (10 s) and 2 (1 s)',
    );
    assert.equal(s.queued, 4);
  });

  it('probes every problem round by round (default 3) before starting whole problems', () => {
    let now = 0;
    const s = new Scheduler([100_000], { clock: () => now });
    for (const g of [0, 1]) for (let k = 0; k < 5; k++) s.submit(turn(`p${g}/${k}`, 100, 200, g));
    const first = s.poll();
    assert.deepEqual(
      first.map((a) => a.request.key),
      ['p0/0', 'p1/0', 'p0/1', 'p1/1', 'p0/2', 'p1/2', 'p0/3', 'p0/4', 'p1/3', 'p1/4'],
      'three samples of each problem, then whole problems (tied estimates: submission order)',
    );
    // A prior ranks problems without probing: problem 1 first, all its samples at once.
    now = 0;
    const p = new Scheduler([100_000], { clock: () => now, prior: (g) => [1, 5][g] });
    for (const g of [0, 1]) for (let k = 0; k < 3; k++) p.submit(turn(`p${g}/${k}`, 100, 200, g));
    assert.deepEqual(
      p.poll().map((a) => a.request.key),
      ['p1/0', 'p1/1', 'p1/2', 'p0/0', 'p0/1', 'p0/2'],
    );
  });

  it('builds a length prior from earlier trajectories; unseen problems rank as the longest', () => {
    const lengths = lengthsByProblem([
      { problem_id: 'a', response_ids: [1, 2] },
      { problem_id: 'a', response_ids: [1, 2, 3, 4] },
      { problem_id: 'b', response_ids: [1, 2, 3, 4, 5, 6, 7, 8] },
    ]);
    assert.deepEqual(
      [...lengths],
      [
        ['a', 3],
        ['b', 8],
      ],
    );
    const prior = priorFor(['b', 'new', 'a'], lengths);
    assert.deepEqual(
      [0, 1, 2].map((g) => prior?.(g)),
      [8, 8, 3],
    );
    assert.equal(priorFor(['x'], lengths), undefined);
  });

  it('keeps submission order with order: fifo and for the baselines', () => {
    for (const opts of [{ order: 'fifo' as const }, { policy: 'least-requests' as const }]) {
      const s = new Scheduler([10_000], { clock: () => 0, ...opts });
      for (const g of [0, 1]) for (const k of [0, 1]) s.submit(turn(`p${g}/${k}`, 100, 200, g));
      assert.deepEqual(
        s.poll().map((a) => a.request.key),
        ['p0/0', 'p0/1', 'p1/0', 'p1/1'],
      );
    }
  });

  it('never reserves more than an engine holds, and releases every token it reserved', () => {
    // A seeded random mix of submits, releases, failures and scrapes on three engines.
    let seed = 7;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    let now = 0;
    const totals = [20_000, 50_000, 8_000];
    const s = new Scheduler(totals, { clock: () => now, prefixWaitMs: 500 });
    const running: ReturnType<typeof s.poll> = [];
    const context = new Map<string, number>();
    let next = 0;
    let done = 0;
    for (let step = 0; step < 3000; step++) {
      now += 10;
      const u = rand();
      if (u < 0.3 && next < 400) {
        const key = `t${next++}`;
        context.set(key, 100 + Math.floor(rand() * 900));
        s.submit(turn(key, context.get(key) as number, 1000 + Math.floor(rand() * 5000), next % 13));
      } else if (u < 0.75 && running.length > 0) {
        const [a] = running.splice(Math.floor(rand() * running.length), 1);
        if (rand() < 0.05) {
          s.fail(a);
          continue;
        }
        s.release(a);
        const grown = a.request.contextLen + Math.floor(rand() * a.request.maxNewTokens);
        if (rand() < 0.5 && grown < 7000) {
          context.set(a.request.key, grown);
          s.submit(turn(a.request.key, grown, 7000 - grown, a.request.group));
        } else {
          s.forget(a.request.key);
          done++;
        }
      } else {
        // A scrape that sees part of what the running turns hold.
        const e = Math.floor(rand() * totals.length);
        const held = running.filter((a) => a.engine === e).reduce((x, a) => x + a.request.contextLen, 0);
        s.observe(e, { total: totals[e], used: held });
      }
      for (const a of s.poll()) running.push(a);
      for (const [e, st] of s.stats().entries()) {
        const mine = running.filter((a) => a.engine === e).reduce((x, a) => x + a.reserved, 0);
        assert.equal(st.reserved, mine, `engine ${e}: reservations add up`);
        assert.ok(st.reserved <= totals[e], `engine ${e}: ${st.reserved} reserved > ${totals[e]}`);
        // Beyond capacity − our reservations only as an idle engine's single turn (a stale scrape).
        assert.ok(st.free >= 0 || st.inflight === 1, `engine ${e}: free ${st.free}`);
      }
    }
    assert.ok(done > 100, `only ${done} trajectories finished`);
    for (const a of running.splice(0)) s.release(a);
    for (const st of s.stats()) {
      assert.equal(st.reserved, 0);
      assert.equal(st.inflight, 0);
    }
  });
  it('keeps at most maxActive trajectories under way and starts the next in its start order', () => {
    // Four problems of two samples, submitted in order; a prior ranks problem 3, then 1, longest.
    const rank = [1, 5, 2, 9];
    for (const policy of ['kv', 'round-robin'] as const) {
      const s = new Scheduler([100_000], { clock: () => 0, policy, maxActive: 2, prior: (g) => rank[g] });
      for (let g = 0; g < 4; g++) for (let k = 0; k < 2; k++) s.submit(turn(`p${g}/${k}`, 100, 100, g));
      const first = s.poll().map((a) => a.request.key);
      assert.deepEqual(first, policy === 'kv' ? ['p3/0', 'p3/1'] : ['p0/0', 'p0/1']);
      assert.equal(s.active, 2);
      assert.deepEqual(s.poll(), [], `${policy}: no third trajectory while two are under way`);
      // A later turn of a trajectory under way is not held back by the cap.
      s.submit(turn(first[0], 300, 100, Number(first[0][1])));
      assert.deepEqual(
        s.poll().map((a) => a.request.key),
        [first[0]],
      );
      s.forget(first[1]);
      assert.deepEqual(
        s.poll().map((a) => a.request.key),
        ['p1/0'],
      );
      assert.equal(s.active, 2);
    }
  });
});
