# The warm runner of *trusted* code: rstar's own generated programs (the SFT curriculum's), never a
# model's. One interpreter runs every call in-process, with the sandbox's cell semantics (cell.py:
# notebook or script mode, the one-line error text, the exit status, atexit) and the call's stdin,
# stdout and stderr on fds 0-2, as a sandboxed child has them. No fork and no isolation: on VMs
# where a fork costs ~15-20 ms of CPU, the sandbox spends a minute on the curriculum's ~5,000
# one-millisecond programs; here they take seconds. Untrusted code goes to sandbox-serve.
#
#   python -I warm.py     (started by src/sft/tool-runner.ts: warmRunner)
#
# Protocol: one JSON request per line on fd 3, {"code", "input", "mode", "timeout", "keep"}; one
# JSON answer per line on fd 4, {"exit", "cost", "timed_out", "stdout", "stderr"}, the outputs the
# first `keep` bytes, base64 (Node decodes them as the sandbox's are). fd 2 at start (the runner's
# own errors) is kept as fd 5 while calls use fds 0-2.
import base64
import builtins
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cell  # noqa: E402

del sys.path[0]

REQUESTS, ANSWERS, LOG = 3, 4, 5


class TimeUp(BaseException):
    """Raised into the call at its limit; a BaseException, so the call's own `except Exception`
    does not swallow it (the sandbox kills such a call)."""


def time_up(*_):
    raise TimeUp


def redirect(fd, data=b''):
    """A fresh memory file on `fd` holding `data` (stdin) or nothing (stdout, stderr)."""
    memfd = os.memfd_create('rstar-warm-call')
    if data:
        os.write(memfd, data)
        os.lseek(memfd, 0, os.SEEK_SET)
    if memfd != fd:  # a call that closed fd 0-2 (open(0) does) frees it for the memfd itself
        os.dup2(memfd, fd)
        os.close(memfd)


def captured(fd, keep):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], keep
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return base64.b64encode(b''.join(chunks)).decode()


def run(req, scratch, own_main):
    os.chdir(scratch)
    redirect(0, req.get('input', '').encode('utf-8', 'surrogatepass'))
    redirect(1)
    redirect(2)
    # As a sandboxed call has them (zygote.py: std_streams).
    sys.stdin = open(0, 'r', encoding='utf-8', errors='replace', closefd=False)
    sys.stdout = open(1, 'w', encoding='utf-8', errors='backslashreplace', closefd=False)
    sys.stderr = open(2, 'w', encoding='utf-8', errors='backslashreplace', buffering=1, closefd=False)
    main = type(sys)('__main__')
    main.__builtins__ = builtins
    sys.modules['__main__'] = main
    timed_out = False
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, max(float(req.get('timeout', 10)), 1e-3))
    try:
        status = cell.run_cell(req['code'], req.get('mode'), main.__dict__)
    except TimeUp:
        timed_out, status = True, 124
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    cost = time.perf_counter() - started
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    sys.modules['__main__'] = own_main
    keep = int(req.get('keep', 4004))
    return {
        'exit': status,
        'cost': cost,
        'timed_out': timed_out,
        'stdout': captured(1, keep),
        'stderr': captured(2, keep),
    }


def main():
    os.dup2(2, LOG)
    signal.signal(signal.SIGALRM, time_up)
    scratch = tempfile.mkdtemp(prefix='rstar-warm-')
    own_main = sys.modules['__main__']
    requests = os.fdopen(REQUESTS, 'rb')
    try:
        for line in requests:
            if not line.strip():
                continue
            answer = json.dumps(run(json.loads(line), scratch, own_main)) + '\n'
            data = answer.encode()
            while data:
                data = data[os.write(ANSWERS, data) :]
    finally:
        os.chdir('/')
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
    try:
        main()
    except BaseException as error:  # the runner's own failure, on its log: Node reports it
        os.write(LOG, f'warm runner: {type(error).__name__}: {error}\n'.encode())
        sys.exit(1)
