"""Entry point: `python src/backend/run.py init|train|serve ...` (also a torchrun script)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("init", "train", "serve"):
        sys.stderr.write("usage: run.py init|train|serve [options]\n")
        return 2
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "init":
        from rstar_backend.init import main as run
    elif cmd == "train":
        from rstar_backend.train import main as run
    else:
        from rstar_backend.engine import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
