"""
Multi-process DDP training with snapshots, in the style of the PyTorch
"DDP tutorial series" torchrun script.

Style imitated: a ``Trainer`` class holding the model, a DataLoader with a
``DistributedSampler``, the optimizer, ``save_every`` and ``snapshot_path``;
``ddp_setup()`` always calls ``init_process_group`` and reads ``LOCAL_RANK``
from the environment set by torchrun; if a snapshot file exists at start-up the
trainer resumes from it (model state and number of epochs run); rank 0 writes a
snapshot every ``save_every`` epochs; ``sampler.set_epoch(epoch)`` each epoch.

The snapshot goes to ``snapshot.pt`` in the current working directory by
default, so a second run started in the same directory resumes from the first
run's snapshot (as the tutorial intends). Start each run in a fresh directory,
or delete the snapshot, to train from scratch.

Run by hand (torchrun sets RANK / LOCAL_RANK / WORLD_SIZE):

    torchrun --standalone --nproc-per-node=2 ddp_snapshot.py
    torchrun --standalone --nproc-per-node=2 ddp_snapshot.py 6 2 --batch_size 4
    torchrun --standalone --nproc-per-node=2 ddp_snapshot.py --device cuda

Positional arguments: total_epochs (default 4), save_every (default 2).
Every rank prints one final line with its last loss and the parameter sum.

Planted-bug flag:

    --reseed_from_clock   seed torch from the clock right before the model is
                          built, so every run starts from different weights
"""

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticRegression(Dataset):
    """A fixed random regression problem, identical on every rank."""

    def __init__(self, size, in_dim=20, out_dim=1, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, in_dim, generator=g)
        w = torch.randn(in_dim, out_dim, generator=g)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(size, out_dim, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def ddp_setup(device):
    local_rank = int(os.environ["LOCAL_RANK"])
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        init_process_group(backend="nccl")
    else:
        init_process_group(backend="gloo")
    return local_rank


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        device: str,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}") if device == "cuda" else torch.device("cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.last_loss = None
        if os.path.exists(snapshot_path):
            print(f"[rank {self.global_rank}] Loading snapshot")
            self._load_snapshot(snapshot_path)

        if self.device.type == "cuda":
            self.model = DDP(self.model, device_ids=[self.local_rank])
        else:
            self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[rank {self.global_rank}] Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        self.last_loss = loss.detach()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[rank {self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.device)
            targets = targets.to(self.device)
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs(args):
    train_set = SyntheticRegression(48, seed=args.data_seed)
    if args.reseed_from_clock:
        torch.manual_seed(time.time_ns() % 2**63)  # PLANTED BUG: fresh weights every run
    model = nn.Sequential(
        nn.Linear(20, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=torch.cuda.is_available(),
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(args):
    ddp_setup(args.device)
    torch.manual_seed(args.seed)
    dataset, model, optimizer = load_train_objs(args)
    train_data = prepare_dataloader(dataset, args.batch_size)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot_path, args.device)
    trainer.train(args.total_epochs)

    params = trainer.model.module.parameters()
    param_sum = sum(p.detach().double().sum().item() for p in params)
    last = trainer.last_loss.item() if trainer.last_loss is not None else float("nan")
    print(f"rank {trainer.global_rank} final loss {last!r} param_sum {param_sum!r}")
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", nargs="?", default=4, type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", nargs="?", default=2, type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=8, type=int, help="Input batch size on each device (default: 8)")
    parser.add_argument("--lr", default=1e-2, type=float)
    parser.add_argument("--seed", default=0, type=int)
    parser.add_argument("--data_seed", default=1234, type=int)
    parser.add_argument("--snapshot_path", default="snapshot.pt")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--reseed_from_clock", action="store_true", help="planted bug: seed from the clock")
    args = parser.parse_args()
    main(args)
