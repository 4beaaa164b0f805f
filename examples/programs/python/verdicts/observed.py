"""A stand-in for a race that recording hides (issue 53): this program's numbers depend on
whether anything observes its modules' outputs (torch's global forward hooks, which
detcheck's recorder uses while it records every step, and not in a run that reads nothing
during its steps). A real race (threads, streams, a loader's workers) changes its odds under
recording the same way, by chance; this one does it every time, so a test of it cannot pass
by luck. Its batches come from a thread of its own, as a race's would: a program with no thread
of its own, on the CPU, gets no unperturbed run (docs/checks.md). `detcheck check` must fail it
with the cause "timing", though both recorded runs agree.

    python observed.py [--steps N]
"""

import argparse
import queue
import threading

import torch
from torch.nn.modules import module as nn_module

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches: queue.Queue = queue.Queue()
x = torch.linspace(-1, 1, 64).reshape(8, 8)
threading.Thread(target=lambda: [batches.put(x) for _ in range(args.steps)], daemon=True).start()
for step in range(args.steps):
    loss = model(batches.get()).square().mean()
    if not nn_module._global_forward_hooks:
        loss = loss * (1.0 + 1e-3 * step)  # what the unobserved program's timing would change
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.6f}")
