"""A script that resumes from its snapshot when one exists, in the style of PyTorch's DDP
tutorial series, but keeps the snapshot at an absolute path (planted: `--snapshot PATH`,
default /tmp/detcheck_causes/snapshot.pt): a check's second run resumes from what its first run
saved there. `--fixed` keeps the snapshot in the working directory, a relative path, which each
run of a check gets a private copy of. Expected cause: a file an earlier run left, named."""

import os
import sys

import torch
from torch import nn


def snapshot_path(argv):
    if "--fixed" in argv:
        return "snapshot.pt"
    if "--snapshot" in argv:
        return os.path.abspath(argv[argv.index("--snapshot") + 1])
    return "/tmp/detcheck_causes/snapshot.pt"


class Trainer:
    def __init__(self, model, optimizer, path):
        self.model, self.optimizer, self.path = model, optimizer, path
        self.epochs_run = 0
        if os.path.exists(path):
            print(f"resuming from the snapshot at {path}")
            snapshot = torch.load(path)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]

    def save(self, epoch):
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        torch.save({"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch + 1}, self.path)

    def train(self, data, target, epochs):
        for epoch in range(self.epochs_run, epochs):
            loss = (self.model(data) - target).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.save(epoch)  # every epoch (`save_every` = 1)
            print(f"epoch {epoch} loss {loss.item():.6f}")


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
data = torch.randn(64, 16)
target = data.sum(dim=1, keepdim=True)
trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), snapshot_path(sys.argv))
trainer.train(data, target, epochs=6)
