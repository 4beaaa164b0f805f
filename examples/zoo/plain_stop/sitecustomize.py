"""Ends a zoo program's plain run after ``ZOO_PLAIN_STEPS`` optimizer steps (examples/zoo/zoo.py,
the manifest's ``plain_steps``): a plain run of the steps its check stops at, for a program that
takes no flag that stops it there and prints no line at that step. zoo.py puts this folder first
on ``PYTHONPATH`` for the plain run only.

What it adds to the program is torch's global optimizer-step post-hook, registered when
``torch.optim.optimizer`` is first imported (nothing is imported early): it counts the steps of
every torch optimizer of the process and, at the last, exits at once with status 0, as detcheck
ends a checked run at ``--steps``. A wrapper (Fabric's, accelerate's) steps the torch optimizer
it holds, and each step is counted once (checked: 3 calls of the hook for 3 steps of each).
"""

import importlib.abc
import importlib.machinery
import os
import sys

STEPS = int(os.environ.get("ZOO_PLAIN_STEPS") or 0)
_taken = [0]


def _count(optimizer, args, kwargs):
    _taken[0] += 1
    if _taken[0] >= STEPS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _AfterOptimizerModule(importlib.abc.MetaPathFinder):
    """Registers ``_count`` once ``torch.optim.optimizer`` has been executed."""

    def find_spec(self, name, path, target=None):
        if name != "torch.optim.optimizer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_then_register(module):
            run(module)
            module.register_optimizer_step_post_hook(_count)

        spec.loader.exec_module = run_then_register
        return spec


if STEPS > 0:
    sys.meta_path.insert(0, _AfterOptimizerModule())
