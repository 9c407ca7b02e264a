// Catches: a session that is not sealed. A daemon a cell leaves running into the next cell; a forged
// hand-off (a cell naming a process it left behind as the session's new state, or a process of the
// cell claiming the cell's word); a port or abstract UNIX socket one session holds that another
// session or a call can see; shared memory (SysV segments, /dev/shm files, memfds) that a session
// holds outside its address-space limit and piles up cell after cell; working-directory copies the
// family's init keeps without bound; a cell that can signal, re-limit or take a pidfd of its state
// or the init; and a per-cell guard that stacks, so that cells get slower and fail past ~1,000.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { SubmissionResult } from '../../src/records/sandbox.js';
import { SandboxClient, SessionLost } from '../../src/sandbox/client.js';
import { type GuardedServer, startGuardedServer } from '../support/guard.js';

const lines = (...code: string[]) => code.join('\n');

/** Finds the cell's own sequence number and the session socket in the frames that run it. */
const CELL_INTERNALS = lines(
  'import sys',
  'f = sys._getframe()',
  "while f is not None and 'seq' not in f.f_locals:",
  '    f = f.f_back',
  "seq, sock = f.f_locals['seq'], f.f_locals['sock']",
);

/** A daemon: double-forked and setsid, reparented to the family's init; its pid in `daemon`. */
const DAEMON = lines(
  'import os, time',
  'r, w = os.pipe()',
  'middle = os.fork()',
  'if middle == 0:',
  '    os.setsid()',
  '    if os.fork() == 0:',
  "        os.write(w, b'%d' % os.getpid())",
  '        while True:',
  '            time.sleep(0.05)',
  '    os._exit(0)',
  'os.waitpid(middle, 0)',
  'daemon = int(os.read(r, 64))',
  // Kept where a rollback does not reach (the family's /dev/shm), for the next cell to look.
  "open('/dev/shm/daemon', 'w').write(str(daemon))",
);

const GONE = lines(
  'import os',
  "d = int(open('/dev/shm/daemon').read())",
  "procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())",
  // The init (1), this cell's state (its parent) and the cell: nothing else lives in the family.
  "alive = os.path.exists(f'/proc/{d}') and open(f'/proc/{d}/stat').read().split()[2] != 'Z'",
  'alive, procs == sorted([1, os.getppid(), os.getpid()])',
);

describe('sealed sessions: processes, hand-off, sockets, memory (hostile cells)', () => {
  let server: GuardedServer;
  let client: SandboxClient;

  const cell = (session: string, solution: string): Promise<SubmissionResult> =>
    client.run({ type: 'python', solution, session_id: session });

  before(async () => {
    // One executor: every session and call here shares it, so what isolates them is the family's
    // own namespaces, not bubblewrap's per executor.
    server = await startGuardedServer(['--workers', '1', '--tool-timeout', '3', '--memory', '256'], {
      maxPids: 600,
      memoryBytes: 4 * 1024 ** 3,
    });
    client = new SandboxClient(server.url, { rejectServiceFailures: true, retries: 1 });
    const health = (await (await fetch(`${server.url}/health`)).json()) as { isolation: string };
    assert.equal(
      health.isolation,
      'namespaces',
      'these tests need the namespace sandbox (root + bubblewrap)',
    );
  });
  after(async () => {
    await client.close();
    assert.deepEqual(await server.stop(), []);
  });

  test('a daemon forked in one cell is gone in the next: only the init and the state remain', async () => {
    const s = await client.createSession();
    const r = await cell(s, `x = 1\n${DAEMON}\nx`);
    assert.equal(r.stdout, '1\n', JSON.stringify(r));
    assert.equal(r.session_rolled_back, undefined);
    const next = await cell(s, GONE);
    assert.equal(next.stdout, '(False, True)\n', JSON.stringify(next));
    await client.closeSession(s);
  });

  test('a forged hand-off naming a daemon is refused: the cell rolled back, the state unchanged, the daemon swept', async () => {
    const s = await client.createSession();
    await cell(s, 'x = 1');
    const r = await cell(
      s,
      lines(CELL_INTERNALS, DAEMON, 'x = 2', "sock.send(b'DONE %d 0 %d' % (seq, daemon))", 'time.sleep(0.3)'),
    );
    assert.equal(r.session_rolled_back, true, JSON.stringify(r));
    const next = await cell(s, `${GONE}, x`);
    assert.equal(next.stdout, '(False, True, 1)\n', JSON.stringify(next));
    await client.closeSession(s);
  });

  test("a process of the cell cannot give the cell's word: its DONE is ignored, the cell's own counts", async () => {
    const s = await client.createSession();
    await cell(s, 'x = 1');
    // The daemon names itself as the new state; the cell then finishes as usual.
    const r = await cell(
      s,
      lines(
        CELL_INTERNALS,
        'import os, time',
        'r, w = os.pipe()',
        'middle = os.fork()',
        'if middle == 0:',
        '    if os.fork() == 0:',
        "        sock.send(b'DONE %d 0 %d' % (seq, os.getpid()))",
        "        os.write(w, b'%d' % os.getpid())",
        '        while True:',
        '            time.sleep(0.05)',
        '    os._exit(0)',
        'os.waitpid(middle, 0)',
        "open('/dev/shm/daemon', 'w').write(os.read(r, 64).decode())",
        'time.sleep(0.2)',
        'x = 2',
      ),
    );
    assert.equal(r.session_rolled_back, undefined, JSON.stringify(r));
    const next = await cell(s, `${GONE}, x`);
    assert.equal(next.stdout, '(False, True, 2)\n', JSON.stringify(next));
    await client.closeSession(s);
  });

  test('a state that starts a thread between cells (a timer signal) is lost at its next cell, never kept', async () => {
    const s = await client.createSession();
    // A POSIX timer (a process's own, so the cell must become the state itself: one thread, little
    // CPU) fires in the state after the hand-off; its Python handler starts a thread there.
    const armed = await cell(
      s,
      lines(
        'import ctypes, signal, threading, time',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'ticks = [0]',
        'def spin():',
        '    while True:',
        '        ticks[0] += 1',
        '        time.sleep(0.01)',
        'signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=spin, daemon=True).start())',
        'event = (ctypes.c_int * 16)()',
        'event[2], event[3] = signal.SIGUSR1, 0  # sigev_signo, SIGEV_SIGNAL',
        'timer = ctypes.c_void_p()',
        'assert libc.timer_create(1, event, ctypes.byref(timer)) == 0',
        'assert libc.timer_settime(timer, 0, (ctypes.c_long * 4)(0, 0, 0, 200_000_000), None) == 0',
        "'armed'",
      ),
    );
    assert.equal(armed.stdout, "'armed'\n", JSON.stringify(armed));
    await new Promise((r) => setTimeout(r, 700));
    // The lost message names the check that found it: the state ran a second thread.
    await assert.rejects(
      cell(s, 'ticks[0]'),
      (e: Error) => e instanceof SessionLost && /state-threads-[2-9]/.test(e.message),
    );
    await client.closeSession(s);
  });

  test('a port and an abstract UNIX socket a session holds are invisible to other sessions and to calls', async () => {
    const [a, b] = await Promise.all([client.createSession(), client.createSession()]);
    const hold = lines(
      'import socket',
      'tcp = socket.socket()',
      "tcp.bind(('127.0.0.1', 45678))",
      'tcp.listen()',
      'unix = socket.socket(socket.AF_UNIX)',
      "unix.bind('\\0rstar-held')",
      'unix.listen()',
      'tcp.getsockname()[1]',
    );
    assert.equal((await cell(a, hold)).stdout, '45678\n');
    // The same addresses are free elsewhere (no EADDRINUSE), and nothing answers there.
    const probe = lines(
      'import socket',
      'tcp = socket.socket()',
      "tcp.bind(('127.0.0.1', 45678))",
      'unix = socket.socket(socket.AF_UNIX)',
      "unix.bind('\\0rstar-held')",
      'c = socket.socket()',
      'try:',
      "    c.connect(('127.0.0.1', 45678))",
      "    reached = 'connected'",
      'except OSError as e:',
      '    reached = e.errno',
      'reached',
    );
    assert.equal((await cell(b, probe)).stdout, '111\n'); // ECONNREFUSED
    assert.equal((await client.run({ type: 'python', solution: probe })).stdout, '111\n');
    // And the holder still holds them.
    assert.equal(
      (await cell(a, 'tcp.getsockname()[1], unix.getsockname()')).stdout,
      "(45678, b'\\x00rstar-held')\n",
    );
    await Promise.all([client.closeSession(a), client.closeSession(b)]);
  });

  test('shared memory a session holds across cells (SysV, /dev/shm) is its own: another session sees none', async () => {
    const [a, b] = await Promise.all([client.createSession(), client.createSession()]);
    const r = await cell(
      a,
      lines(
        'import ctypes',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'libc.shmat.restype = ctypes.c_void_p',
        'seg = libc.shmget(0x5e55, 1 << 20, 0o1666)',
        'addr = libc.shmat(seg, None, 0)',
        'ctypes.memset(addr, 7, 1 << 20)',
        "open('/dev/shm/held', 'wb').write(b'held')",
        'seg >= 0',
      ),
    );
    assert.equal(r.stdout, 'True\n', JSON.stringify(r));
    const look = lines(
      'import os',
      "segments = open('/proc/sysvipc/shm').read().splitlines()[1:]",
      "segments, os.listdir('/dev/shm')",
    );
    assert.equal((await cell(b, look)).stdout, '([], [])\n');
    const mine = await cell(a, `${look}\nlen(segments), os.listdir('/dev/shm')`);
    assert.equal(mine.stdout, "(1, ['held'])\n");
    await Promise.all([client.closeSession(a), client.closeSession(b)]);
  });

  test('a memory ratchet across cells stops at its bounds: SysV segments, /dev/shm, memfds', async () => {
    const [s, neighbour] = await Promise.all([client.createSession(), client.createSession()]);
    await cell(neighbour, 'y = 2');
    // A 6 MiB segment per cell, touched and detached: it counts in no address space.
    const segment = lines(
      'import ctypes',
      'libc = ctypes.CDLL(None, use_errno=True)',
      'libc.shmat.restype = ctypes.c_void_p',
      'seg = libc.shmget(0, 6 << 20, 0o1600)',
      'if seg < 0:',
      "    raise OSError(ctypes.get_errno(), 'shmget')",
      'addr = libc.shmat(seg, None, 0)',
      'ctypes.memset(addr, 1, 6 << 20)',
      'libc.shmdt(ctypes.c_void_p(addr))',
      "'held'",
    );
    const segments: string[] = [];
    for (let i = 0; i < 4; i += 1) {
      const r = await cell(s, segment);
      segments.push(r.stdout || (r.stderr ?? '').split('\n')[0]);
    }
    assert.deepEqual(segments.slice(0, 2), ["'held'\n", "'held'\n"]);
    assert.match(segments[3], /^OSError at line 6: \[Errno 28\] shmget/, segments.join(' | '));
    const files: string[] = [];
    for (let i = 0; i < 4; i += 1) {
      const r = await cell(s, `open("/dev/shm/f${i}", "wb").write(b"x" * (6 << 20))`);
      files.push(r.stdout || (r.stderr ?? '').split('\n')[0]);
    }
    assert.deepEqual(files.slice(0, 2), ['6291456\n', '6291456\n']);
    assert.match(files[3], /No space left on device/, files.join(' | '));
    const memfd = await cell(s, 'import os\nos.memfd_create("held")');
    assert.match(memfd.stderr ?? '', /^PermissionError at line 2: \[Errno 1\]/, JSON.stringify(memfd));
    // The session and its neighbour go on.
    assert.equal((await cell(s, 'x = 3\nx')).stdout, '3\n');
    assert.equal((await cell(neighbour, 'y')).stdout, '2\n');
    await Promise.all([client.closeSession(s), client.closeSession(neighbour)]);
  });

  test("the init's copies of working directories are bounded: a fork or a commit past it fails cleanly", async () => {
    // The family's working directories together hold at most the scratch size (64 MiB here).
    const s = await client.createSession();
    await cell(s, 'open("big", "wb").write(b"x" * (25 << 20))\nx = 1');
    const copy = await client.forkSession(s);
    await assert.rejects(client.forkSession(s), /at most 64 MiB/);
    const r = await cell(copy, 'open("more", "wb").write(b"y" * (20 << 20))\nx = 2');
    assert.equal(r.session_rolled_back, true, JSON.stringify(r));
    assert.match(r.stderr ?? '', /rolled back: the working directories .* over 64 MiB/);
    const back = await cell(copy, 'import os\nx, sorted(os.listdir("."))');
    assert.equal(back.stdout, "(1, ['big'])\n");
    assert.equal((await cell(s, 'x')).stdout, '1\n');
    await Promise.all([client.closeSession(s), client.closeSession(copy)]);
  });

  test('the guard: no signal, rlimit, pidfd or CLONE_PARENT against the state or the init; the cell its own children', async () => {
    const s = await client.createSession();
    await cell(s, 'x = 1');
    const r = await cell(
      s,
      lines(
        'import ctypes, os, resource, signal, subprocess',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'state = os.getppid()',
        'def errno(call):',
        '    try:',
        '        call()',
        "        return 'allowed'",
        '    except OSError as e:',
        '        return e.errno',
        'def raw(nr, *args):',
        '    if libc.syscall(nr, *args) < 0:',
        '        raise OSError(ctypes.get_errno(), "")',
        'proc = os.open(f"/proc/{state}", os.O_RDONLY | os.O_DIRECTORY)',
        'child = subprocess.Popen(["sleep", "30"])',
        'results = [',
        '    errno(lambda: os.kill(state, signal.SIGKILL)),',
        '    errno(lambda: os.kill(-state, signal.SIGKILL)),',
        '    errno(lambda: os.kill(1, signal.SIGKILL)),',
        '    errno(lambda: os.kill(-1, signal.SIGKILL)),',
        '    errno(lambda: resource.prlimit(state, resource.RLIMIT_NOFILE, (3, 3))),',
        '    errno(lambda: os.pidfd_open(state)),',
        '    errno(lambda: raw(424, proc, signal.SIGKILL, None, 0)),', // pidfd_send_signal via /proc/PID
        '    errno(lambda: raw(56, 0x8000 | signal.SIGCHLD, 0, 0, 0, 0)),', // clone(CLONE_PARENT)
        ']',
        'child.kill()',
        'results + [child.wait()]',
      ),
    );
    assert.equal(r.stdout, '[1, 1, 1, 1, 1, 1, 1, 1, -9]\n', JSON.stringify(r));
    assert.equal((await cell(s, 'x')).stdout, '1\n');
    await client.closeSession(s);
  });
});

describe('sealed sessions: 5,000 cells', () => {
  let server: GuardedServer;
  let client: SandboxClient;
  before(async () => {
    server = await startGuardedServer(['--workers', '2', '--tool-timeout', '5'], {
      maxPids: 300,
      memoryBytes: 2 * 1024 ** 3,
    });
    client = new SandboxClient(server.url, { rejectServiceFailures: true, retries: 1 });
  });
  after(async () => {
    await client.close();
    assert.deepEqual(await server.stop(), []);
  });

  test('a session runs 5,000 cells at a flat cost per cell (first and last 100)', {
    timeout: 1_500_000,
  }, async () => {
    const s = await client.createSession();
    await client.run({ type: 'python', solution: 'x = 0', session_id: s });
    const walls: number[] = [];
    const costs: number[] = [];
    for (let i = 0; i < 5000; i += 1) {
      const t = performance.now();
      const r = await client.run({ type: 'python', solution: 'x += 1', session_id: s });
      assert.ok(r.reason === '' && r.session_rolled_back === undefined, `cell ${i}: ${JSON.stringify(r)}`);
      walls.push(performance.now() - t);
      costs.push(r.cost * 1000);
    }
    // Medians: the suite shares two cores with other test files, and a burst of their load inside
    // one 100-cell window would move a mean; a guard that stacks grows every cell's cost, so the
    // median moves with it (and the kernel refuses the ~1,000th guard outright).
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const [firstWall, lastWall] = [median(walls.slice(0, 100)), median(walls.slice(-100))];
    const [first, last] = [median(costs.slice(0, 100)), median(costs.slice(-100))];
    console.log(
      `5,000 cells: median of the first 100 ${firstWall.toFixed(1)} ms a cell (executor ${first.toFixed(1)} ms), of the last 100 ${lastWall.toFixed(1)} ms (executor ${last.toFixed(1)} ms)`,
    );
    assert.ok(
      last < 3 * first,
      `executor cost, first 100: ${first.toFixed(1)} ms, last 100: ${last.toFixed(1)} ms`,
    );
    assert.equal((await client.run({ type: 'python', solution: 'x', session_id: s })).stdout, '5000\n');
    await client.closeSession(s);
  });
});
