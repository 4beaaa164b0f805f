"""What detcheck's training-framework callbacks share (``detcheck.hf``, ``detcheck.lightning``):
``TrainingRecording``, the writer and ``watch``'s handle while training runs.

Determinism: ``watch``'s; the callbacks only say when training starts and ends.
"""

from ._torch.tensors import host
from .torch import _watch

__all__ = ["TrainingRecording"]


class TrainingRecording:
    """What a framework callback holds while training runs: the writer (the one given, or the
    launch's ``TraceWriter.from_env()``, opened when training starts and closed when it ends),
    ``watch``'s handle, and any hook the callback adds (removed at the end)."""

    def __init__(self, writer=None, replicated=None):
        self._given = writer
        self._replicated = replicated
        self._hooks = []
        #: The writer while training runs (``None`` outside detcheck).
        self.writer = None
        #: ``watch``'s handle while training runs.
        self.handle = None

    def start(self, model, optimizer, step, loss=False):
        """Opens the writer and watches ``model`` and ``optimizer`` from step ``step``;
        ``loss``: also the ``loss`` the model's output carries, each forward."""
        from ._detcheck import TraceWriter

        self.writer = self._given if self._given is not None else TraceWriter.from_env()
        self.handle = _watch(
            model, self.writer, optimizer, replicated=self._replicated, start_step=step, loss=loss
        )

    def add_hook(self, hook):
        """A hook the callback registered, removed by ``stop``."""
        self._hooks.append(hook)

    def record_loss(self, step, loss):
        """Records ``loss`` (a tensor, or ``None``: nothing) as ``loss`` at ``step``."""
        if self.writer is not None and loss is not None:
            self.writer.record(step, "loss", host(loss.detach()))

    def stop(self):
        """Removes the hooks; closes the writer it opened (a given one stays open)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self.writer is not None and self._given is None:
            self.writer.close()
        self.writer = None
