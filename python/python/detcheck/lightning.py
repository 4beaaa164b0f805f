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
optimizer's closure, and ``watch`` records the gradients when it returns. The loss: a record
``loss`` for every batch, the loss ``training_step`` returned (a tensor, or a dict's ``loss``),
in the step the batch belongs to (after that step's parameters when the batch ended an update).
At ``on_train_end`` the hooks are removed and
the writer it opened is closed.
"""

import lightning.pytorch as pl

from ._callbacks import TrainingRecording

__all__ = ["DetcheckCallback"]


class DetcheckCallback(pl.Callback):
    """A Lightning ``Callback`` that records the job with ``detcheck.torch.watch`` (module doc).

    ``writer``: a ``detcheck.TraceWriter`` (default: ``TraceWriter.from_env()`` when training
    starts, closed when it ends). ``replicated``: as ``watch``'s.
    """

    def __init__(self, writer=None, *, replicated=None):
        super().__init__()
        self.recording = TrainingRecording(writer, replicated)
        self._batch_step = 0

    @property
    def writer(self):
        return self.recording.writer

    @property
    def handle(self):
        return self.recording.handle

    def on_train_start(self, trainer, pl_module):
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.recording.start(pl_module, optimizer, trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch_step = self.handle.current_step if self.handle is not None else 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # The batch's step: the one it started in, even when its update has ended it.
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.recording.record_loss(self._batch_step, loss)

    def on_train_end(self, trainer, pl_module):
        self.recording.stop()
