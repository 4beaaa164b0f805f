"""``detcheck.lightning.DetcheckCallback``: record a PyTorch Lightning job with
``detcheck.torch.watch``, without touching the ``LightningModule``::

    from detcheck.lightning import DetcheckCallback

    trainer = lightning.Trainer(max_steps=100, callbacks=[DetcheckCallback()])
    trainer.fit(module, data)

At ``on_train_start`` the callback opens the launch's writer (``TraceWriter.from_env()``, or the
one it is given; outside detcheck there is none and nothing is recorded) and watches the
``LightningModule`` and the trainer's first optimizer (``trainer.optimizers[0]``; a module with
several optimizers is recorded at the first one's updates: its other optimizers' updates are not
steps). Steps are optimizer steps: one detcheck step per update, whatever
``accumulate_grad_batches`` gathers into it, numbered from ``trainer.global_step`` (a resumed run
goes on with its numbers); with automatic optimization the forward and backward run inside the
optimizer's closure, and ``watch`` records the gradients when it returns. The loss ``training_step``
returns is the module's own business: record it from ``training_step`` with the writer
(``callback.writer``) if it is wanted as a record. At ``on_train_end`` the hooks are removed and
the writer it opened is closed.
"""

import lightning.pytorch as pl

from . import TraceWriter
from .torch import watch

__all__ = ["DetcheckCallback"]


class DetcheckCallback(pl.Callback):
    """A Lightning ``Callback`` that records the job with ``detcheck.torch.watch`` (module doc).

    ``writer``: a ``detcheck.TraceWriter`` (default: ``TraceWriter.from_env()`` when training
    starts, closed when it ends). ``replicated``: as ``watch``'s.
    """

    def __init__(self, writer=None, *, replicated=None):
        super().__init__()
        self._given = writer
        self._replicated = replicated
        self.writer = None
        self.handle = None

    def on_train_start(self, trainer, pl_module):
        self.writer = self._given if self._given is not None else TraceWriter.from_env()
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.handle = watch(
            pl_module, self.writer, optimizer, replicated=self._replicated,
            start_step=trainer.global_step,
        )

    def on_train_end(self, trainer, pl_module):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self.writer is not None and self._given is None:
            self.writer.close()
        self.writer = None
