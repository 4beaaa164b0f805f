"""Two processes started with `torch.multiprocessing.spawn` that train without joining a process
group, as `torch.distributed.rpc` programs' workers do (pytorch/examples'
distributed/rpc/rnn/main.py, which calls only `rpc.init_rpc`): detcheck records no rank of them
and its error says so, with what to do (python/tests/test_launchers.py)."""

import torch
import torch.multiprocessing as mp


def train(index):
    torch.manual_seed(index)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    mp.spawn(train, nprocs=2, join=True)
