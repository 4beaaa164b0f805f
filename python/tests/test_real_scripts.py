"""Real scripts as their authors write them (issue 35): the corpus of examples/programs/python/
corpus (nanoGPT-style, DDP with snapshots, FSDP2, FSDP1, tensor parallel, a word-language-model-
style loop without torch.optim, a torch.func loop) and what a user does with a recorded model
(save, copy, pickle, script, trace, compile); the operator drill-down inside sharded modules; a
closure optimizer's steps; the launch rule at one rank; failures that read like the rank's own
under torchrun; tensor subclasses that must never break the program.

Needs torch (CI installs it; DETCHECK_REQUIRE_TORCH makes a missing torch fail, not skip).
"""

import copy
import json
import os
import pickle
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from support import (
    PROGRAMS,
    caught_with_element,
    check,
    dctrace,
    decode,
    environment,
    requires,
    run_detcheck,
    runs,
)

CORPUS = PROGRAMS / "corpus"

requires("torch")

import torch  # noqa: E402  (after `requires`: the module is skipped without torch)


class Tiny(torch.nn.Module):
    """A model class of the test's own, for torch.load's allowlist."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


#: Each control's cause (docs/causes.md), and the script whose line it names.
CONTROL_CAUSES = {
    "control_ddp_snapshot_clock": ("seeded_differently", "ddp_snapshot"),
    "control_fsdp1_clock": ("seeded_differently", "fsdp1_train"),
    "control_fsdp2_clock": ("seeded_differently", "fsdp2_train"),
    # a world_sizes divergence: no cause is decided (causes are a repeat divergence's)
    "control_fsdp2_perturbed_shard": (None, None),
    "control_nanogpt_clock_seed": ("seeded_differently", "nanogpt_train"),
    # numpy's global generator, named at the line its indices enter torch (`data/outside`)
    "control_nanogpt_numpy_batches": ("unseeded_generator", "nanogpt_train"),
    "control_tensor_parallel_clock": ("seeded_differently", "tp_train"),
    "control_word_lm_unseeded": ("initial_parameters", None),
    "control_func_train_clock": ("seeded_differently", "func_train"),
    # Noise from a generator seeded from OS entropy inside a sharded module's forward: without
    # the drill-down (--no-diagnosis) no evidence names it; with it, the operator does
    # (test_the_drill_down_names_the_operator_inside_a_sharded_module, which checks them).
    "control_fsdp1_noise": ("unknown", None),
    "control_fsdp2_noisy_block": ("unknown", None),
    "control_tensor_parallel_noise": ("unknown", None),
}


def corpus_by_script():
    """The corpus's scenario files, grouped by the script they run (its name without `.py`)."""
    groups = {}
    for path in sorted(CORPUS.glob("*.json")):
        command = json.loads(path.read_text())["params"]["command"]
        script = next(Path(arg).stem for arg in command if arg.endswith(".py"))
        groups.setdefault(script, []).append(path)
    return groups


def test_the_corpus_holds_seven_scripts_with_a_control_each():
    groups = corpus_by_script()
    names = {p.stem for paths in groups.values() for p in paths}
    controls = {n for n in names if n.startswith("control_")}
    assert len(controls) == 12 and len(names) == 21 and len(groups) == 7, groups
    assert controls == set(CONTROL_CAUSES), controls
    for script, paths in groups.items():
        assert any(p.stem.startswith("control_") for p in paths), script
        assert any(not p.stem.startswith("control_") for p in paths), script


#: The corpus scripts of the full tier (docs/testing.md), each covered in CI by another test of
#: its kind: FSDP2 and FSDP1 by their dumps' sharded records, tensor parallel by the TP-size
#: check (test_tp_sizes.py), DDP by the unmodified DDP script, nanoGPT by the zoo (full tier
#: too: an upstream program passing is checked in CI on mnist and Lightning), func_train by
#: word_lm's loop.
FULL_CORPUS = {
    "fsdp1_train": pytest.mark.full(
        covered_by="test_real_scripts.py::test_sharded_records_are_local_shards_and_only_replicate_placements_are_replicated"
    ),
    "nanogpt_train": pytest.mark.full(
        covered_by="test_zoo.py::test_a_zoo_program_as_its_readme_runs_it"
    ),
    "fsdp2_train": pytest.mark.full(
        covered_by="test_real_scripts.py::test_a_sharded_record_carries_its_placement_in_the_trace"
    ),
    # a hand-written loop: word_lm's (its own SGD loop, no optimizer) stays in CI
    "func_train": pytest.mark.full(
        covered_by="test_real_scripts.py::test_the_corpus_passes_and_every_control_is_caught"
    ),
    "tp_train": pytest.mark.full(
        covered_by="test_tp_sizes.py::test_a_tensor_parallel_model_differs_from_its_one_rank_self_at_its_all_reduce"
    ),
    "ddp_snapshot": pytest.mark.full(
        covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
    ),
}


# One script's scenarios per test (checked as one command), so that two workers share them.
@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=FULL_CORPUS.get(s, ())) for s in sorted(corpus_by_script())]
)
def test_the_corpus_passes_and_every_control_is_caught(detcheck_bin, tmp_path, script):
    # The controls planted inside a sharded module's forward are checked, with the drill-down
    # that names them, by test_the_drill_down_names_the_operator_inside_a_sharded_module (without
    # it no evidence names them: cause `unknown`); checked here too, they cost CI three checks
    # of sharded 2-rank jobs (issue 55).
    paths = [p for p in corpus_by_script()[script] if p.stem not in INSIDE_SHARDED]
    # From an empty folder: the scripts' own files (nanoGPT's tokens, the snapshot, the saved
    # model) go where their authors put them, and nothing is left behind.
    run = check(detcheck_bin, "--no-diagnosis", *paths, cwd=tmp_path, timeout=900, code=0)
    scenarios, out = run.scenarios, run.out
    assert set(scenarios) == {p.stem for p in paths}, out
    for name, line in scenarios.items():
        assert line["status"] == "passed", (name, out)
        assert line["counts"]["records_compared"] > 0, (name, out)
    assert list(tmp_path.iterdir()) == [], "a run left files in the working directory"
    controls = sorted(p for p in paths if p.stem.startswith("control_"))
    for name in (p.stem for p in controls):
        kind, site = CONTROL_CAUSES[name]
        if kind is None:
            continue
        cause = scenarios[name]["first_divergence"]["cause"]
        assert cause["kind"] == kind, (name, cause)
        if site is not None:  # the seeding call's (or the values') line in the script
            assert f"{site}.py:" in cause["site"], (name, cause)
    # Every control caught every time: DETCHECK_CORPUS_CONTROL_RUNS in all (1 here in CI;
    # scripts/diagnosis-controls.sh asks for 20).
    times = runs("DETCHECK_CORPUS_CONTROL_RUNS")
    caught = {p.stem: 1 for p in controls}
    for _ in range(times - 1):
        again = check(detcheck_bin, "--no-diagnosis", *controls, cwd=tmp_path, timeout=900)
        assert set(again.scenarios) == set(caught), again.out
        for name, line in again.scenarios.items():
            caught[name] += line["status"] == "passed"
    print(f"corpus controls caught, of {times} runs each: {caught}")
    assert all(n == times for n in caught.values()), caught


#: The controls planted inside a sharded module's forward (noise from a generator seeded from
#: OS entropy), and the module whose forward the drill-down must go into.
INSIDE_SHARDED = {
    # fully_shard per block: DTensor parameters, FSDP's all-gather and its freeing of the
    # unsharded parameters around the block's forward
    "control_fsdp2_noisy_block": ("layers.1", "fsdp2_train"),
    # ColwiseParallel/RowwiseParallel: DTensor weights and activations, the all-reduce
    "control_tensor_parallel_noise": ("(model)", "tp_train"),
    # FSDP1 units inside the window: FSDP's own operators split its padded flat parameters,
    # memory it allocated by resizing a storage, before the all-gather fills them
    "control_fsdp1_noise": ("(model)", "fsdp1_train"),
}


#: The drill-down inside a sharded module (FSDP1's flat parameters, FSDP2's blocks, tensor
#: parallel's DTensors): the full tier (docs/testing.md). CI drills down to the operator, past
#: the module whose input differed, on the unmodified DDP script's control (test_zero_change.py).
FULL_INSIDE = pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)


@pytest.mark.parametrize(
    "scenario", [pytest.param(s, marks=FULL_INSIDE) for s in sorted(INSIDE_SHARDED)]
)
def test_the_drill_down_names_the_operator_inside_a_sharded_module(
    detcheck_bin, tmp_path, scenario
):
    module, script = INSIDE_SHARDED[scenario]
    # Named every time: DETCHECK_CORPUS_CONTROL_RUNS in all (scripts/diagnosis-controls.sh).
    for _ in range(runs("DETCHECK_CORPUS_CONTROL_RUNS")):
        run = check(detcheck_bin, CORPUS / f"{scenario}.json", cwd=tmp_path, timeout=900, code=0)
        first = caught_with_element(run.scenarios[scenario])
        assert first["name"] == f"fwd/{module}", first["name"]
        operator = first["operator"]
        assert operator["finding"] == "nondeterministic", operator
        assert operator["window"] == "forward", operator
        call = operator["call"]
        assert call["operator"] == "aten.randn.generator", operator
        assert call["module"] == module, operator
        assert f"{script}.py:" in call["site"], operator
        # The operators before it, the sharded ones among them, were traced and agreed.
        assert call["index"] > 0, operator
        assert first["cause"]["kind"] == "nondeterministic_operator", first["cause"]


def test_a_loop_without_an_optimizer_is_recorded_step_by_step(detcheck_bin, tmp_path):
    # word_lm.py updates its parameters by hand and saves its whole model with torch.save.
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        CORPUS / "word_lm.json",
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    records = decode(dump / "rank0.dctrace")
    steps = sorted({r["step"] for r in records})
    assert steps == [0, 1, 2], steps  # --steps 3 stopped the program
    for step in steps:
        names = [r["name"] for r in records if r["step"] == step]
        grads = [n for n in names if n.startswith("grad/")]
        params = [n for n in names if n.startswith("param/")]
        assert grads and len(grads) == len(params), (step, names)
        assert names.index(grads[0]) < names.index(params[0]), names
        assert any(n.startswith("fwd/") for n in names), names
    assert not (tmp_path / "model.pt").exists()


def test_a_torch_func_loop_is_recorded_step_by_step(detcheck_bin, tmp_path):
    # func_train.py: functional_call + grad_and_value on a dict of parameters, a hand-written
    # update that makes a new dict every step, evaluation forwards every 5 steps.
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        CORPUS / "func_train.json",
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    records = decode(dump / "rank0.dctrace")
    steps = sorted({r["step"] for r in records})
    assert steps == [0, 1, 2], steps  # --steps 3 stopped the program (20 steps by default)
    params = ["fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"]
    for step in steps:
        names = [r["name"] for r in records if r["step"] == step]
        # The module's forwards (functional_call runs them), the scalar grad_and_value
        # differentiates, then the parameters the next forward is called with: the update's.
        # `run --dump` records the data flow: fc2's input is `F.gelu`'s output, which no
        # module's record holds (`in/fc2.0`, docs/align.md).
        expected = ["in/(model).0", "fwd/fc1", "fwd/norm", "in/fc2.0", "fwd/fc2", "fwd/(model)"]
        expected += ["loss"]
        expected += [f"param/{p}" for p in params]
        # (The last step ends with the end state, `end/*`: docs/checks.md.)
        kept = [n for n in names if not n.startswith(("seed/", "init/", "end/"))]
        assert kept == expected, names
    # The parameters are the dict's, not the module's own (which never change): each step's
    # differ from the step before.
    by_name = {(r["step"], r["name"]): r["md5"] for r in records}
    for p in params:
        assert by_name[(0, f"param/{p}")] != by_name[(0, f"init/{p}")], p
        assert by_name[(1, f"param/{p}")] != by_name[(0, f"param/{p}")], p


def test_a_closure_optimizer_counts_one_step_per_step_call(detcheck_bin, tmp_path):
    # LBFGS evaluates its closure (forward and backward) several times inside one step().
    script = write(
        tmp_path,
        "lbfgs.py",
        """\
        import torch
        import torch.nn.functional as F

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
        x = torch.linspace(-1, 1, 32).reshape(8, 4)
        y = x.sum(dim=1, keepdim=True).sin()
        for step in range(6):
            def closure():
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss
            opt.step(closure)
        """,
    )
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        "--steps",
        "3",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    records = decode(dump / "rank0.dctrace")
    assert sorted({r["step"] for r in records}) == [0, 1, 2]
    for step in (0, 1, 2):
        names = [r["name"] for r in records if r["step"] == step]
        # Several closure evaluations: several forwards; the gradients of the first, once.
        assert names.count("fwd/(model)") > 1, names
        assert names.count("grad/0.weight") == 1 and names.count("param/0.weight") == 1, names
        assert names.index("grad/0.weight") < names.index("param/0.weight"), names
    run = check(
        detcheck_bin,
        "--ranks",
        "1",
        "--steps",
        "3",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    assert run.scenarios["lbfgs"]["status"] == "passed", run.out


def always_pg(tmp_path):
    """A script that creates its process group whatever its world (DDP at every size)."""
    return write(
        tmp_path,
        "always_pg.py",
        """\
        import os
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # no RANK or WORLD_SIZE set by hand: a world of one
        assert dist.get_world_size() == int(os.environ["WORLD_SIZE"]), os.environ["WORLD_SIZE"]
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
        dist.destroy_process_group()
        """,
    )


def test_a_script_that_always_creates_a_process_group_runs_at_one_rank(detcheck_bin, tmp_path):
    script = always_pg(tmp_path)
    run = check(
        detcheck_bin,
        "--ranks",
        "1",
        "--steps",
        "2",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    assert run.scenarios["always_pg"]["status"] == "passed", run.out


# The full tier (docs/testing.md): the same script at two ranks, and across world sizes 1 and 2,
# is the unmodified DDP script's check in CI (test_zero_change.py).
@pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)
def test_a_script_that_always_creates_a_process_group_runs_at_two_ranks_and_across_sizes(
    detcheck_bin, tmp_path
):
    script = always_pg(tmp_path)
    check(
        detcheck_bin,
        "--ranks",
        "2",
        "--steps",
        "2",
        "--checks",
        "repeat,replicas,world_sizes",
        "--world-sizes",
        "1,2",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )


def test_a_script_written_for_torchrun_gets_the_launcher_hint_at_one_rank(detcheck_bin, tmp_path):
    script = write(
        tmp_path,
        "torchrun_only.py",
        """\
        import os
        import torch
        local_rank = int(os.environ["LOCAL_RANK"])
        """,
    )
    out = check(
        detcheck_bin, "--ranks", "1", "--", "python3", script, cwd=tmp_path, timeout=900, code=3
    ).out
    assert "KeyError: 'LOCAL_RANK'" in out, out
    assert "check it with `--launcher torchrun`" in out, out


def test_a_torchrun_rank_that_raises_shows_its_own_traceback(detcheck_bin, tmp_path):
    script = write(
        tmp_path,
        "raises.py",
        """\
        import os
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.Linear(4, 2)
        model(torch.ones(1, 4))
        if dist.get_rank() == 1:
            raise ValueError("rank 1 found an empty shard of the data set")
        dist.barrier()
        """,
    )
    run = check(
        detcheck_bin,
        "--ranks",
        "2",
        "--launcher",
        "torchrun",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=3,
    )
    out, error = run.out, run.scenarios["raises"]["error"]
    assert "rank 1 raised ValueError: rank 1 found an empty shard of the data set" in error, out
    assert f'File "{script}", line 9, in <module>' in error, out


def test_a_stuck_torchrun_rank_is_named_with_where_it_waits(detcheck_bin, tmp_path):
    """And both ranks are killed: torchrun's agent starts them in sessions of their own, which
    killing the agent's process group left running (issue 53)."""
    script = write(
        tmp_path,
        "stuck.py",
        f"""\
        import os, time
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.nn.Linear(2, 2)(torch.ones(1, 2))
        pid = os.path.join({str(tmp_path)!r}, f"pid{{dist.get_rank()}}")
        open(pid, "w").write(str(os.getpid()))
        if dist.get_rank() == 0:
            time.sleep(600)
        dist.barrier()
        """,
    )
    run = check(
        detcheck_bin,
        "--ranks",
        "2",
        "--launcher",
        "torchrun",
        "--timeout",
        "40",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=3,
    )
    out, error = run.out, run.scenarios["stuck"]["error"]
    assert "rank(s) 0, 1 still running" in error, out
    assert (
        "rank 0 is in (innermost first, from its Python stacks):\n"
        f'    File "{script}", line 10 in <module>'
    ) in error, out
    assert "in barrier" in error, out
    for rank in (0, 1):
        pid = int((tmp_path / f"pid{rank}").read_text())
        assert not alive_within(pid, seconds=10), f"rank {rank} (pid {pid}) is still running"


def alive_within(pid, seconds):
    """Whether process ``pid`` still runs (not a zombie) after waiting up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.2)
    return True


def test_a_recorded_model_saves_the_bytes_of_a_plain_one_and_loads_with_weights_only(tmp_path):
    """Issue 53: nothing of detcheck's stays in a user's module. `torch.save(model)` of a
    recorded model writes the bytes a plain one writes, and `torch.load` with weights_only
    (torch's default) loads it with only the program's own classes allowed
    (pytorch/examples' word_language_model did, and failed on detcheck's hook)."""
    import detcheck
    import detcheck.torch as dt

    def saved(record):
        torch.manual_seed(0)
        model = Tiny()
        handle = None
        if record:
            writer = detcheck.TraceWriter(str(tmp_path / "trace"), 0, 1, "md5")
            handle = dt.watch(model, writer)
        model(torch.ones(3, 4))
        # The archive inside a saved file is named after the file: one name for both.
        (tmp_path / str(record)).mkdir()
        path = tmp_path / str(record) / "model.pt"
        torch.save(model, path)
        state = tmp_path / str(record) / "state.pt"
        torch.save(model.state_dict(), state)
        if handle is not None:
            assert not model._forward_hooks and not model.fc._forward_hooks
            with torch.serialization.safe_globals([Tiny, torch.nn.Linear]):
                loaded = torch.load(path)
            assert torch.equal(loaded(torch.ones(1, 4)), model(torch.ones(1, 4)))
            handle.remove()
            writer.close()
        return path.read_bytes(), state.read_bytes()

    assert saved(True) == saved(False)


def test_a_recorded_model_can_be_saved_copied_pickled_traced_and_compiled(tmp_path):
    import detcheck
    import detcheck.torch as dt
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    writer = detcheck.TraceWriter(str(tmp_path / "trace"), 0, 1, "md5")
    handle = dt.watch(model, writer)
    x = torch.ones(3, 4)
    model(x)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    copied = copy.deepcopy(model)
    unpickled = pickle.loads(pickle.dumps(model))
    before = writer.num_records
    for other in (loaded, copied, unpickled):
        assert torch.equal(other(x), model(x))  # the model's own call records again
    model.load_state_dict(copied.state_dict())
    traced = torch.jit.trace(copied, x)
    assert torch.equal(traced(x), model(x))
    compiled = torch.compile(model, backend="eager")
    assert torch.equal(compiled(x), model(x))
    # Only `model`'s own forwards were recorded: 4 modules' outputs each time it ran (3 in the
    # comparisons, 1 under jit.trace's comparison, 1 compiled); the copies record nothing.
    assert (writer.num_records - before) % 4 == 0 and writer.num_records - before >= 16
    # The recorded model itself, scripted and traced: TorchScript compiles a module's forward
    # hooks, and never sees detcheck's; the tracer's warnings about what it reads are not shown.
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, x)
    scripted = torch.jit.script(model)
    for other in (traced, scripted):
        assert torch.equal(other(x), model(x))
    assert scripted.code.count("hook") == 0, scripted.code
    during = writer.num_records
    scripted(x)  # a scripted module is a copy: it records nothing
    assert writer.num_records == during
    model(x)  # the model goes on recording, its hooks back in place
    assert writer.num_records == during + 4
    handle.remove()
    writer.close()
    names = {r["name"] for r in decode(tmp_path / "trace" / "rank0.dctrace")}
    assert names == {"fwd/0", "fwd/1", "fwd/2", "fwd/(model)"}, names


def test_a_model_recorded_without_a_change_can_be_scripted_and_traced(detcheck_bin, tmp_path):
    # Scripting and tracing mid-training, as an export step does: `script` is imported before
    # detcheck's hooks exist, and scripted where it would be without detcheck.
    script = write(
        tmp_path,
        "export.py",
        """\
        import torch
        from torch.jit import script

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        for step in range(4):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if step == 1:
                for exported in (script(model), torch.jit.trace(model, x)):
                    assert torch.equal(exported(x), model(x))
                    torch.jit.save(exported, "exported.pt")
                    assert torch.equal(torch.jit.load("exported.pt")(x), model(x))
        """,
    )
    run = check(
        detcheck_bin,
        "--ranks",
        "1",
        "--steps",
        "3",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    assert run.scenarios["export"]["status"] == "passed", run.out
    assert run.scenarios["export"]["counts"]["records_compared"] > 0, run.out


def test_tensor_subclasses_are_recorded_through_their_data_or_skipped_with_a_note(tmp_path):
    import detcheck
    import detcheck.torch as dt
    import torch
    import torch.distributed as dist

    class Tagged(torch.Tensor):
        pass

    kinds = {
        "plain_subclass": lambda x: x.as_subclass(Tagged),
        "meta": lambda x: torch.empty(x.shape, device="meta"),
        "nested": lambda x: torch.nested.nested_tensor([x[0], x[1, :2]]),
        "sparse": lambda x: x.to_sparse(),
        "quantized": lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
    }
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (1,))
        kinds["dtensor"] = lambda x: distribute_tensor(x, mesh, [Shard(0)])

        class Emit(torch.nn.Module):
            def __init__(self, make):
                super().__init__()
                self.make = make

            def forward(self, x):
                return self.make(x)

        model = torch.nn.ModuleDict({k: Emit(f) for k, f in kinds.items()})
        model.lin = torch.nn.Linear(3, 3)
        writer = detcheck.TraceWriter(str(tmp_path / "trace"), 0, 1, "md5")
        handle = dt.watch(model, writer)
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        for name in kinds:  # each forward returns its kind: the program never sees an error
            out = model[name](x)
            assert out is not None
        model.lin(x)
        handle.remove()
        writer.close()
    finally:
        dist.destroy_process_group()
    env = environment(tmp_path / "trace" / "rank0.dctrace")
    names = {r["name"] for r in decode(tmp_path / "trace" / "rank0.dctrace")}
    assert {"fwd/plain_subclass", "fwd/quantized", "fwd/dtensor", "fwd/lin"} <= names, names
    for skipped in ("meta", "nested", "sparse"):
        assert f"fwd/{skipped}" not in names
        assert f"detcheck.skipped/fwd/{skipped}" in env, env
    assert "holds no values" in env["detcheck.skipped/fwd/meta"]
    assert env["detcheck.tensor/fwd/dtensor"].startswith("DTensor ['S(0)'] on mesh (1,)"), env
    assert "recorded as its integers" in env["detcheck.tensor/fwd/quantized"], env
    assert "Tagged: recorded through its data" in env["detcheck.tensor/fwd/plain_subclass"], env


def test_tensor_subclasses_never_break_a_program_recorded_without_a_change(detcheck_bin, tmp_path):
    script = write(
        tmp_path,
        "subclasses.py",
        """\
        import torch

        class Tagged(torch.Tensor):
            pass

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)

            def forward(self, x):
                for make in (lambda: x.as_subclass(Tagged), lambda: x.to_sparse(),
                             lambda: torch.empty(x.shape, device="meta"),
                             lambda: torch.nested.nested_tensor([x[0], x[1, :2]]),
                             lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)):
                    self.emit(make)
                return self.lin(x)

            def emit(self, make):
                return self.inner(make)

        class Emit(torch.nn.Module):
            def forward(self, make):
                return make()

        torch.manual_seed(0)
        model = Model()
        model.inner = Emit()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            model(torch.arange(6, dtype=torch.float32).reshape(2, 3)).sum().backward()
            opt.step()
        """,
    )
    run = check(
        detcheck_bin,
        "--ranks",
        "1",
        "--steps",
        "2",
        "--",
        "python3",
        script,
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    assert run.scenarios["subclasses"]["status"] == "passed", run.out


#: The full tier (docs/testing.md): CI checks the tensor-parallel dump, whose Replicate bias is
#: compared across ranks beside its sharded weights, and FSDP1's flat parameters; FSDP2's
#: placements are read in CI by test_a_sharded_record_carries_its_placement_in_the_trace.
FULL_SHARDS = pytest.mark.full(
    covered_by="test_real_scripts.py::test_sharded_records_are_local_shards_and_only_replicate_placements_are_replicated"
)


@pytest.mark.parametrize(
    "scenario, replicated",
    [
        # every parameter is Shard(0): none may be compared across ranks
        pytest.param("fsdp2", set(), marks=FULL_SHARDS),
        ("fsdp1", set()),  # flat parameters: each rank's shard
        (
            "tensor_parallel",
            {"init/fc2.bias", "grad/fc2.bias", "param/fc2.bias", "end/fc2.bias"},
        ),  # RowwiseParallel's Replicate bias (before the first step, after, at the end)
    ],
)
def test_sharded_records_are_local_shards_and_only_replicate_placements_are_replicated(
    detcheck_bin, tmp_path, scenario, replicated
):
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        CORPUS / f"{scenario}.json",
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    for rank in (0, 1):
        records = decode(dump / f"rank{rank}.dctrace")
        assert {r["name"] for r in records if r["replicated"]} == replicated, rank
        assert any(r["name"].startswith("grad/") for r in records)


# The full tier (docs/testing.md): a sharded record's placement, which puts the shards together,
# is checked in CI on FSDP2's dump (and world_sizes' element on the tensor-parallel model).
@pytest.mark.full(
    covered_by="test_real_scripts.py::test_a_sharded_record_carries_its_placement_in_the_trace"
)
def test_fsdp2_shards_are_put_together_and_compared_across_world_sizes(detcheck_bin, tmp_path):
    # Every rank on the same full batch: world sizes 1 and 2 are bitwise equal as global
    # tensors (fsdp2_world_sizes, in the corpus test too). The planted control adds 1e-3 to the
    # first element of rank 1's shard of `out.weight` (vocab 64 x dim 32, Shard(0): rank 1 holds
    # rows 32..64), and world_sizes names that record and its global element.
    control = CORPUS / "control_fsdp2_perturbed_shard.json"
    run = check(detcheck_bin, control, cwd=tmp_path, timeout=900)  # diagnosis names the element
    line = run.scenarios["control_fsdp2_perturbed_shard"]
    first = caught_with_element(line)
    assert first["name"].endswith("out.weight"), first
    found = first["element"].get("found") or first["element"]["found_in_reruns"]
    assert (found["index"], found["flat_index"]) == ([32, 0], 32 * 32), found


def test_a_sharded_record_carries_its_placement_in_the_trace(detcheck_bin, tmp_path):
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        CORPUS / "fsdp2_world_sizes.json",
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    text = dctrace(dump / "rank1.dctrace")
    # out.weight [64, 32] on 2 ranks: rank 1 holds rows 32..64.
    assert "shard: global [64, 32] offset [32, 0] extent [32, 32] position " in text, text


# The full tier (docs/testing.md): tensor parallel at other sizes is checked in CI by the TP-size
# check, world_sizes on sharded records by FSDP2's.
@pytest.mark.full(
    covered_by="test_tp_sizes.py::test_a_tensor_parallel_model_differs_from_its_one_rank_self_at_its_all_reduce"
)
def test_tensor_parallel_across_world_sizes_reports_differing_records(detcheck_bin, tmp_path):
    # RowwiseParallel sums two partial products where one rank's matmul sums them in one
    # order: the global tensors are not bitwise equal across world sizes, and the check says
    # which records differ (a failure with a divergence, not an error), and names the
    # all-reduce that adds the parts (the DTensor twin of test_tp_sizes.py).
    run = check(
        detcheck_bin,
        "--launcher",
        "torchrun",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--checks",
        "world_sizes",
        "--world-sizes",
        "1,2",
        "--",
        "python3",
        CORPUS / "tp_train.py",
        cwd=tmp_path,
        timeout=900,
    )
    (line,) = run.scenarios.values()
    assert line["status"] == "failed", run.out
    operator = line["first_divergence"]["operator"]
    assert operator["finding"] == "split_work", operator
    assert operator["collective"]["operator"] == "_c10d_functional.all_reduce.default", operator
