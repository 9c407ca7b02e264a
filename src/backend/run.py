"""Entry point: `python src/backend/run.py init|train|serve|merge ...` (also a torchrun script)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def reuse_freed_memory():
    """Keeps freed memory in the process for the next allocation of its size.

    glibc hands blocks over 128 KiB back to the kernel when they are freed and maps fresh pages on
    the next allocation; a training step or a decode step allocates and frees the same activations,
    logits and gradients every time, so each step paid a page fault per 4 KiB of them. On a 2-core
    VM that was two thirds of an SFT step (0.44 -> 0.14 s for 760 tokens) and 30x the sampling of a
    decode batch. Blocks up to 32 MiB now come from the heap, and up to 1 GiB of free heap stays
    mapped. Set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ to choose otherwise."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: its own allocator decides
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)


def die_with_parent():
    """The kernel kills this process when the one that started it dies (SIGKILL by the OOM killer
    included), so a server never outlives its wrapper holding its port and its memory.

    RSTAR_PARENT_PID names that parent; it is taken out of the environment so nothing this process
    starts inherits it. A parent already gone before the request took effect: exit at once."""
    parent = os.environ.pop("RSTAR_PARENT_PID", None)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parent's own cleanup is all there is
        return
    if os.getppid() != int(parent):
        os._exit(1)


def quiet_until_serving():
    """SIGINT or SIGTERM before the server listens (while torch loads, or the checkpoint): exit at
    once and quietly. Nothing is held yet that the kernel does not release, and a KeyboardInterrupt
    raised inside an import prints a traceback. The server installs its own handlers once up."""
    import signal

    def leave(signum, frame):
        os._exit(0)

    signal.signal(signal.SIGINT, leave)
    signal.signal(signal.SIGTERM, leave)


def quiet_interrupt():
    """The trainer on Ctrl-C (a terminal sends it to the whole process group, the recipe prints the
    one line): exit 130 at once, no KeyboardInterrupt traceback. Safe at any moment: a checkpoint
    is renamed into place whole, and a rerun resumes after the last one."""
    import signal

    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("init", "train", "serve", "merge"):
        sys.stderr.write("usage: run.py init|train|serve|merge [options]\n")
        return 2
    cmd, argv = sys.argv[1], sys.argv[2:]
    reuse_freed_memory()
    if cmd == "init":
        from rstar_backend.init import main as run
    elif cmd == "merge":
        from rstar_backend.lora import main as run
    elif cmd == "train":
        quiet_interrupt()
        from rstar_backend.train import main as run
    else:
        die_with_parent()
        quiet_until_serving()
        from rstar_backend.engine import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
