"""
Training without torch.optim through torch.func: a functional training loop.

Style imitated: the torch.func tutorials and the JAX-style loops written on them: the
parameters are taken out of the module into a dict once (``named_parameters()``, detached),
the loss is a pure function of that dict through ``functional_call``, ``grad_and_value`` gives
the gradients as a dict of the same keys, and the update is hand-written SGD with momentum that
builds a new dict every step (no ``.backward()``, no ``.grad``, no optimizer). Evaluation runs
``functional_call`` under ``torch.no_grad()`` every ``--eval_every`` steps.

Run by hand:

    python func_train.py
    python func_train.py --steps 30 --lr 0.05
    python func_train.py --device cuda

It prints one final line with the last loss and the sum of the parameters at full precision.

Planted-bug flag:

    --seed_from_clock   seed torch from the clock before the model is built
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value


class MLP(nn.Module):
    def __init__(self, features=16, hidden=64, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def make_data(n, features, classes, seed):
    """Points labelled by which of ``classes`` fixed directions they are closest to."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g)
    x = torch.randn(n, features, generator=g)
    y = (x @ centers.T).argmax(dim=1)
    return x, y


def main():
    parser = argparse.ArgumentParser(description="a torch.func training loop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--eval_every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed_from_clock", action="store_true", help="planted bug")
    args = parser.parse_args()
    device = torch.device(args.device)

    if args.seed_from_clock:
        torch.manual_seed(time.time_ns() % 2**63)  # PLANTED BUG
    else:
        torch.manual_seed(args.seed)
    model = MLP().to(device)
    params = {name: p.detach() for name, p in model.named_parameters()}
    velocity = {name: torch.zeros_like(p) for name, p in params.items()}

    def compute_loss(params, x, y):
        logits = functional_call(model, params, (x,))
        return F.cross_entropy(logits, y)

    loss_and_grads = grad_and_value(compute_loss)

    n_train = args.steps * args.batch_size
    x_all, y_all = make_data(n_train + 256, 16, 4, seed=1234)
    x_train, y_train = x_all[:n_train], y_all[:n_train]
    x_val, y_val = x_all[n_train:].to(device), y_all[n_train:].to(device)
    loss = None
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        x, y = x_train[batch].to(device), y_train[batch].to(device)
        grads, loss = loss_and_grads(params, x, y)
        velocity = {k: args.momentum * velocity[k] + grads[k] for k in params}
        params = {k: params[k] - args.lr * velocity[k] for k in params}
        if (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                logits = functional_call(model, params, (x_val,))
                accuracy = (logits.argmax(dim=1) == y_val).float().mean().item()
            print(f"step {step}: loss {loss.item():.4f} val accuracy {accuracy:.3f}")

    total = sum(p.double().sum().item() for p in params.values())
    print(f"final loss {loss.item()!r} param_sum {total!r}")


if __name__ == "__main__":
    main()
