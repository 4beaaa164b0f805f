"""Zero-change recording: unmodified PyTorch scripts (examples/programs/python/unmodified, which
never import detcheck) recorded by the wheel's start-up hook (`detcheck.pth`,
`detcheck._launch.startup`, `detcheck._torch.auto`), `--deterministic` and `detcheck.seed_all`, and
the failures a user meets.

The scripts run in fresh interpreters of this environment (the hook is the installed package's).
Needs torch, and transformers for the Trainer script; CI installs both and none of these skips
there (DETCHECK_REQUIRE_TORCH, DETCHECK_REQUIRE_FRAMEWORKS).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest
from support import (
    PROGRAMS,
    ROOT,
    caught_with_element,
    check,
    decode,
    environment,
    required,
    requires,
    runs,
)

UNMODIFIED = PROGRAMS / "unmodified"
DDP = UNMODIFIED / "ddp_train.py"

requires("torch")

#: The evidence of causes the recorder adds in a launched rank (docs/causes.md).
EVIDENCE = ("seed/", "rng/", "data/indices", "data/outside", "init/")


def launched(tmp_path, argv, rank="0", world="1", **extra):
    """Runs `argv` as rank `rank` of a detcheck launch into tmp_path/trace, without detcheck
    (the launch contract's variables set by hand): (completed process, trace folder)."""
    trace = tmp_path / "trace"
    trace.mkdir(exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DETCHECK_") and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")
    }
    env.update(
        {
            "DETCHECK_TRACE_DIR": str(trace),
            "DETCHECK_WORLD_SIZE": world,
            "DETCHECK_MODE": "md5",
            "PYTHONHASHSEED": "0",
        }
    )
    if rank is not None:
        env["DETCHECK_RANK"] = rank
    env.update(extra)
    done = subprocess.run(
        [sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    return done, trace


def test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught(
    detcheck_bin,
):
    names = ["ddp_train", "control_ddp_set_order"]
    # Under mpirun where MPI must be there (DETCHECK_REQUIRE_MPI4PY): not on whether mpirun is
    # on PATH, which .ci/run installs while this test may run (and checks that scenario in a
    # section of its own).
    if required("mpi4py"):
        names.append("ddp_train_mpirun")
    run = check(detcheck_bin, *[UNMODIFIED / f"{n}.json" for n in names], code=0)
    lines, out = run.scenarios, run.out
    assert sorted(lines) == sorted(names), out
    assert lines["ddp_train"]["status"] == "passed", lines["ddp_train"]
    held = {c["check"]: c["holds"] for c in lines["ddp_train"]["checks"]}
    assert held == {"repeat": True, "replicas": True, "world_sizes": True}, held
    # the table's reduction is the program's own: its process group's backend
    assert lines["ddp_train"]["scenario"]["reduction"] == "gloo", lines["ddp_train"]["scenario"]
    order = caught_with_element(lines["control_ddp_set_order"])
    assert order["name"] == "fwd/(model)", order
    operator = order["operator"]
    assert operator["finding"] == "input_from_outside", operator
    assert operator["source"]["source"] == "scalar", operator
    caught_every_time(detcheck_bin, ["control_ddp_set_order"])


# The full tier (docs/testing.md): `--deterministic` fixing a planted bug, and saying what it
# applied, is checked in CI on test_causes.py's shuffle_samples.
@pytest.mark.full(covered_by="test_causes.py::test_deterministic_names_the_setting_that_fixes_it")
def test_the_set_order_control_passes_with_the_deterministic_settings_it_names(detcheck_bin):
    name = "ddp_set_order_deterministic"
    run = check(detcheck_bin, UNMODIFIED / f"{name}.json", code=0)
    line = run.scenarios[name]
    assert line["status"] == "passed", line
    text = line["detail"]
    for applied in (
        "PYTHONHASHSEED=0:",
        "torch.use_deterministic_algorithms(True)",
        "torch.manual_seed(0)",
        "torch.backends.cudnn.benchmark = False",
    ):
        assert applied in text, text


# The full tier (docs/testing.md): torchrun's ranks and a clock-seeded generator are checked in
# CI by test_verdicts.py's ranks that train apart (under torchrun) and test_causes.py's
# loader_order.
@pytest.mark.full(
    covered_by="test_verdicts.py::test_ranks_that_train_different_models_get_replicas_na_with_the_reason"
)
def test_an_unmodified_ddp_script_passes_under_torchrun_and_its_reseed_control_is_caught(
    detcheck_bin,
):
    names = ["ddp_train_torchrun", "control_ddp_clock_reseed"]
    run = check(detcheck_bin, *[UNMODIFIED / f"{n}.json" for n in names], code=0)
    lines = run.scenarios
    assert sorted(lines) == sorted(names), run.out
    assert lines["ddp_train_torchrun"]["status"] == "passed", lines["ddp_train_torchrun"]
    reseed = caught_with_element(lines["control_ddp_clock_reseed"])
    assert reseed["name"].startswith(("fwd/", "init/")), reseed
    assert reseed["step"] == 0, reseed
    assert reseed["cause"]["kind"] == "seeded_differently", reseed["cause"]
    caught_every_time(detcheck_bin, ["control_ddp_clock_reseed"])


def caught_every_time(detcheck_bin, controls):
    """The unmodified scripts' ``controls`` caught every time: DETCHECK_TORCH_CONTROL_RUNS in
    all, the test's own check the first (scripts/diagnosis-controls.sh asks for 20)."""
    for _ in range(runs("DETCHECK_TORCH_CONTROL_RUNS") - 1):
        again = check(detcheck_bin, *[UNMODIFIED / f"{n}.json" for n in controls], code=0)
        # Every control came back (no line at all would pass the loop below), each caught.
        assert sorted(again.scenarios) == sorted(controls), again.out
        for line in again.scenarios.values():
            assert line["verdict"] == "ok (caught)", again.out


# The full tier (docs/testing.md): HF's Trainer recorded is checked in CI by test_frameworks.py
# (its callback, one step per update), an unmodified script under a launcher by the DDP test
# above, a passing check under torchrun by test_verdicts.py's ranks that train apart.
@pytest.mark.full(
    covered_by="test_frameworks.py::test_trainer_callback_records_one_step_per_update"
)
def test_an_unmodified_trainer_script_passes_under_torchrun_and_its_dropout_control_is_caught(
    detcheck_bin,
):
    requires("transformers")
    names = ["gpt2_trainer", "control_gpt2_clock_dropout"]
    run = check(detcheck_bin, *[UNMODIFIED / f"{n}.json" for n in names], code=0)
    lines = run.scenarios
    assert sorted(lines) == sorted(names), run.out
    held = {c["check"]: c["holds"] for c in lines["gpt2_trainer"]["checks"]}
    assert held == {"repeat": True, "replicas": True, "world_sizes": True}, run.out
    for again in range(runs("DETCHECK_TORCH_CONTROL_RUNS")):
        if again > 0:
            lines = check(
                detcheck_bin, UNMODIFIED / "control_gpt2_clock_dropout.json", code=0
            ).scenarios
        first = caught_with_element(lines["control_gpt2_clock_dropout"])
        assert first["name"] == "fwd/transformer.drop", first
        assert first["operator"]["call"]["operator"].startswith("aten.bernoulli"), first


def test_the_records_are_watchs_plus_inputs_and_loader_workers_write_nothing(tmp_path):
    done, trace = launched(tmp_path, [DDP, "--workers", "2"], DETCHECK_STOP_AFTER="2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in trace.iterdir()) == ["rank0.dctrace"]
    records = decode(trace / "rank0.dctrace")
    assert sorted({r["step"] for r in records}) == [0, 1], "ended after 2 optimizer steps"
    step0 = [r["name"] for r in records if r["step"] == 0]
    # The evidence of causes (docs/causes.md): the seeding calls, the loader's indices (fetched
    # in the main process, whatever the workers do), the parameters before the first step.
    evidence = [n for n in step0 if n.startswith(EVIDENCE)]
    assert {"seed/torch", "data/indices", "init/fc1.weight"} <= set(evidence), evidence
    step0 = [n for n in step0 if not n.startswith(EVIDENCE)]
    assert step0 == [
        "in/(model).0",
        "fwd/fc1",
        "fwd/act",
        "fwd/fc2",
        "fwd/(model)",
        # The scalar the script's backward() starts from: its model returns no loss.
        "loss",
        "grad/fc1.weight",
        "grad/fc1.bias",
        "grad/fc2.weight",
        "grad/fc2.bias",
        "param/fc1.weight",
        "param/fc1.bias",
        "param/fc2.weight",
        "param/fc2.bias",
    ]
    # One rank: nothing to tell apart, so gradients and parameters are replicated records.
    replicated = ("grad/", "param/", "init/", "end/")
    assert all(r["replicated"] == r["name"].startswith(replicated) for r in records)


def test_a_rank_ended_at_its_step_shuts_its_loader_workers_down_as_at_its_end(
    tmp_path, detcheck_bin
):
    # Ended at its 2nd step, mid-epoch: the loader's workers are shut down as the loader does
    # when it is done, so they end with their exit handlers (multiprocessing removes its
    # temporary folders, `pymp-*`) before the launch's process group is killed; killed, they
    # left one for each worker in the temporary folder at every launch. A short temporary
    # folder: the workers' sockets are made in it, and a socket's path has at most 107 bytes
    # (pytest-xdist's tmp_path is longer than that leaves room for).
    with tempfile.TemporaryDirectory(prefix="dc-", dir="/tmp") as temporary:
        check(
            detcheck_bin, "--steps", "2", "--", "python3", DDP, "--workers", "2",
            cwd=tmp_path, env={"TMPDIR": temporary}, code=0,
        )  # fmt: skip
        left = sorted(p for p in os.listdir(temporary) if p.startswith("pymp-"))
    assert left == [], left


#: A program that makes tensors from outside values every way it can: torch.tensor of lists and
#: scalars with dtype, device and requires_grad, as_tensor, from_numpy (sharing memory), empty,
#: large and complex values, inside torch.compile (eager and Inductor, whole graphs), in
#: TorchScript and in data-loader workers. Each "# at" line is one that must be digested.
ENTERING = """\
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

a = torch.tensor([[1, 2], [3, 4]])  # at
assert a.dtype == torch.int64 and a.tolist() == [[1, 2], [3, 4]]
b = torch.tensor(2.5, dtype=torch.float64, device="cpu", requires_grad=True)  # at
assert b.requires_grad and b.dtype == torch.float64 and b.item() == 2.5
c = torch.as_tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="cpu")  # at
array = np.ones(3)
d = torch.from_numpy(array)  # at
d[0] = 7.0
assert array[0] == 7.0, "from_numpy still shares the array's memory"
e = torch.tensor(data=[True, False], dtype=torch.bfloat16)  # at
f = torch.tensor([1 + 2j, 3j])  # at
g = torch.tensor([])  # at
large = torch.from_numpy(np.arange(512 * 512, dtype=np.float64).reshape(512, 512).T)  # at
assert large[3, 2] == 2 * 512 + 3
m = torch.tensor([1.0, 2.0], device="meta")
assert m.device.type == "meta"
assert torch.as_tensor(a) is a, "a tensor stays itself (and is no outside value)"
assert isinstance(a, torch.Tensor) and type(a) is torch.Tensor
assert torch.from_numpy.__name__ == "from_numpy" and torch.tensor.__name__ == "tensor"


def scale(x):
    return x * torch.tensor(2.0) + torch.as_tensor(np.float32(1.0)) + torch.from_numpy(np.ones(3))


for backend in ("eager", "inductor"):
    compiled = torch.compile(scale, backend=backend, fullgraph=True)
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 4.0)), backend


@torch.jit.script
def scripted(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor(1.0)


assert torch.equal(scripted(torch.zeros(2)), torch.ones(2))


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i, 2 * i], dtype=torch.float32)


if __name__ == "__main__":
    batches = list(DataLoader(Numbers(), batch_size=4, num_workers=2))
    assert torch.equal(batches[1][0], torch.tensor([4.0, 8.0]))  # at
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x = torch.tensor(np.full((2, 3), step, dtype=np.float32))  # at
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("ran to the end")
"""


def test_values_entering_torch_are_digested_at_the_programs_lines_and_nothing_breaks(tmp_path):
    """`torch.tensor`, `torch.as_tensor` and `torch.from_numpy` called from the program's lines
    leave `data/outside` records with those lines (docs/causes.md); what they return is
    unchanged, compiled and scripted code still compiles (whole graphs), workers note nothing."""
    program = tmp_path / "entering.py"
    program.write_text(ENTERING)
    done, trace = launched(tmp_path, [program])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ran to the end" in done.stdout, done.stdout + done.stderr
    records = [r for r in decode(trace / "rank0.dctrace") if r["name"] == "data/outside"]
    sites = environment(trace / "rank0.dctrace")
    lines = [i + 1 for i, text in enumerate(ENTERING.splitlines()) if text.endswith("# at")]
    where = {
        (r["step"], sites[f"site:{r['step']}:data/outside:{k}"])
        for r in records
        for k in [sum(1 for o in records if o["step"] == r["step"] and o["seq"] < r["seq"])]
    }
    # Before the model's first forward, every line (the last one's step 0 too) in step 0; the
    # loop's line again in step 1, with other values. Not the compiled, scripted or worker lines.
    expected = {(0, f"entering.py:{n}") for n in lines} | {(1, f"entering.py:{lines[-1]}")}
    assert where == expected, (where, expected)
    # The loop's line is the last of step 0 and the only one of step 1: other values, other md5s.
    step0, step1 = records[-2], records[-1]
    assert (step0["step"], step1["step"]) == (0, 1), records
    assert step0["md5"] != step1["md5"], "the values entering in step 0 and in step 1 differ"


def test_torchruns_agent_records_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done, trace = launched(
        tmp_path,
        [
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            DDP,
            "--workers",
            "0",
        ],
        rank=None,
        DETCHECK_STOP_AFTER="1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in trace.iterdir()) == ["rank0.dctrace"]


def test_an_optimizer_stepped_inside_another_ends_one_step_per_update(tmp_path):
    """torch's ZeroRedundancyOptimizer steps its SGD inside its own step: both run torch's global
    step hooks. One step per update, ending at the outer one's hook after its broadcast (before:
    eight steps for four updates, every other one holding only `param/*`)."""
    requires("gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    program = PROGRAMS / "verdicts" / "zero_redundancy.py"
    done, trace = launched(tmp_path, [program], MASTER_PORT=str(port))
    assert done.returncode == 0, done.stdout + done.stderr
    records = decode(trace / "rank0.dctrace")
    steps = sorted({r["step"] for r in records})
    assert steps == [0, 1, 2, 3], steps
    for step in steps:
        names = [r["name"] for r in records if r["step"] == step]
        assert names.count("param/weight") == 1 and names.count("grad/weight") == 1, names


def test_a_layer_that_calls_its_own_forward_is_recorded_from_its_first_step(tmp_path):
    """pytorch/examples' mnist_forward_forward: each layer calls `self.forward` (no module hook
    runs) and steps its own optimizer. The model is the layer around the step holding the
    optimizer's parameters, recorded from the first step (before: only from a later
    `layer(x)`, its `init/*` the trained weights)."""
    program = tmp_path / "own_forward.py"
    program.write_text(
        textwrap.dedent("""
        import torch

        class Layer(torch.nn.Linear):
            def __init__(self):
                super().__init__(4, 3)
                self.opt = torch.optim.SGD(self.parameters(), lr=0.1)

            def train_steps(self, x, n):
                for _ in range(n):
                    loss = self.forward(x).pow(2).mean()
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()

        torch.manual_seed(0)
        layers = [Layer()]                  # a plain list, as the example keeps them
        layers[0].train_steps(torch.ones(2, 4), 3)
        layers[0](torch.ones(2, 4))         # its first call through the module
        """)
    )
    done, trace = launched(tmp_path, [program])
    assert done.returncode == 0, done.stdout + done.stderr
    records = decode(trace / "rank0.dctrace")
    first = {r["name"] for r in records if r["step"] == 0}
    assert {"init/weight", "grad/weight", "param/weight"} <= first, sorted(first)
    assert sorted({r["step"] for r in records if r["name"] == "param/weight"}) == [0, 1, 2]


def test_a_program_that_records_itself_is_not_recorded_twice(tmp_path):
    program = tmp_path / "own.py"
    program.write_text(
        textwrap.dedent("""
        import torch, detcheck, detcheck.torch
        model = torch.nn.Linear(3, 2)
        model(torch.ones(1, 3))             # a forward before the program's writer opens
        writer = detcheck.TraceWriter.from_env()
        opt = torch.optim.SGD(model.parameters(), 0.1)
        handle = detcheck.torch.watch(model, writer, opt)
        for step in range(2):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
        writer.close()
    """)
    )
    done, trace = launched(tmp_path, [program], DETCHECK_STOP_AFTER="1")
    assert done.returncode == 0, done.stdout + done.stderr
    records = decode(trace / "rank0.dctrace")
    assert sorted({r["step"] for r in records}) == [0, 1], "the program's steps, not --steps"
    assert not any(r["name"].startswith("in/") for r in records), "the recorder's records"
    step0 = [r["name"] for r in records if r["step"] == 0 and not r["name"].startswith(EVIDENCE)]
    assert step0[0] == "fwd/(model)", step0


def test_a_program_that_records_itself_records_the_data_flow_in_a_dumps_run(tmp_path):
    """`run --dump` asks for the data flow (`DETCHECK_RECORD=flow`) whoever records: a
    program's own `watch` records the input code between modules made (`in/<module>.N`), so
    that `compare --align` knows that module's input and never leaves its culprit unconfirmed
    where the program is at hand (docs/align.md)."""
    program = tmp_path / "own.py"
    program.write_text(
        textwrap.dedent("""
        import torch, detcheck, detcheck.torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
        first, second = model
        model.forward = lambda x: second(first(x) + 1000.0)   # code between two modules
        writer = detcheck.TraceWriter.from_env()
        opt = torch.optim.SGD(model.parameters(), 0.1)
        handle = detcheck.torch.watch(model, writer, opt)
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        writer.close()
    """)
    )
    names = {}
    for record in ("flow", "all"):
        (tmp_path / record).mkdir()
        done, trace = launched(tmp_path / record, [program], DETCHECK_RECORD=record)
        assert done.returncode == 0, done.stdout + done.stderr
        names[record] = [r["name"] for r in decode(trace / "rank0.dctrace")]
        flow = environment(trace / "rank0.dctrace").get("site:flow")
        assert (flow is not None) == (record == "flow"), (record, flow)
    # the second module's input (the first's output plus 1000) is no record before it
    assert "in/1.0" in names["flow"], names["flow"]
    assert not any(n.startswith("in/") for n in names["all"]), names["all"]


def test_a_rank_that_dies_leaves_its_finished_steps_and_fails_the_run(tmp_path, detcheck_bin):
    program = tmp_path / "dies.py"
    program.write_text(
        textwrap.dedent("""
        import torch
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), 0.1)
        for step in range(5):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            if step == 2:
                raise RuntimeError("out of memory, say")
            opt.step()
    """)
    )
    done, trace = launched(tmp_path, [program])
    assert done.returncode == 1, done.stdout + done.stderr
    records = decode(trace / "rank0.dctrace")
    assert sorted({r["step"] for r in records}) == [0, 1, 2]
    assert (
        environment(trace / "rank0.dctrace")["detcheck.recording"] == "ended during step 2 (exit)"
    )
    run = check(detcheck_bin, "--", sys.executable, program, code=3)
    out = run.out
    assert "exited with status 1" in out and "out of memory, say" in out, out
    line = run.scenarios["dies"]
    assert line["status"] == "errored" and line["first_divergence"] is None, line


@pytest.mark.parametrize(
    "program, says",
    [
        (["-c", "print('no torch here')"], "which never imported torch"),
        (["-c", "import torch; print(torch.ones(1))"], "no torch.nn.Module with parameters ran"),
        (["-c", "import sys; sys.exit(7)"], "exited with status 7"),
        (["-c", "import os; os.kill(os.getpid(), 9)"], "exited with signal 9"),
    ],
    ids=["no-torch", "no-model", "exit-7", "killed"],
)
def test_programs_that_cannot_be_recorded_say_why(detcheck_bin, program, says):
    out = check(detcheck_bin, "--ranks", "2", "--", sys.executable, *program, code=3).out
    assert says in out, out


def test_seed_all_applies_the_hint_tables_settings_and_says_what_it_cannot(tmp_path):
    program = tmp_path / "seeded.py"
    program.write_text(
        textwrap.dedent("""
        import json, random, warnings
        import numpy, torch, detcheck
        from detcheck._core import settings as _settings
        from detcheck._detcheck import deterministic_settings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            done = detcheck.seed_all(7)
        first = (random.random(), float(numpy.random.rand()), float(torch.rand(1)))
        import torch._inductor.config as inductor  # after seed_all: it reads the variable
        detcheck.seed_all(7, deterministic=False)
        again = (random.random(), float(numpy.random.rand()), float(torch.rand(1)))
        try:
            detcheck.seed_all(-1)
            refused = False
        except ValueError:
            refused = True
        print(json.dumps({
            "names": [s.name for s in done], "table": [r[1] for r in deterministic_settings()],
            "appliers": sorted(_settings._APPLY), "applied": {s.name: s.applied for s in done},
            "statements": [s.statement for s in done],
            "warnings": [str(w.message) for w in caught], "same": first == again,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
            "inductor": inductor.deterministic,
            "refused": refused,
        }))
    """)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["names"] == got["table"]
    assert got["appliers"] == sorted(got["table"]), "one applier per row of the table"
    assert got["applied"]["PYTHONHASHSEED"] is False
    assert any("PYTHONHASHSEED" in w for w in got["warnings"]), got["warnings"]
    assert "torch.manual_seed(7)" in got["statements"]
    assert "PYTHONHASHSEED=0" in got["statements"], "a launch variable keeps its name"
    assert got["same"] and got["deterministic"] and got["cudnn"] == [True, False]
    assert got["inductor"] is True, "Inductor's deterministic mode, through its variable"
    assert got["refused"]


def test_the_docs_list_every_deterministic_setting():
    from detcheck._detcheck import deterministic_settings

    text = (ROOT / "docs" / "operators.md").read_text()
    settings = deterministic_settings()
    assert settings, "the hint table has no deterministic setting"
    for kind, name, _value, statement, _why, _reference in settings:
        shown = statement if kind == "launch" else statement.replace("SEED", "seed")
        row = f"| `{shown}` |"
        assert row in text, f"docs/operators.md lacks the row of {name}: {row}"


PROBED = """\
import importlib.util

import numpy as np

assert importlib.util.find_spec("torch") is not None  # asked first, as datasets and trl do
import torch  # noqa: E402

rows = np.random.permutation(8)  # numpy's global generator, not seeded yet
np.random.seed(0)  # as a Trainer seeds it
np.random.permutation(8)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
"""


def test_torch_imported_after_a_probe_of_its_spec_is_recorded_and_an_unseeded_draw_noted(
    tmp_path,
):
    """A program whose libraries ask `importlib.util.find_spec("torch")` before importing it
    (datasets, transformers: TRL's SFT script, docs/zoo.md) is recorded: the probe used to spend
    the start-up hook's import callback, and nothing was. numpy's global generator drawn from
    before anything seeded it is noted at the drawing line (`site:unseeded_global`), a draw
    after its seed is not."""
    program = tmp_path / "probed.py"
    program.write_text(PROBED)
    done, trace = launched(tmp_path, [program])
    assert done.returncode == 0, done.stdout + done.stderr
    names = {r["name"] for r in decode(trace / "rank0.dctrace")}
    assert "fwd/(model)" in names and "grad/weight" in names, names
    drawn = next(i for i, t in enumerate(PROBED.splitlines(), 1) if t.startswith("rows ="))
    sites = environment(trace / "rank0.dctrace")
    assert sites.get("site:unseeded_global") == f"probed.py:{drawn}", sites
