"""Arrival order in a rank that detcheck launched: point-to-point messages that a receive from
any source takes in the order they arrive (docs/causes.md, "a collective or reduction order").

- **The perturbation.** Each rank waits before its first ``torch.distributed.send`` or
  ``isend`` for its slot of the launch (``detcheck::launch::Launch::first_send_delay``: the rank
  rotated by the launch number, up to 100 ms a slot): the first messages of the ranks arrive
  in another order in every run of a check, and in the same order in a re-run of one launch.
  A program whose result follows the arrival order (a sum in the order ``dist.recv(t)`` without
  ``src`` returns the senders) differs between the two runs every time, not by luck.
- **The evidence.** The first receive from any source (``recv``/``irecv`` without ``src`` or
  ``group_src``) is noted with the program's line, as the fact ``site:any_source``
  (``_core.evidence.fact``), which the recorder writes to the trace's environment, where the cause
  of a divergence is decided.

Main type: none; one process-wide state (whether the rank has sent). Determinism: the wait is
a function of the launch and the rank. Limits: only the first send of a run waits (later ones
follow the program's own timing, so an arrival-order bug is exposed at its first use);
``batch_isend_irecv`` and collectives are not delayed (a collective's result does not depend on
when ranks enter it); the wrappers are in place for the module attributes a program calls
(``dist.send``), not for names it imported before the hook.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from .._core import evidence as _evidence

__all__ = ["install"]

_installed = False


def _outside_compiled_graphs(fn: Any) -> Any:
    from .._torch.tensors import _outside_compiled_graphs as disable

    return disable(fn)


def install(distributed: Any, delay: float) -> None:
    """Wraps ``distributed``'s point-to-point calls: the first send waits ``delay`` seconds,
    a receive from any source notes its line. Installed once; never raises into the program."""
    global _installed
    if _installed:
        return
    _installed = True
    waited = [delay <= 0]

    def sending(send: Any) -> Any:
        @functools.wraps(send)
        def send_in_slot(*args: Any, **kwargs: Any) -> Any:
            if not waited[0]:
                waited[0] = True
                time.sleep(delay)
            return send(*args, **kwargs)

        return _outside_compiled_graphs(send_in_slot)

    def receiving(recv: Any) -> Any:
        @functools.wraps(recv)
        def recv_noted(*args: Any, **kwargs: Any) -> Any:
            src = kwargs.get("src", args[1] if len(args) > 1 else None)
            group_src = kwargs.get("group_src", args[4] if len(args) > 4 else None)
            if src is None and group_src is None:
                try:
                    _evidence.fact("site:any_source", _evidence.site(sys._getframe(1)) or "?")
                except Exception:
                    pass
            return recv(*args, **kwargs)

        return _outside_compiled_graphs(recv_noted)

    distributed.send = sending(distributed.send)
    distributed.isend = sending(distributed.isend)
    distributed.recv = receiving(distributed.recv)
    distributed.irecv = receiving(distributed.irecv)
