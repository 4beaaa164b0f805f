"""An accelerate training loop as accelerate's docs write one (`Accelerator`, `prepare`,
`accelerator.backward`), started by each of accelerate's idioms (issue 54): as a script under
`accelerate launch`, or by `notebook_launcher(main, num_processes=2)` from the script itself
(`--notebook`), which forks its ranks under a torch elastic agent.

    accelerate launch --multi_gpu --num_processes 2 accelerate_loop.py   # gloo on the CPU
    python accelerate_loop.py --notebook [--port P]   # its agent's port (29500 by default)
"""

import sys

import torch
from accelerate import Accelerator, notebook_launcher
from accelerate.utils import set_seed


def main():
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.print("loss", loss.item())


if __name__ == "__main__":
    if "--notebook" in sys.argv:
        port = sys.argv[sys.argv.index("--port") + 1] if "--port" in sys.argv else "29500"
        notebook_launcher(main, num_processes=2, use_port=port)
    else:
        main()
