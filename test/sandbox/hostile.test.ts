// Catches: sandbox escapes and missing limits (fork/thread bombs, memory, files, signals, the network, secrets) that a test guard would otherwise mask.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { type GuardedServer, startGuardedServer } from '../support/guard.js';

type Result = {
  success: boolean;
  run_success: boolean;
  cost: number;
  reason: string;
  stdout: string;
  stderr: string;
};

const SECRET = `s3cret-${process.pid}`;

/** A file of the guard's pids cgroup (the server's own v1 pids group), or undefined without one. */
function guardPidsFile(server: GuardedServer, file: string): string | undefined {
  const line = readFileSync(`/proc/${server.pid}/cgroup`, 'utf8')
    .split('\n')
    .find((l) => l.split(':')[1]?.split(',').includes('pids'));
  const path = `/sys/fs/cgroup/pids${line?.split(':')[2] ?? ''}/${file}`;
  return line && existsSync(path) ? path : undefined;
}

/** Forks refused by a pids cgroup's limit so far (`max` in pids.events). */
const forkRefusals = (events: string): number =>
  Number(/^max (\d+)/m.exec(readFileSync(events, 'utf8'))?.[1] ?? 0);

/**
 * Hostile programs against one guarded service (its own cgroup caps pids and memory, so a
 * sandbox bug cannot take the host down). Every case asserts its own result and then that the
 * service still answers a normal call correctly and holds no leftover processes.
 */
describe('hostile code', () => {
  let server: GuardedServer;
  let port = 0;
  let baseline = 0;

  const run = async (solution: string, input = ''): Promise<Result> => {
    const response = await fetch(`${server.url}/run`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ type: 'python', solution, input }),
    });
    assert.equal(response.status, 200);
    return (await response.json()) as Result;
  };

  const unharmed = async () => {
    const r = await run('import math\nprint(math.factorial(5))');
    assert.equal(r.stdout, '120\n', JSON.stringify(r));
    // Every process a call made is gone: only the server, bubblewrap, the executors and the
    // child each executor has already forked for its next call remain. That child is forked
    // right after the answer is sent, so the count may be one short for a moment.
    let count = server.pids().length;
    for (let i = 0; i < 40 && count !== baseline; i += 1) {
      await new Promise((r) => setTimeout(r, 50));
      count = server.pids().length;
    }
    assert.equal(count, baseline, 'no process of a call survives it');
  };

  before(async () => {
    server = await startGuardedServer(['--workers', '2', '--tool-timeout', '3', '--memory', '256'], {
      maxPids: 600,
      memoryBytes: 4 * 1024 ** 3,
      env: { RSTAR_TEST_SECRET: SECRET },
    });
    port = Number(new URL(server.url).port);
    const health = (await (await fetch(`${server.url}/health`)).json()) as { isolation: string };
    assert.equal(
      health.isolation,
      'namespaces',
      'these tests need the namespace sandbox (root + bubblewrap)',
    );
    await run('print(0)');
    baseline = await server.steadyCount();
  });
  after(async () => {
    assert.deepEqual(await server.stop(), []);
  });

  test('runs as PID 1 of its own PID namespace, unprivileged', async () => {
    const r = await run(
      'import os\nprint(os.getpid(), os.getuid() != 0, sorted(p for p in os.listdir("/proc") if p.isdigit()))',
    );
    assert.equal(r.stdout, "1 True ['1']\n");
    await unharmed();
  });

  test("fork bomb: stopped by the sandbox's own process limit, far below the guard's", async () => {
    // Every process forks until a fork is refused; then it holds its slot (sleeps), except the call's PID 1,
    // which counts the processes of its namespace and fails. (Children that retried instead would keep the
    // CPUs busy and PID 1 could miss the deadline on a loaded machine.) A timeout or the guard's pids.max (600) would also fail the call, so the
    // test asserts what only the sandbox's limit (RLIMIT_NPROC 64, worker pids.max 80) gives: a quick end
    // on EAGAIN, at most ~80 processes, and no fork refused by the guard.
    const guardEvents = guardPidsFile(server, 'pids.events');
    const refusedBefore = guardEvents ? forkRefusals(guardEvents) : 0;
    const r = await run(
      'import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        if os.getpid() != 1:\n            time.sleep(60)\n        print(len([p for p in os.listdir("/proc") if p.isdigit()]), flush=True)\n        raise',
    );
    assert.equal(r.reason, '', JSON.stringify(r)); // a failed program, not worker_timeout or memory_limit
    assert.equal(r.run_success, false);
    assert.match(r.stderr, /BlockingIOError|Resource temporarily unavailable/);
    assert.ok(r.cost < 2.5, `ended after ${r.cost} s (timeout 3 s): the limit, not the clock, stopped it`);
    const peak = Number(r.stdout.trim());
    assert.ok(peak > 8 && peak <= 80, `processes at the refused fork: ${JSON.stringify(r.stdout)}`);
    if (guardEvents)
      assert.equal(forkRefusals(guardEvents), refusedBefore, "the guard's pids.max refused no fork");
    await unharmed();
  });

  test('thread bomb', async () => {
    const r = await run(
      'import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()',
    );
    assert.equal(r.run_success, false);
    assert.match(r.stderr, /can't start new thread|RuntimeError|MemoryError/);
    await unharmed();
  });

  test('memory creep', async () => {
    const r = await run('chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))');
    assert.equal(r.reason, 'memory_limit', JSON.stringify(r));
    await unharmed();
  });

  test('disk fill stops at the scratch quota', async () => {
    const r = await run('with open("big", "wb") as f:\n    while True:\n        f.write(b"x" * 2 ** 20)');
    assert.equal(r.run_success, false);
    assert.match(r.stderr, /No space left|File too large|OSError/);
    await unharmed();
  });

  test('a million files stop at the inode quota', async () => {
    const r = await run('import os\nfor i in range(10 ** 6):\n    open(f"f{i}", "w").close()');
    assert.equal(r.run_success, false);
    assert.match(r.stderr, /No space left|OSError/);
    assert.ok(r.cost < 3);
    await unharmed();
  });

  test('scratch starts empty every call (no state leaks)', async () => {
    await run('open("leak.txt", "w").write("x")\nimport sys\nsys.modules["math"].leak = 1');
    const r = await run('import os, math\nprint(os.listdir("."), hasattr(math, "leak"))');
    assert.equal(r.stdout, '[] False\n');
    await unharmed();
  });

  test('segfault via ctypes', async () => {
    const r = await run('import ctypes\nctypes.string_at(0)');
    assert.equal(r.run_success, false);
    assert.equal(r.reason, '');
    await unharmed();
  });

  test('deep recursion', async () => {
    const r = await run('import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1)\nf(0)');
    assert.equal(r.run_success, false);
    await unharmed();
  });

  test('huge output is cut and the call stopped', async () => {
    const r = await run('import sys\nwhile True:\n    sys.stdout.write("y" * 65536)');
    assert.equal(r.reason, 'output_limit');
    assert.equal(r.stdout.length, 1000);
    assert.ok(r.cost < 3);
    await unharmed();
  });

  test('binary and invalid UTF-8 output', async () => {
    const r = await run('import os\nos.write(1, bytes(range(256)) * 10)\nos.write(2, b"\\xc3\\x28\\x00")');
    assert.equal(r.run_success, true);
    assert.ok(r.stdout.includes('\ufffd'));
    await unharmed();
  });

  test('the server environment and /proc stay invisible', async () => {
    const r = await run(
      'import os, glob\nseen = ""\nfor p in glob.glob("/proc/*/environ"):\n    try:\n        seen += open(p, "rb").read().decode("latin1")\n    except OSError:\n        pass\nprint("RSTAR_TEST_SECRET" in seen or "RSTAR_TEST_SECRET" in os.environ, os.path.exists("/work"), os.path.exists("/proc/2"))',
    );
    assert.equal(r.stdout, 'False False False\n', JSON.stringify(r));
    assert.ok(!JSON.stringify(r).includes(SECRET));
    await unharmed();
  });

  test('writing outside the scratch directory fails', async () => {
    const r = await run(
      'import os\nbad = 0\nfor path in ["/etc/rstar-x", "/usr/rstar-x", "/rstar-x", os.path.expanduser("~") + "/../rstar-x", "/dev/shm/../rstar-x"]:\n    try:\n        open(path, "w").write("x")\n        bad += 1\n    except OSError:\n        pass\nopen("ok.txt", "w").write("fine")\nprint(bad, os.getcwd())',
    );
    assert.equal(r.stdout, '0 /tmp\n', JSON.stringify(r));
    await unharmed();
  });

  test("no network: the server's own port is unreachable", async () => {
    const r = await run(
      `import socket\ntry:\n    socket.create_connection(("127.0.0.1", ${port}), timeout=1)\n    print("connected")\nexcept OSError as e:\n    print("blocked")\ntry:\n    socket.create_connection(("1.1.1.1", 80), timeout=1)\n    print("connected")\nexcept OSError:\n    print("blocked")`,
    );
    assert.equal(r.stdout, 'blocked\nblocked\n');
    await unharmed();
  });

  test('limits cannot be lifted (signal.alarm(0), setrlimit)', async () => {
    const r = await run(
      'import resource, signal\nsignal.alarm(0)\nfor lim in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC):\n    try:\n        resource.setrlimit(lim, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n        print("lifted")\n    except (ValueError, OSError):\n        pass\nwhile True:\n    pass',
    );
    assert.equal(r.reason, 'worker_timeout');
    assert.equal(r.stdout, 'Suicide from timeout.\n');
    await unharmed();
  });

  test('a call that ignores or catches the time-up signal still ends at its limit', async () => {
    for (const handler of ['signal.SIG_IGN', 'lambda *_: print("caught", flush=True)']) {
      const started = Date.now();
      const r = await run(
        `import signal, time\nsignal.signal(signal.SIGALRM, ${handler})\nwhile True:\n    time.sleep(0.01)`,
      );
      assert.equal(r.reason, 'worker_timeout');
      assert.match(r.stdout ?? '', /Suicide from timeout\.\n$/);
      assert.ok(Date.now() - started < 6000, `${Date.now() - started} ms`);
    }
    await unharmed();
  });

  test('setsid double-forked daemon does not survive the call', async () => {
    const r = await run(
      'import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\nprint("parent done")',
    );
    assert.equal(r.stdout, 'parent done\n');
    await unharmed();
  });

  test("a call's busy processes get one worker's share of the CPUs, not one share each", async (t) => {
    const health = (await (await fetch(`${server.url}/health`)).json()) as { cgroup: string };
    if (!health.cgroup.includes('+cpu')) {
      t.skip(`no cgroup cpu controller here (${health.cgroup})`);
      return;
    }
    // CPU time inside one shared wall-clock window, not wall time: a machine loaded by other tests
    // slows both calls alike, and with more CPUs than busy processes nobody waits at all. What the
    // sandbox's calls get together (U CPUs) is split by worker: the other call (naming numpy sends
    // it to the heavy executor, another worker) gets min(1, U/2) of a CPU. Shared task by task with
    // the bomb's eight processes it would get U/9.
    const t0 = Date.now() / 1000 + 1.4;
    const t1 = t0 + 1;
    const window = (body: string) =>
      `import os, time\nT0, T1 = ${t0.toFixed(3)}, ${t1.toFixed(3)}\ntime.sleep(max(0, T0 - time.time()))\nlate = time.time() - T0\nc = time.process_time()\nwhile time.time() < T1:\n    pass\n${body}`;
    const bomb = run(
      `import os\nfor i in range(8):\n    if os.fork() == 0:\n${window('os.write(1, f"{time.process_time() - c:.4f} {late:.3f}\\n".encode())\nos._exit(0)').replace(/^/gm, '        ')}\nfor i in range(8):\n    os.wait()\nprint("done")`,
    );
    const other = await run(`${window('print(f"{time.process_time() - c:.4f} {late:.3f}")')}  # numpy`);
    const lines = (await bomb).stdout.trim().split('\n');
    assert.equal(lines.pop(), 'done', JSON.stringify(lines));
    const rows = [other.stdout, ...lines].map((l) => l.trim().split(' ').map(Number));
    const late = Math.max(...rows.map(([, l]) => l));
    assert.ok(late < 0.5, `a call started ${late} s into the window: the machine is too slow for it`);
    const mine = rows[0][0];
    const all = rows.reduce((sum, [cpu]) => sum + cpu, 0);
    const fair = Math.min(t1 - t0, all / 2);
    assert.ok(
      mine > 0.6 * fair,
      `other call: ${mine.toFixed(3)} s CPU of ${all.toFixed(3)} s in a ${(t1 - t0).toFixed(1)} s window (its fair share ${fair.toFixed(3)} s)`,
    );
    await unharmed();
  });

  test('kill(-1) and killing the parent only hit the call itself', async () => {
    const r = await run(
      'import os, signal, time\nchild = os.fork()\nif child == 0:\n    time.sleep(60)\nos.kill(-1, signal.SIGKILL)\nprint("alive", os.waitpid(child, 0)[1])',
    );
    assert.equal(r.stdout, 'alive 9\n');
    // getppid() is 0 outside the namespace: the last kill targets the call's own process group.
    const p = await run(
      'import os, signal\nfor pid in range(2, 4096):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nos.kill(os.getppid(), signal.SIGKILL)\nprint("unreachable")',
    );
    // As PID 1 of its namespace the call ignores its own SIGKILL; either way it is answered.
    assert.equal(p.reason, '');
    await unharmed();
  });

  test('keyrings, SysV IPC and user namespaces cannot carry state past the call', async () => {
    const lib = 'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n';
    // keyctl (per-uid, not namespaced) and unshare(CLONE_NEWUSER) are refused by seccomp.
    const refused = await run(`${lib}print(libc.syscall(250, 0, 0, 0, 0, 0), libc.unshare(0x10000000))`);
    assert.equal(refused.stdout, '-1 -1\n');
    const made = await run(`${lib}print(libc.shmget(4321, 4096, 0o1666) >= 0)`);
    assert.equal(made.stdout, 'True\n');
    for (let i = 0; i < 3; i += 1) {
      const later = await run(`${lib}print(libc.shmget(4321, 0, 0))`);
      assert.equal(later.stdout, '-1\n', 'a fresh IPC namespace per call');
    }
    const normal = await run(
      'import threading, subprocess\nt = threading.Thread(target=print, args=("t",))\nt.start(); t.join()\nprint(subprocess.run(["echo", "s"], capture_output=True, text=True).stdout.strip())',
    );
    assert.equal(normal.stdout, 't\ns\n', 'threads and subprocesses still work');
    await unharmed();
  });

  test('a child killed while it waits for its call is replaced; the call still runs', async () => {
    // Executors fork (and sandbox) the next call's child ahead of time; it runs as the worker's
    // unprivileged uid, the only processes in the service that do while no call runs.
    await server.steadyCount();
    const uid = (pid: number) => {
      try {
        return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]);
      } catch {
        return -1;
      }
    };
    const waiting = server.pids().filter((pid) => uid(pid) >= 200_000);
    assert.equal(waiting.length, 2, 'one prepared child per executor');
    for (const pid of waiting) process.kill(pid, 'SIGKILL');
    // Dead (a zombie until its executor reaps it), so its end of the request pipe is closed.
    const dead = (pid: number) => {
      try {
        return /^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
      } catch {
        return true;
      }
    };
    for (let i = 0; i < 100 && !waiting.every(dead); i += 1) await new Promise((r) => setTimeout(r, 20));
    const light = await run('print(6 * 7)');
    assert.equal(light.stdout, '42\n', JSON.stringify(light));
    const heavy = await run('import sympy\nprint(sympy.factorint(360))');
    assert.equal(heavy.stdout, '{2: 3, 3: 2, 5: 1}\n', JSON.stringify(heavy));
    await unharmed();
  });

  test("a call cannot find an earlier call's code, input or output in its own memory", async () => {
    // Each executor forks every call's child from itself: whatever bytes of earlier calls its
    // memory holds (freed request or output buffers), the next child inherits. Plant three
    // secrets per executor (one only in the code, one only in stdin, one only in the output),
    // then let later calls of the same executor scan every readable page of their own memory.
    const marker = 'k9Xv';
    const hex = () => Array.from({ length: 16 }, () => Math.floor(Math.random() * 16).toString(16)).join('');
    const scan = [
      'import ctypes, re',
      'found = set()',
      'for line in open("/proc/self/maps").read().splitlines():',
      '    fields = line.split()',
      '    span, perms, inode = fields[0], fields[1], fields[4]',
      '    # Anonymous memory (heap, stack, arenas) is where freed buffers stay; file pages hold no call data.',
      '    if perms[0] != "r" or inode != "0" or line.endswith(("[vvar]", "[vvar_vclock]", "[vsyscall]")):',
      '        continue',
      '    lo, hi = (int(x, 16) for x in span.split("-"))',
      '    for pos in range(lo, hi, 1 << 22):',
      '        chunk = ctypes.string_at(pos, min(hi, pos + (1 << 22) + 64) - pos)',
      '        found.update(m.decode() for m in re.findall(rb"' + marker + '([0-9a-f]{16})", chunk))',
      'print(sorted(found))',
    ].join('\n');
    for (const route of ['', '  # sympy']) {
      const secrets = { code: hex(), input: hex(), output: hex() };
      const reversed = [...secrets.output].reverse().join('');
      const plant = await run(
        `kept = "${marker}${secrets.code}"\ns = input()\nprint("${marker}" + "${reversed}"[::-1], len(s))${route}`,
        `${marker}${secrets.input}\n`,
      );
      assert.equal(plant.stdout, `${marker}${secrets.output} 20\n`, JSON.stringify(plant));
      for (let i = 0; i < 3; i += 1) {
        const r = await run(scan + route);
        assert.equal(r.run_success, true, JSON.stringify(r));
        for (const [where, secret] of Object.entries(secrets))
          assert.ok(!r.stdout.includes(secret), `the ${where} of an earlier call is readable: ${r.stdout}`);
      }
    }
    await unharmed();
  });

  test('fake end markers and protocol bytes in stdout are just output', async () => {
    const fake = '@@E\\n@@D0.1\\n\\x00\\x00\\x00\\x05{}}}}';
    const r = await run(`import sys\nsys.stdout.write("${fake}")\nprint('{"id": 1, "exit": 0}')`);
    assert.equal(r.stdout, '@@E\n@@D0.1\n\u0000\u0000\u0000\u0005{}}}}{"id": 1, "exit": 0}\n');
    await unharmed();
  });
});
