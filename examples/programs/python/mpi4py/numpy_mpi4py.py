"""A data-parallel numpy + mpi4py program of the user's own under detcheck (`mpirun` launcher).

Every rank computes the gradient of a linear model on its shard; the ranks' gradients are summed
in rank order on rank 0 (a Gather, then a sum over ranks 0, 1, ...) and broadcast, so every rank
applies the same update: bitwise reproducible. Records: the local gradient, the summed gradient
and the weights (replicated), with detcheck's Python writer.

    mpirun -n 4 python3 numpy_mpi4py.py --seed S --steps N [--plant-any-source]

`--plant-any-source` is the negative control: rank 0 receives the gradients from
`MPI.ANY_SOURCE` and adds them in the order they arrive. detcheck starts the ranks in another order
in every launch, so `repeat` catches it every time (with 3 ranks or more).
"""

import argparse
import sys

import numpy as np
from mpi4py import MPI

import detcheck

FEATURES = 48


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--plant-any-source", action="store_true")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    writer = detcheck.TraceWriter.from_env()
    weights = np.zeros(FEATURES, dtype=np.float32)
    target = np.linspace(-2, 2, FEATURES, dtype=np.float32)
    for step in range(args.steps):
        rng = np.random.default_rng([args.seed, rank, step])
        x = (rng.standard_normal((32, FEATURES)) * (1 + rank)).astype(np.float32)
        residual = x @ weights - x @ target
        local = (x * residual[:, None]).sum(axis=0, dtype=np.float32)
        total = np.empty(FEATURES, dtype=np.float32)
        if args.plant_any_source:
            if rank == 0:
                total[:] = local
                incoming = np.empty(FEATURES, dtype=np.float32)
                for _ in range(size - 1):
                    comm.Recv(incoming, source=MPI.ANY_SOURCE, tag=step)
                    total += incoming
            else:
                comm.Send(local, dest=0, tag=step)
        else:
            gathered = np.empty((size, FEATURES), dtype=np.float32) if rank == 0 else None
            comm.Gather(local, gathered, root=0)
            if rank == 0:
                total[:] = 0
                for r in range(size):  # rank order, whatever the arrival order
                    total += gathered[r]
        comm.Bcast(total, root=0)
        weights -= np.float32(0.001) * total
        if writer is not None:
            writer.record(step, "grad/local", local)
            writer.record_replicated(step, "grad/sum", total)
            writer.record_replicated(step, "weights", weights)
    if writer is not None:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
