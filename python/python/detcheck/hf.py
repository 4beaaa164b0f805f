"""``detcheck.hf.DetcheckCallback``: record a Hugging Face ``transformers.Trainer`` job with
``detcheck.torch.watch``, without touching its training loop::

    from detcheck.hf import DetcheckCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[DetcheckCallback()])
    trainer.train()

At ``on_train_begin`` the callback opens the launch's writer (``TraceWriter.from_env()``, or the
one it is given; outside detcheck there is none and nothing is recorded), and watches the model
and the optimizer the Trainer hands it (accelerate's ``AcceleratedOptimizer``: ``watch`` hooks the
torch optimizer inside). Steps are the Trainer's optimizer steps: one detcheck step per update,
however many micro-batches ``gradient_accumulation_steps`` gathers into it (their forward records
are told apart by occurrence), numbered from ``state.global_step`` (a resumed run goes on with
its numbers). The loss: a record ``loss`` for every micro-batch, just after the model's outputs
(the ``loss`` field of the model's output, which ``watch`` also records as ``fwd/(model).loss``;
a model without one records none). At ``on_train_end`` the hooks are removed and the writer it
opened is closed; a job that dies leaves no trace that reads as complete (the writer's file is
only renamed when closed).

Replicated records follow ``watch``'s rule (DistributedDataParallel and more than one rank), or
``replicated=`` when given.
"""

from transformers import TrainerCallback

from ._callbacks import TrainingRecording

__all__ = ["DetcheckCallback"]


class DetcheckCallback(TrainerCallback):
    """A ``TrainerCallback`` that records the job with ``detcheck.torch.watch`` (module doc).

    ``writer``: a ``detcheck.TraceWriter`` (default: ``TraceWriter.from_env()`` at the start of
    training, closed at its end). ``replicated``: as ``watch``'s.
    """

    def __init__(self, writer=None, *, replicated=None):
        self.recording = TrainingRecording(writer, replicated)

    @property
    def writer(self):
        return self.recording.writer

    @property
    def handle(self):
        return self.recording.handle

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.recording.start(model, optimizer, state.global_step, loss=True)

    def on_train_end(self, args, state, control, **kwargs):
        self.recording.stop()
