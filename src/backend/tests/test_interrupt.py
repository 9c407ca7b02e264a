"""run.py train on Ctrl-C (a terminal's SIGINT reaches every process of the group): exit 130 at once
and quietly. Catches: a KeyboardInterrupt traceback in the recipe's log on every Ctrl-C."""

import json
import os
import signal
import subprocess
import sys

from common import BACKEND, SETTINGS, TempDirCase, random_records

RUN_PY = os.path.join(BACKEND, "run.py")


class Interrupt(TempDirCase):
    def test_ctrl_c_while_waiting_for_a_batch_exits_130_without_a_traceback(self):
        model = self.checkpoint()
        config = {**SETTINGS, "model": model, "out": self.path("step-{step}")}
        proc = subprocess.Popen([sys.executable, RUN_PY, "train", "--config", json.dumps(config)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"})
        try:
            for r in random_records(2, 3, 4, seed=1):
                proc.stdin.write(json.dumps(r) + "\n")
            proc.stdin.write(json.dumps({"end_batch": True}) + "\n")
            proc.stdin.flush()
            step = proc.stdout.readline()  # trained a step: now blocked reading the next batch
            self.assertIn('"step": 1', step)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        self.assertEqual(proc.returncode, 130, err)
        self.assertNotIn("Traceback", err)
        self.assertNotIn("KeyboardInterrupt", err)
