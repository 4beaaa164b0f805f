"""A world of one for a program that creates a process group at one rank.

At one rank, detcheck's ``processes`` launcher runs a program as its user runs it by hand,
``python train.py``: without ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` or
``MASTER_PORT`` (a script that picks DDP by the presence of ``RANK`` takes its one-process
path, as it does by hand). A script that calls ``torch.distributed.init_process_group`` (or
``init_device_mesh``) anyway would fail there with "environment variable RANK expected"; so
``install`` wraps torch's ``env://`` rendezvous, which reads those variables when a process
group is created, and sets the missing ones first: rank 0 of a world of one, on a free
loopback port. Nothing else changes: a program that never creates a process group never sees
them.

Determinism: the port is whatever the OS hands out; no value of the program depends on it.
Limits: the ``env://`` init method only (the default); a ``tcp://`` or ``file://`` URL carries
its own rank and world size.
"""

import importlib
import os
import socket


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill():
    """Sets the variables of a world of one that are not set (also what ``_launch.startup`` gives a
    DeepSpeed program at one rank, as DeepSpeed's launcher would)."""
    defaults = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())


def install():
    """Wraps the ``env://`` rendezvous handler (a no-op where torch.distributed is missing)."""
    try:
        # The module: `torch.distributed.rendezvous` as an attribute is its function.
        rendezvous = importlib.import_module("torch.distributed.rendezvous")
    except Exception:
        return
    handlers = getattr(rendezvous, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None or getattr(original, "_detcheck_world_of_one", False):
        return

    def env_rendezvous_with_a_world_of_one(*args, **kwargs):
        fill()
        return original(*args, **kwargs)

    env_rendezvous_with_a_world_of_one._detcheck_world_of_one = True
    handlers["env"] = env_rendezvous_with_a_world_of_one
