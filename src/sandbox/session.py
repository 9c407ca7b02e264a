# Stateful sessions of the warm executor (sandbox-serve): a module of it, imported by zygote.py (its
# request loop hands the session operations here), built on confine.py (the executor's process: the
# sandbox set-up, the seccomp assembler, the wipe-on-fork buffers) and cell.py (how a cell runs).
#
# The warm runner of trusted code (src/sandbox/warm.py) has sessions of its own, with the same cell
# rules (cell.py) and the same helpers (cell.py too). They stay two models because they run in two
# settings: these sessions hold untrusted code, so every part of a session lives in namespaces and
# under limits, behind a family init that checks what states and cells say; warm.py's run the
# curriculum's own programs, in one unconfined interpreter with no namespaces, no init and no
# guard, where a session is a forked holder and its cells talk JSON over pipes.
#
# A session is a Python state held by a process, and every cell runs in a process forked from it:
#
#   executor ──ctl──> family init (PID 1 of a PID namespace of its own, root, runs no user code)
#                        ├── state S of session A  (unprivileged, blocked on its socket)
#                        │      └── cell C  (forked from S per cell; runs the code)
#                        └── state of session B  (a fork of A: same namespace, uid and limits)
#
# A cell that finishes (with or without an exception) becomes the session's new state: its process
# itself when it has no other thread (no fork at all), else a fork taken from its main thread (so no
# thread of the cell survives into the state). A cell that is killed (time, memory, output limit, a
# crash, an exit without a snapshot) leaves the state it was forked from untouched, and its files as
# they were (the family init keeps a copy of the working directory for the length of the cell). After
# every cell the init kills every process of the namespace that is not a state, so nothing a cell
# started runs on into the next one.
#
# A family is the sessions made from one `new` by `fork`: they share the init, the PID namespace, a
# uid and the scratch tmpfs, because a copy-on-write fork of a process cannot leave its namespace or
# its uid. Each member still has its own working directory contents (the init swaps them in before a
# cell of another member) and its own memory; the state guard (a seccomp filter installed once by
# the first state, whose signal, prlimit and pidfd questions the init answers) stops a cell from
# signalling, re-limiting or reading any state or the init, so a family member cannot reach another's
# state either. Families are isolated from each other by their namespaces (PID, mount, IPC, network)
# and uids as stateless calls are; what a family holds outside its address spaces (SysV shm,
# /dev/shm, the init's copies of working directories) is bounded, and memfds are refused.
#
# Messages are short ASCII words on SOCK_SEQPACKET socketpairs (one message per send), descriptors
# passed with SCM_RIGHTS. What a state or a cell sends the init is checked (sequence numbers, the
# sender's pid from SCM_CREDENTIALS, the parentage of the pids it names), since a cell's code runs in
# the same processes: a cell cannot hand the session to a daemon it left behind.
import ctypes
import fcntl
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback

from cell import dead_children, fresh_main, reset_sympy_counters, run_cell, thread_count, write_all
from confine import (
    CALL_LIMITS,
    CLONE_NEWPID,
    CONFIG,
    CONTROL_OUT,
    ERR,
    EXECUTOR_NOFILE,
    ISOLATE,
    MODES,
    OUT,
    PIDNS,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    PR_SET_SECCOMP,
    REQ,
    RESPONSE,
    SECCOMP_CALL,
    SECCOMP_MODE_FILTER,
    TIME_UP,
    TIME_UP_GRACE,
    X86_64,
    Output,
    SockFilter,
    SockFprog,
    check,
    flush_and_exit,
    flush_streams,
    libc,
    private_scratch,
    reset_streams,
    respond,
    set_cpu_limit,
)

OP_CALL, OP_NEW, OP_CELL, OP_FORK, OP_CLOSE = 0, 1, 2, 3, 4
FLAG_ROLLED_BACK, FLAG_LOST = 1, 2
# Sessions of one family at most (its states count against the family uid's RLIMIT_NPROC).
FAMILY_MAX = 64
# Seconds the executor waits for a family's answer before it takes the family for hung and kills it.
CTL_WAIT = 10.0
SIGKILL = signal.SIGKILL
# What a family may hold outside its processes' address space (RLIMIT_AS does not count it, and
# without cgroups nothing else would): SysV shared memory and message queues in its own IPC
# namespace, /dev/shm (private_scratch: 16 MiB), and the working directories the init keeps for
# its members (all members together, the scratch tmpfs's size, family_files_bytes(); a commit or
# fork past it is refused).
SYSV_SHM_BYTES = 16 << 20


def family_files_bytes():
    return CONFIG['scratch_mb'] << 20


# Rounds of the sweep after a cell before the family is taken as unsweepable (and killed).
SWEEP_ROUNDS = 100


class Family:
    """The executor's handle on one family init: its pid, a pidfd to see it die, the control socket."""

    def __init__(self, pid, ctl):
        self.pid = pid
        self.ctl = ctl
        self.pidfd = os.pidfd_open(pid)
        self.members = set()
        self.seq = 0

    def dead(self):
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return bool(ready)

    def kill(self):
        try:
            os.kill(self.pid, SIGKILL)  # PID 1 of the namespace: every state and cell goes with it
        except ProcessLookupError:
            pass
        self.reap(block=True)

    def reap(self, block=False):
        try:
            os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            pass
        for closer in (self.ctl.close, lambda: os.close(self.pidfd)):
            try:
                closer()
            except OSError:
                pass

    def request(self, message, fds=(), wait=CTL_WAIT):
        """Sends one message and returns the init's answer, None when the family is gone or hung
        (a hung family is killed: its sessions are then lost, never left half-answered)."""
        try:
            if fds:
                socket.send_fds(self.ctl, [message], list(fds))
            else:
                self.ctl.send(message)
        except OSError:
            return None
        return self.answer(wait)

    def answer(self, wait=CTL_WAIT):
        end = time.perf_counter() + wait
        while True:
            left = end - time.perf_counter()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.ctl, self.pidfd], [], [], left)
            if self.ctl in ready:
                try:
                    data = self.ctl.recv(256)
                except OSError:
                    return None
                return data or None
            if ready:
                return None


FAMILIES = {}  # session number -> Family


def drop_family(family):
    for number in list(family.members):
        FAMILIES.pop(number, None)
    family.kill()


def respond_session(call_id, flags=0, exit_code=0, cost=0.0, timed_out=False, exceeded=False, out=0, err=0):
    head = RESPONSE.pack(call_id, exit_code, cost, timed_out, exceeded, 0, flags, out, err)
    write_all(CONTROL_OUT, [head, OUT.view[:out], ERR.view[:err]])


def respond_lost(call_id, why, flags=FLAG_LOST):
    """A lost session's answer: no output of the cell, only which check found the session gone (the
    pool names it in the session's lost message)."""
    text = why.encode('utf-8', 'replace')[:200]
    write_all(CONTROL_OUT, [RESPONSE.pack(call_id, 0, 0.0, 0, 0, 0, flags, 0, len(text)), text])


def session_new(call_id, number, uid, files_len):
    """Starts a family with one session, its working directory holding the request's files."""
    if not ISOLATE:
        respond(call_id, error='sessions need the isolated sandbox (root and bubblewrap)')
        return
    if number in FAMILIES:
        respond(call_id, error=f'session {number} exists')
        return
    files_fd = os.memfd_create('files')
    write_all(files_fd, [REQ.view[:files_len]])
    os.lseek(files_fd, 0, os.SEEK_SET)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    check(libc.unshare(CLONE_NEWPID), 'unshare(pid)')
    try:
        pid = os.fork()
    except BaseException:
        check(libc.setns(PIDNS, CLONE_NEWPID), 'setns(pid)')
        raise
    if pid == 0:
        mine.close()
        family_main(theirs, uid, number, files_fd)
    check(libc.setns(PIDNS, CLONE_NEWPID), 'setns(pid)')
    theirs.close()
    os.close(files_fd)
    family = Family(pid, mine)
    answer = family.answer()
    if answer != b'OK':
        family.kill()
        text = answer.decode('utf-8', 'replace')[4:] if answer else 'the session did not start'
        respond(call_id, error=f'session set-up failed: {text}')
        return
    family.members.add(number)
    FAMILIES[number] = family
    respond_session(call_id)


def session_fork(call_id, source, number):
    family = FAMILIES.get(source)
    if family is None:
        respond_session(call_id, FLAG_LOST)
        return
    if number in FAMILIES:
        respond(call_id, error=f'session {number} exists')
        return
    if len(family.members) >= FAMILY_MAX:
        respond(call_id, error=f'a family holds at most {FAMILY_MAX} sessions')
        return
    answer = family.request(b'FORK %d %d' % (source, number))
    if answer is None or answer == b'SWEEP':
        drop_family(family)
        respond_session(call_id, FLAG_LOST)
        return
    if answer == b'FILES':
        limit = family_files_bytes() >> 20
        respond(call_id, error=f'session fork refused: the working directories of a session and its forks hold at most {limit} MiB')
        return
    if answer != b'OK':
        respond_session(call_id, FLAG_LOST)
        return
    family.members.add(number)
    FAMILIES[number] = family
    respond_session(call_id)


def session_close(call_id, number):
    family = FAMILIES.pop(number, None)
    if family is None:
        respond_session(call_id, FLAG_LOST)
        return
    family.members.discard(number)
    answer = family.request(b'CLOSE %d' % number, wait=5.0)
    if answer is None or not family.members:
        # The last member's init exits by itself; a hung one is killed.
        if answer is None:
            drop_family(family)
        else:
            family.reap(block=True)
    respond_session(call_id)


def session_cell(call_id, number, code_len, input_len, keep_bytes, timeout, mode):
    """Runs one cell of a session; answers as a stateless call does, plus the session flags."""
    family = FAMILIES.get(number)
    if family is None or family.dead():
        if family is not None:
            drop_family(family)
        respond_lost(call_id, 'its family was gone before the cell' if family is None else 'its init had exited')
        return
    OUT.reserve(keep_bytes)
    ERR.reserve(keep_bytes)
    family.seq += 1
    seq = family.seq
    stdin_fd = os.memfd_create('stdin')
    req_fd = os.memfd_create('request')
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    write_all(stdin_fd, [REQ.view[code_len : code_len + input_len]])
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    start = time.perf_counter()
    deadline = start + timeout
    write_all(req_fd, [b'%r %r\n%s\n' % (timeout, deadline, MODES[mode] if mode < len(MODES) else MODES[0]), REQ.view[:code_len]])
    os.lseek(req_fd, 0, os.SEEK_SET)
    try:
        socket.send_fds(family.ctl, [b'CELL %d %d' % (number, seq)], [stdin_fd, out_w, err_w, req_fd])
        sent = True
    except OSError:
        sent = False
    finally:
        for fd in (stdin_fd, out_w, err_w, req_fd):
            os.close(fd)
    output = Output(out_r, err_r, keep_bytes)
    open_fds = output.open
    exceeded = False
    ended = None  # (status, candidate) once the init says the cell ended
    exited_at = None
    lost = not sent
    why_lost = 'the cell could not be handed to the init' if lost else ''
    signalled = 0

    def read_output(fd):
        nonlocal exceeded
        if output.read(fd):
            exceeded = True

    def tell(message):
        try:
            family.ctl.send(message)
            return True
        except OSError:
            return False

    try:
        while ended is None and not lost:
            now = time.perf_counter()
            if exceeded and signalled < SIGKILL:
                signalled = SIGKILL
                lost = not tell(b'SIGNAL %d' % SIGKILL)
                continue
            if now >= deadline and signalled == 0:
                signalled = TIME_UP
                lost = not tell(b'SIGNAL %d' % TIME_UP)
                continue
            if signalled == TIME_UP and now >= deadline + TIME_UP_GRACE:
                signalled = SIGKILL
                lost = not tell(b'SIGNAL %d' % SIGKILL)
                continue
            if signalled == 0:
                wait = deadline - now
            elif signalled == TIME_UP:
                wait = deadline + TIME_UP_GRACE - now
            else:
                wait = CTL_WAIT
            ready, _, _ = select.select(open_fds + [family.ctl, family.pidfd], [], [], max(wait, 0))
            if not ready and signalled == SIGKILL:
                lost = True  # the family did not answer a kill: hung
                why_lost = 'the init did not answer a kill'
                break
            for fd in ready:
                if fd is family.ctl:
                    try:
                        data = family.ctl.recv(256)
                    except OSError:
                        data = b''
                    words = data.split()
                    if not words or words[0] != b'END' or int(words[1]) != seq:
                        if not words and not lost:
                            lost, why_lost = True, 'the init closed its socket'
                        continue
                    exited_at = time.perf_counter()
                    if words[2] == b'lost':
                        lost = True
                        why_lost = 'the init lost the state: ' + (words[3].decode('ascii', 'replace') if len(words) > 3 else '?')
                    else:
                        ended = (int(words[2]), int(words[3]))
                elif fd == family.pidfd:
                    lost = True
                    why_lost = why_lost or 'the init exited during the cell'
                else:
                    read_output(fd)
        # What the cell wrote before it ended is in the pipes: read it before the verdict (a
        # MemoryError line decides it), without waiting for writers the sweep has yet to kill.
        for fd in list(open_fds):
            os.set_blocking(fd, False)
            try:
                while fd in open_fds:
                    read_output(fd)
            except BlockingIOError:
                pass
            os.set_blocking(fd, True)
        if exited_at is None:
            exited_at = time.perf_counter()
        timed_out = not exceeded and exited_at >= deadline
        status = ended[0] if ended else -SIGKILL
        memory = status != 0 and memory_error_line(output.kept[err_r])
        keep_state = ended is not None and ended[1] > 0 and not (timed_out or exceeded or memory or lost)
        flags = 0
        if lost:
            flags = FLAG_LOST
        else:
            answer = family.request(b'COMMIT' if keep_state else b'ROLLBACK')
            words = answer.split() if answer else []
            if not words or words[0] != b'DONE':
                flags = FLAG_LOST
                why_lost = f'the init did not answer {"the commit" if keep_state else "the rollback"} within {CTL_WAIT:g} s'
            else:
                flags = (FLAG_ROLLED_BACK if words[1] == b'1' else 0) | (FLAG_LOST if words[2] == b'1' else 0)
                if words[2] == b'1':
                    why_lost = 'its state was gone after the cell'
            why = words[3] if len(words) > 3 else b''
            if why == b'SWEEP':
                # Processes the init could not kill: nothing of this family can be trusted any more.
                drop_family(family)
                flags = FLAG_LOST | FLAG_ROLLED_BACK
                why_lost = 'processes of the session survived the sweep after the cell'
                number = None  # every member is dropped already
                note = b''  # a lost session's answer carries why_lost only (respond_lost)
            elif why == b'FILES':
                note = b'\nsession: the cell was rolled back: the working directories of this session and its forks'
                note += b' would hold over %d MiB\n' % (family_files_bytes() >> 20)
            else:
                note = b''
            if note:
                at = min(output.kept[err_r], keep_bytes - len(note)) if keep_bytes > len(note) else 0
                ERR.view[at : at + len(note)] = note[: keep_bytes - at]
                output.kept[err_r] = at + len(note[: keep_bytes - at])
        if flags & FLAG_LOST and number is not None:
            drop_family_member(family, number)
        # Every writer of the pipes is dead now (the init swept them): the rest drains quickly.
        output.drain(time.perf_counter() + 0.5)
    finally:
        os.close(out_r)
        os.close(err_r)
    if flags & FLAG_LOST:
        respond_lost(call_id, why_lost or 'the init could not be reached', flags)
        return
    cost = exited_at - start
    respond_session(call_id, flags, status, cost, timed_out, exceeded, output.kept[out_r], output.kept[err_r])


def drop_family_member(family, number):
    """A session the family lost (or a family that stopped answering): forgotten, the family killed
    when it cannot be trusted any more."""
    FAMILIES.pop(number, None)
    family.members.discard(number)
    if family.dead() or not family.members:
        drop_family(family)


def memory_error_line(err_len):
    """Whether the kept stderr has a line starting with MemoryError (read in place: no call bytes in
    this process's objects)."""
    at = ERR.map.find(b'MemoryError', 0, err_len)
    while at >= 0:
        if at == 0 or ERR.map[at - 1] == 10:
            return True
        at = ERR.map.find(b'MemoryError', at + 1, err_len)
    return False


# ---- inside the family: the init ------------------------------------------------------------------


def family_main(ctl, uid, number, files_fd):
    """The family init: PID 1 of the new namespace, root, never runs user code."""
    try:
        # Nothing of the executor's (its control pipes, other families' sockets) reaches a session.
        keep = sorted({ctl.fileno(), files_fd})
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, EXECUTOR_NOFILE)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        private_network()
        private_scratch()
        limit_ipc()
        blob = b''
        while True:
            chunk = os.read(files_fd, 1 << 20)
            if not chunk:
                break
            blob += chunk
        os.close(files_fd)
        write_tree(parse_files(blob), uid)
        Init(ctl, uid).run(number)
    except BaseException as error:
        try:
            ctl.send(b'ERR ' + f'{type(error).__name__}: {error}'.encode()[:400])
        except BaseException:
            pass
    os._exit(1)


CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1


def private_network():
    """A network namespace of the family's own, its loopback up as a stateless call's: a port or an
    abstract UNIX socket a state holds across cells is invisible to every other family and call."""
    check(libc.unshare(CLONE_NEWNET), 'unshare(net)')
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = bytearray(struct.pack('16sH22x', b'lo', 0))
        fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request)
        flags = struct.unpack_from('H', request, 16)[0] | IFF_UP
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, struct.pack('16sH22x', b'lo', flags))


def limit_ipc():
    """SysV shared memory and message queues of the family's IPC namespace (private_scratch made it)
    bounded: a segment detached and left behind, cell after cell, counts in no address space."""
    page = os.sysconf('SC_PAGE_SIZE')
    for name, value in (
        ('kernel/shmmax', SYSV_SHM_BYTES),
        ('kernel/shmall', SYSV_SHM_BYTES // page),
        ('kernel/shmmni', 16),
        ('kernel/msgmni', 8),
        ('kernel/msgmnb', 16384),
        ('fs/mqueue/queues_max', 8),
    ):
        with open(f'/proc/sys/{name}', 'w') as f:
            f.write(str(value))


def parse_files(blob):
    """The request's files: repeated (u32 name bytes, u32 data bytes, name, data)."""
    entries, at = [], 0
    while at + 8 <= len(blob):
        name_len, data_len = struct.unpack_from('<II', blob, at)
        at += 8
        name = blob[at : at + name_len].decode('utf-8', 'surrogateescape')
        at += name_len
        entries.append((name, 'file', 0o644, blob[at : at + data_len]))
        at += data_len
    return entries


def read_tree(root='/tmp'):
    """The working directory as entries (relative path, kind, mode, data or link target)."""
    entries = []

    def walk(path, rel):
        for entry in os.scandir(path):
            name = f'{rel}/{entry.name}' if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                entries.append((name, 'link', 0, os.readlink(entry.path)))
            elif entry.is_dir(follow_symlinks=False):
                entries.append((name, 'dir', st.st_mode & 0o7777, b''))
                walk(entry.path, name)
            elif entry.is_file(follow_symlinks=False):
                with open(entry.path, 'rb') as f:
                    entries.append((name, 'file', st.st_mode & 0o7777, f.read()))

    walk(root, '')
    return entries


def clear_tree(root='/tmp'):
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            clear_tree(entry.path)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def write_tree(entries, uid, root='/tmp'):
    for name, kind, mode, data in entries:
        norm = os.path.normpath(name)
        if not name or os.path.isabs(norm) or norm == '.' or norm.split('/')[0] == '..':
            raise ValueError(f'file name {name!r} is not inside the working directory')
        path = os.path.join(root, norm)
        if kind == 'dir':
            os.makedirs(path, exist_ok=True)
            os.chmod(path, mode)
        elif kind == 'link':
            os.symlink(data, path)
        else:
            parent = os.path.dirname(path)
            if parent != root:
                os.makedirs(parent, exist_ok=True)
                os.chown(parent, uid, uid)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            try:
                write_all(fd, [data])
            finally:
                os.close(fd)
        os.chown(path, uid, uid, follow_symlinks=False)


class Init:
    """The family's PID 1: relays cells to their session's state, decides nothing about a cell (the
    executor gives the verdict), keeps the working directories, judges the state guard's questions,
    and sweeps after every cell.

    What a state or a cell sends is read with its sender's pid (SCM_CREDENTIALS, which the kernel
    fills in and an unprivileged sender cannot forge): only the state may say which cell it forked,
    only that cell may say it is done, and the process it names as the new state must be the cell
    itself or a child of it (the fork from its main thread), never a process it left behind."""

    def __init__(self, ctl, uid):
        self.ctl = ctl
        self.uid = uid
        self.states = {}  # session number -> [pid, socket]
        self.trees = {}  # session number -> entries, for members whose files are not in /tmp
        self.owner = None  # whose files /tmp holds
        self.cell = None  # the running cell
        self.listener = -1  # the state guard's notifications (seccomp user notification)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake, self.wake_w = wake_r, wake_w
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)

    def run(self, number):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        pid = os.fork()
        if pid == 0:
            try:
                self.ctl.close()
                mine.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(self.wake)
                os.close(self.wake_w)
                first_state(theirs, self.uid)
            except BaseException as error:
                os.write(2, f'rstar session: state set-up failed: {type(error).__name__}: {error}\n'.encode())
            finally:
                os._exit(1)
        theirs.close()
        # The first state installs the guard every later state and cell inherits, and hands its
        # notifications here before it runs anything else.
        ready, _, _ = select.select([mine], [], [], CTL_WAIT)
        message, fds, sender = receive(mine) if ready else (b'', [], 0)
        if message != b'GUARD 0' or sender != pid or len(fds) > 1:
            raise RuntimeError('the first state did not start')
        self.listener = fds[0] if fds else -1
        self.states[number] = [pid, mine]
        self.owner = number
        self.ctl.send(b'OK')
        while True:
            watched = [self.ctl, self.wake] + [s[1] for s in self.states.values()]
            if self.listener >= 0:
                watched.append(self.listener)
            ready, _, _ = select.select(watched, [], [])
            if self.wake in ready:
                self.reap()
            if self.listener in ready:
                self.judge()
            for sock in ready:
                if sock is self.ctl:
                    self.from_executor()
                elif sock is not self.wake and sock != self.listener:
                    self.from_state(sock)

    def judge(self):
        """One question of the state guard: may this process signal, re-limit or take a pidfd of
        that one? Not of a state or of the init (by pid, or the process group a state leads), and no
        signal to every process (-1); anything else (the cell's own processes) goes through."""
        notice = bytearray(NOTIF_SIZE)
        try:
            fcntl.ioctl(self.listener, NOTIF_RECV, notice, True)
        except OSError:
            return  # the asking process died meanwhile
        call_id, _, _, nr, _, _ = NOTIF.unpack_from(notice)
        args = struct.unpack_from('<6Q', notice, NOTIF.size)
        target = ctypes.c_int32(args[0] & 0xFFFFFFFF).value
        protected = self.state_pids() | {1}
        if nr in (62, 129):  # kill, rt_sigqueueinfo: a pid, -1 (all), or -group
            refused = target == -1 or abs(target) in protected
        else:
            refused = target in protected
        answer = NOTIF_RESP.pack(call_id, 0, -1 if refused else 0, 0 if refused else NOTIF_CONTINUE)
        try:
            fcntl.ioctl(self.listener, NOTIF_SEND, bytearray(answer), True)
        except OSError:
            pass

    def reap(self):
        """Collects dead children (the wake-up pipe said SIGCHLD); a state among them is a lost session."""
        try:
            while os.read(self.wake, 512):
                pass
        except BlockingIOError:
            pass
        for pid in dead_children():
            for number, (state_pid, sock) in list(self.states.items()):
                if state_pid == pid:
                    self.lose(number)

    def lose(self, number, why=b'state-died'):
        """A state died (killed from inside its family, or the memory cgroup): its session is lost."""
        pid, sock = self.states.pop(number)
        sock.close()
        self.trees.pop(number, None)
        cell = self.cell
        if cell is not None and cell['number'] == number and not cell['ended']:
            cell['ended'] = True
            cell['lost'] = True
            if cell['pid']:
                self.kill(cell['pid'])
            self.ctl.send(b'END %d lost %s' % (cell['seq'], why))

    def kill(self, pid):
        try:
            os.kill(pid, SIGKILL)
        except ProcessLookupError:
            pass

    def state_pids(self):
        return {s[0] for s in self.states.values()}

    def from_executor(self):
        try:
            message, fds, _, _ = socket.recv_fds(self.ctl, 256, 8)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)  # the executor is gone
        words = message.split()
        verb = words[0]
        if verb == b'CELL':
            self.start_cell(int(words[1]), int(words[2]), fds)
        elif verb == b'SIGNAL':
            cell = self.cell
            if cell is not None and not cell['ended'] and cell['pid']:
                try:
                    os.kill(cell['pid'], int(words[1]))
                except ProcessLookupError:
                    pass
        elif verb in (b'COMMIT', b'ROLLBACK'):
            self.finish_cell(verb == b'COMMIT')
        elif verb == b'FORK':
            self.ctl.send(self.fork(int(words[1]), int(words[2])))
        elif verb == b'CLOSE':
            self.close(int(words[1]))
            self.ctl.send(b'OK')
            if not self.states:
                os._exit(0)

    def use_tree(self, number):
        """Puts this member's files in /tmp (a family shares one scratch mount)."""
        if self.owner == number:
            return
        if self.owner is not None and self.owner in self.states:
            self.trees[self.owner] = read_tree()
        clear_tree()
        write_tree(self.trees.pop(number, []), self.uid)
        self.owner = number

    def stored_bytes(self, but=None):
        return sum(tree_bytes(tree) for number, tree in self.trees.items() if number != but)

    def start_cell(self, number, seq, fds):
        try:
            if number not in self.states or self.cell is not None:
                self.ctl.send(b'END %d lost %s' % (seq, b'no-state' if number not in self.states else b'cell-running'))
                return
            pid, sock = self.states[number]
            count = threads(pid)
            if count != 1:
                # A state runs nothing between cells: a thread it started after the check at the
                # hand-off (a signal handler, a timer) would run on beside every later cell.
                self.kill(pid)
                self.lose(number)
                self.ctl.send(b'END %d lost state-threads-%d' % (seq, count))
                return
            self.use_tree(number)
            self.cell = {
                'number': number,
                'seq': seq,
                'pid': 0,
                'ended': False,
                'lost': False,
                'candidate': 0,
                'backup': read_tree(),
            }
            try:
                socket.send_fds(sock, [b'CELL %d' % seq], fds)
            except OSError:
                self.lose(number, b'state-unreachable')
        finally:
            for fd in fds:
                os.close(fd)

    def from_state(self, sock):
        number = next((n for n, s in self.states.items() if s[1] is sock), None)
        message, fds, sender = receive(sock)
        for fd in fds:  # nothing a state or a cell sends carries descriptors
            os.close(fd)
        if number is None:
            return
        if not message:
            # Every holder of the socket closed it: the state is gone.
            self.kill(self.states[number][0])
            self.lose(number, b'state-socket-closed')
            return
        words = message.split()
        try:
            verb, seq, values = words[0], int(words[1]), [int(w) for w in words[2:]]
        except (IndexError, ValueError):
            return
        state = self.states[number][0]
        protected = self.state_pids() | {1}
        if verb == b'STATE':
            # From the state's short-lived middle process (fork): the copy, reparented to the init
            # when the middle exits. The sweep after the fork leaves it as the only new process.
            if values and values[0] not in protected and sender not in protected and parent(values[0]) in (sender, 1):
                self.forked = values[0]
            return
        cell = self.cell
        if cell is None or cell['number'] != number or seq != cell['seq'] or not values:
            return  # late news of an earlier cell
        if verb == b'FORKED':
            if sender == state and values[0] not in protected and parent(values[0]) == state:
                cell['pid'] = values[0]
            return
        if cell['ended']:
            return
        if verb == b'DONE' and len(values) == 2:
            # The cell may speak before its state said it forked it: the state's only child is it.
            if not cell['pid'] and sender not in protected and parent(sender) == state:
                cell['pid'] = sender
            if not sender or sender != cell['pid']:
                return  # a process of the cell's, not the cell: not its word to give
            cell['ended'] = True
            cell['candidate'] = values[1] if self.successor(cell, values[1]) else 0
            self.ctl.send(b'END %d %d %d' % (seq, values[0], cell['candidate']))
        elif verb == b'EXIT' and sender == state:
            cell['ended'] = True
            cell['candidate'] = 0
            self.ctl.send(b'END %d %d 0' % (seq, values[0]))

    def successor(self, cell, candidate):
        """Whether `candidate` may hold the session after this cell: the cell itself, or a live child
        of it with one thread (the fork from its main thread; the cell waits, so its children stay
        its own until the sweep). A daemon the cell left (reparented to the init), a state, another
        member's process: refused."""
        if not candidate or candidate in self.state_pids() or candidate == 1 or not cell['pid']:
            return False
        if candidate == cell['pid']:
            return alive(candidate)
        return alive(candidate) and parent(candidate) == cell['pid'] and threads(candidate) == 1

    def finish_cell(self, commit):
        cell, self.cell = self.cell, None
        if cell is None:
            self.ctl.send(b'DONE 1 1')
            return
        number = cell['number']
        candidate = cell['candidate']
        why = b''
        if commit and candidate and number in self.states:
            if not self.successor(cell, candidate):
                commit = False
            elif dir_bytes() + self.stored_bytes(but=number) > family_files_bytes():
                commit, why = False, b' FILES'
        rolled_back = True
        if number in self.states:
            if commit and candidate:
                old = self.states[number][0]
                self.states[number][0] = candidate
                if old != candidate:
                    self.kill(old)
                rolled_back = False
            elif candidate and candidate != self.states[number][0]:
                self.kill(candidate)
        if not self.sweep():
            self.ctl.send(b'DONE 1 1 SWEEP')
            os._exit(1)  # PID 1 of the namespace: everything in it goes along
        if rolled_back and number in self.states:
            clear_tree()
            write_tree(cell['backup'], self.uid)
        self.ctl.send(b'DONE %d %d%s' % (int(rolled_back), int(number not in self.states), why))

    def sweep(self):
        """Kills every process of the namespace but the init and the states: what a cell left running
        (children, daemons, the cell itself when it was stopped) never reaches the next cell. False
        when processes are still there after SWEEP_ROUNDS rounds: the family is then given up."""
        keep = self.state_pids() | {1}
        for _ in range(SWEEP_ROUNDS):
            killed = 0
            for name in os.listdir('/proc'):
                if not name.isdigit():
                    continue
                pid = int(name)
                if pid in keep:
                    continue
                try:
                    with open(f'/proc/{pid}/stat', 'rb') as f:
                        state = f.read().rsplit(b')', 1)[1].split()[0]
                except OSError:
                    continue
                if state in (b'Z', b'X'):
                    continue
                self.kill(pid)
                killed += 1
            self.reap()
            keep = self.state_pids() | {1}
            if not killed:
                return True
            time.sleep(0.001)
        return False

    def fork(self, source, number):
        if source not in self.states or number in self.states or self.cell is not None:
            return b'LOST'
        in_tmp = dir_bytes() if self.owner is not None else 0
        size = in_tmp if self.owner == source else tree_bytes(self.trees.get(source, []))
        if size + in_tmp + self.stored_bytes() > family_files_bytes():
            return b'FILES'
        pid, sock = self.states[source]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.forked = 0
        try:
            socket.send_fds(sock, [b'FORK 0'], [theirs.fileno()])
        except OSError:
            return b'LOST'
        finally:
            theirs.close()
        # The state answers with the copy's pid; nothing else runs in the family meanwhile.
        end = time.perf_counter() + CTL_WAIT
        while not self.forked and time.perf_counter() < end:
            ready, _, _ = select.select([sock, self.wake], [], [], end - time.perf_counter())
            if self.wake in ready:
                self.reap()
            if sock in ready:
                self.from_state(sock)
            if source not in self.states:
                break
        if not self.forked:
            mine.close()
            return b'LOST' if self.sweep() else self.give_up()
        self.states[number] = [self.forked, mine]
        self.trees[number] = read_tree() if self.owner == source else list(self.trees.get(source, []))
        # The copy is the new member's only process: whatever else the fork left (the middle, or
        # processes a state made up) goes now.
        return b'OK' if self.sweep() else self.give_up()

    def give_up(self):
        self.ctl.send(b'SWEEP')
        os._exit(1)

    def close(self, number):
        if number not in self.states:
            return
        pid, sock = self.states.pop(number)
        sock.close()
        self.kill(pid)
        self.trees.pop(number, None)
        if self.owner == number:
            clear_tree()
            self.owner = None


# struct seccomp_notif: id, pid, flags, then struct seccomp_data (nr, arch, ip, args[6]).
NOTIF = struct.Struct('<QIIiIQ')
NOTIF_SIZE = NOTIF.size + 48
# struct seccomp_notif_resp: id, val, error, flags.
NOTIF_RESP = struct.Struct('<QqiI')
NOTIF_RECV = 0xC0000000 | (NOTIF_SIZE << 16) | (ord('!') << 8) | 0
NOTIF_SEND = 0xC0000000 | (NOTIF_RESP.size << 16) | (ord('!') << 8) | 1
NOTIF_CONTINUE = 1


def receive(sock):
    """One message from a state's socket with its descriptors and the pid of the process that sent it
    (0 when the kernel gave none): (message, fds, pid)."""
    try:
        message, ancillary, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(8 * 4) + socket.CMSG_SPACE(12))
    except OSError:
        return b'', [], 0
    fds, sender = [], 0
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_RIGHTS:
            fds += list(struct.unpack(f'{len(data) // 4}i', data[: len(data) // 4 * 4]))
        elif kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            sender = struct.unpack_from('3i', data)[0]
    return message, fds, sender


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            return f.read().rsplit(b')', 1)[1].split()
    except OSError:
        return None


def parent(pid):
    fields = stat_fields(pid)
    return int(fields[1]) if fields else 0


def threads(pid):
    fields = stat_fields(pid)
    return int(fields[17]) if fields else 0


def tree_bytes(entries):
    """What a working directory costs the init to keep: names, contents, link targets."""
    return sum(len(name) + len(data) + 64 for name, _, _, data in entries)


def dir_bytes(root='/tmp'):
    """tree_bytes of the working directory, from its entries' sizes (nothing read)."""
    total = 0
    for path, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(path, name)
            total += len(os.path.relpath(full, root)) + 64
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if name in files:
                total += len(os.readlink(full)) if os.path.islink(full) else st.st_size
    return total


def alive(pid):
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in (b'Z', b'X')


# ---- inside the family: states and cells ----------------------------------------------------------


def first_state(sock, uid):
    """Session state number one: a fresh __main__, unprivileged like a stateless call."""
    # The process limit stays the executor's (nproc + FAMILY_MAX): a family's states count against
    # its uid's limit too.
    for which, value in CALL_LIMITS:
        if which != resource.RLIMIT_NPROC:
            resource.setrlimit(which, (value, value))
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 'no_new_privs')
    if SECCOMP_CALL is not None:
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SECCOMP_CALL[1]), 0, 0), 'seccomp')
    install_guard(sock)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    main_module = fresh_main()
    sys.modules['__main__'] = main_module
    sys.path.insert(0, '')
    reset_sympy_counters()  # a session starts as a fresh interpreter; its cells then count on
    become_state(sock, main_module.__dict__)


def become_state(sock, scope):
    """The first state: settles, then waits for work."""
    settle_state()
    state_loop(sock, scope)


def settle_state():
    """This process now holds the session: its own process group, not dumpable (no other process of
    the family may read or write its memory), no descriptors of a cell."""
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # a session leader (a cell that became the state) already leads its group


PR_SET_DUMPABLE = 4
_recv_fds = socket.recv_fds
_fork = os.fork
_waitpid = os.waitpid


def state_loop(sock, scope):
    """A state's loop. A process that becomes the state (a cell, its snapshot, a fork's copy) goes on
    in this same loop, with no new frame: a session of any number of cells holds a stack of one."""
    send = sock.send
    while True:
        try:
            message, fds, _, _ = _recv_fds(sock, 256, 8)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)  # the init is gone
        # A cell that became this state may have left children: the init killed them, their
        # zombies are this process's to collect (they count against the family's process limit).
        try:
            while _waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        words = message.split()
        if words[0] == b'CELL' and len(fds) == 4:
            seq = int(words[1])
            pid = _fork()
            if pid == 0:
                cell_main(sock, fds, seq, scope)  # returns only in the process that is now the state
                settle_state()
                continue
            for fd in fds:
                os.close(fd)
            send(b'FORKED %d %d' % (seq, pid))
            _, status = _waitpid(pid, 0)
            send(b'EXIT %d %d' % (seq, os.waitstatus_to_exitcode(status)))
        elif words[0] == b'FORK' and len(fds) == 1:
            # Through a short-lived middle process, so the copy's parent is the init (which reaps
            # it) and not this state (which does not reap while it waits).
            middle = _fork()
            if middle == 0:
                copy = _fork()
                if copy == 0:
                    os.setpgid(0, 0)
                    sock.close()  # the source's socket: its messages are not the copy's
                    sock = socket.socket(fileno=fds[0])
                    send = sock.send
                    continue
                send(b'STATE 0 %d' % copy)
                os._exit(0)
            os.close(fds[0])
            _waitpid(middle, 0)
        else:
            for fd in fds:
                os.close(fd)


def guard_program():
    """The state guard, installed once by the first state and inherited by every later state and
    cell of the family (it depends on no pid, so it never has to be added again: a filter per cell
    would slow every syscall down cell after cell, and the kernel refuses a process's filters past
    ~32k instructions). A signal, rlimit change or pidfd aimed at another process goes to the init
    (seccomp user notification), which refuses it when the target is a state or the init (Init.judge);
    aimed at itself (0) it passes. Refused outright: reading or writing another process's memory,
    signals through pidfds (a /proc/PID directory is one too), taking a pidfd's descriptors, memfds
    (shared memory that no address-space limit counts, and that a state could pile up), and clone
    with CLONE_PARENT (a process that would pass for a child of the state or of the cell)."""
    LD_W_ABS, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
    ALLOW, DENY, NOTIFY = 0x7FFF0000, 0x00050000 | 1, 0x7FC00000  # SECCOMP_RET_ERRNO | EPERM
    # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open, prlimit64: first argument a pid
    checked = (62, 200, 234, 129, 297, 434, 302)
    # process_vm_readv, process_vm_writev, pidfd_send_signal, pidfd_getfd, memfd_create, memfd_secret
    denied = (310, 311, 424, 438, 319, 447)
    CLONE, CLONE_PARENT = 56, 0x00008000
    prog = [(LD_W_ABS, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, ALLOW), (LD_W_ABS, 0, 0, 0)]
    ask_at = 4 + len(checked) + len(denied) + 2  # after the list and its fall-through ALLOW
    clone_at = ask_at + 4
    deny_at = clone_at + 4
    for nr in checked:
        prog.append((JEQ, ask_at - len(prog) - 1, 0, nr))
    for nr in denied:
        prog.append((JEQ, deny_at - len(prog) - 1, 0, nr))
    prog.append((JEQ, clone_at - len(prog) - 1, 0, CLONE))
    prog.append((RET, 0, 0, ALLOW))
    assert len(prog) == ask_at
    prog.append((LD_W_ABS, 0, 0, 16))  # ask_at: args[0], low 32 bits: the target
    prog.append((JEQ, 0, 1, 0))  # 0: the caller itself (its own process group)
    prog.append((RET, 0, 0, ALLOW))
    prog.append((RET, 0, 0, NOTIFY))
    assert len(prog) == clone_at
    prog.append((LD_W_ABS, 0, 0, 16))  # clone_at: the flags
    prog.append((JSET, 0, 1, CLONE_PARENT))
    prog.append((RET, 0, 0, DENY))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((RET, 0, 0, DENY))  # deny_at
    assert len(prog) == deny_at + 1
    return prog


SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 317, 1, 8


def install_guard(sock):
    """Installs the state guard and hands its notifications to the init ('GUARD 0' with the
    listener, or without one where there is no filter)."""
    if not X86_64:
        sock.send(b'GUARD 0')
        return
    prog = guard_program()
    array = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), array)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    listener = syscall(
        ctypes.c_long(SYS_SECCOMP),
        ctypes.c_long(SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(SECCOMP_FILTER_FLAG_NEW_LISTENER),
        ctypes.byref(fprog),
    )
    if listener < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f'state guard: {os.strerror(errno)}')
    socket.send_fds(sock, [b'GUARD 0'], [listener])
    os.close(listener)


def cell_main(sock, fds, seq, scope):
    """One cell, in a process forked from the state: runs the code in the session's scope, then
    either becomes the new state or leaves a snapshot of itself as the new state. Returns only in the
    process that holds the state from now on (the caller, state_loop, goes on in it)."""
    status = 125
    try:
        stdin_fd, out_w, err_w, req_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        chunks = []
        while True:
            chunk = os.read(req_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        limits, mode, code = b''.join(chunks).split(b'\n', 2)
        timeout, deadline = (float(x) for x in limits.split())
        os.setsid()
        set_cpu_limit(timeout)
        reset_streams()
        signal.signal(TIME_UP, flush_and_exit)
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.perf_counter(), 1e-6))
        status = run_cell(code.decode('utf-8', 'surrogatepass'), mode.decode(), scope, exit_funcs=False)
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        if status == 125:
            flush_streams()
            os._exit(125)
        status = 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(TIME_UP, signal.SIG_DFL)
    flush_streams()
    alone = thread_count() == 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # A cell with no other thread and CPU time to spare under its (inherited, unraisable) CPU limit
    # becomes the state itself; otherwise a fork from this thread holds the state.
    if alone and usage.ru_utime + usage.ru_stime < 1.0:
        candidate = os.getpid()
    else:
        try:
            candidate = _fork()
        except OSError:
            os._exit(status)
        if candidate == 0:
            return  # the snapshot: state_loop goes on in it
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:
        sock.send(b'DONE %d %d %d' % (seq, status & 0xFF if status >= 0 else 1, candidate))
    except OSError:
        os._exit(status)
    if candidate == os.getpid():
        return
    # The snapshot is this process's child only while it lives: it waits for the sweep, so the init
    # can check that parentage when it takes the snapshot as the state.
    while True:
        time.sleep(3600)
