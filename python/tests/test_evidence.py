"""The evidence of a seed's cause, in process (`detcheck._core.evidence`): a global generator's
draws before anything seeded it, and a seeding call given a value such a draw returned
(pytorch/examples' dcgan: `opt.manualSeed = random.randint(1, 10000)`, then
`torch.manual_seed(opt.manualSeed)`); and the threads a program starts of its own (the evidence
that recording can change what it computes). The launched checks of the zoo's dcgan and regression
rows (test_zoo.py) prove the same end to end."""

import os
import subprocess
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import process

import numpy as np
import pytest
from detcheck._core import evidence as ev
from support import requires


@pytest.fixture
def fresh(monkeypatch):
    """The module's process-wide state, empty, and every caller's line `main.py:46`."""
    monkeypatch.setattr(ev, "_facts", {})
    monkeypatch.setattr(ev, "_unseeded_values", {})
    monkeypatch.setattr(ev, "_seeded_once", set())
    monkeypatch.setattr(ev, "site", lambda frame=None: "main.py:46")


@pytest.mark.parametrize("drawn", [4242, np.int64(4242)], ids=["python int", "numpy int"])
def test_a_seed_drawn_before_seeding_is_traced_to_its_draw(fresh, drawn):
    module = types.SimpleNamespace(randint=lambda a, b: drawn, random=lambda: 0.5)
    ev._note_unseeded_draws(module, ("randint", "random"), "python")
    seed = module.randint(1, 10000)
    assert seed == 4242 and module.randint._detcheck_unseeded
    ev._seed_was_drawn((seed,), {})
    assert ev._facts == {"site:unseeded_python": "main.py:46", "site:seed_drawn": "main.py:46"}


def test_a_chosen_seed_and_draws_after_seeding_are_not_traced(fresh):
    module = types.SimpleNamespace(randint=lambda a, b: 7)
    ev._note_unseeded_draws(module, ("randint",), "numpy")
    ev._seed_was_drawn((1234,), {})  # a constant: no draw gave it
    assert "site:seed_drawn" not in ev._facts
    ev._seeded_once.add("numpy")
    module.randint(0, 10)  # seeded: no longer an unseeded draw
    ev._seed_was_drawn((7,), {})
    assert ev._facts == {}


def test_wrapping_twice_wraps_once(fresh):
    module = types.SimpleNamespace(randint=lambda a, b: 3)
    ev._note_unseeded_draws(module, ("randint",), "python")
    once = module.randint
    ev._note_unseeded_draws(module, ("randint",), "python")
    assert module.randint is once


def test_a_generator_made_without_a_seed_is_noted_with_its_maker(fresh):
    module = types.SimpleNamespace(np_random=lambda seed=None: ("generator", seed))
    ev._note_unseeded_maker(module, "np_random", "gymnasium")
    assert module.np_random(543) == ("generator", 543)
    assert ev._facts == {}
    module.np_random()
    assert ev._facts == {
        "site:unseeded_generator": "main.py:46",
        "site:unseeded_maker": "gymnasium",
    }


def test_a_gymnasium_environment_reset_without_a_seed_is_noted(fresh, monkeypatch):
    """pytorch/examples' reinforce.py without `env.reset(seed=...)` (the zoo's planted row):
    gymnasium makes the environment's generator at its first reset, from OS entropy."""
    gym = requires("gymnasium")
    from gymnasium.utils import seeding

    # The makers wrapped as the start-up hook wraps them, and put back afterwards.
    monkeypatch.setattr(seeding, "np_random", seeding.np_random)
    monkeypatch.setattr(np.random, "default_rng", np.random.default_rng)
    ev.install_unseeded_makers(lambda name, then: then(sys.modules[name]))
    env = gym.make("CartPole-v1")
    env.reset(seed=543)
    env.reset()  # later resets go on from the seeded generator
    assert ev._facts == {}
    gym.make("CartPole-v1").reset()
    assert ev._facts["site:unseeded_maker"] == "gymnasium"


def test_a_thread_the_program_starts_is_noted_and_a_librarys_is_not(monkeypatch):
    """`concurrent` (what makes `repeat` run a program unperturbed, docs/checks.md): nothing is
    claimed before the watch runs; a thread an installed package starts for itself (a logger's
    writer, a loader's pin-memory thread) is not the program's, nor a program `subprocess.run`
    waits for; a thread the program starts, itself or through `concurrent.futures`, is, with its
    line, and so is a program it starts with `subprocess.Popen`."""
    for owner in (threading.Thread, process.BaseProcess):
        monkeypatch.setattr(owner, "start", owner.start)  # restored after the test
    monkeypatch.setattr(subprocess.Popen, "__init__", subprocess.Popen.__init__)
    monkeypatch.setattr(ev, "_CONCURRENT", [None])
    monkeypatch.setattr(ev, "_WATCHING", [False])
    monkeypatch.setattr(ev, "STARTED_BY_TORCH", [0, None])
    assert ev.concurrent() == "not watched"
    ev.install_process_watch()
    assert ev.concurrent() is None
    library = os.path.join(ev._PACKAGES[0], "somelib", "writer.py")
    thread = threading.Thread(target=lambda: None)
    exec(compile("thread.start()", library, "exec"), {"thread": thread})
    thread.join()
    assert ev.concurrent() is None
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # waited for: not beside it
    assert ev.concurrent() is None
    with ThreadPoolExecutor(1) as pool:
        line = sys._getframe().f_lineno + 1
        pool.submit(lambda: None).result()
    assert ev.concurrent().endswith(f"test_evidence.py:{line}"), ev.concurrent()
    monkeypatch.setattr(ev, "_CONCURRENT", [None])
    line = sys._getframe().f_lineno + 1
    subprocess.Popen([sys.executable, "-c", "pass"]).wait()
    assert ev.concurrent().endswith(f"test_evidence.py:{line}"), ev.concurrent()


def test_a_model_a_cli_builds_is_noted_with_its_builder(monkeypatch):
    # LightningCLI builds the model from lightning/pytorch/cli.py (`instantiate_classes`): the
    # program's line is the one that called the CLI (`call_site`), and the builder is noted with
    # it, so that the report's fix is the CLI's own seed (src/diagnose/cause.rs MODEL_BUILDERS).
    monkeypatch.setattr(ev, "_BUILT", {})
    monkeypatch.setattr(ev, "_BUILT_BY", {})
    monkeypatch.setattr(ev, "call_site", lambda frame: "imagenet.py:178")

    class Model:
        def register_parameter(self, *args):  # what only a model's class has
            pass

        def __init__(self):
            ev.note_module_built(sys._getframe())

    built = {}
    cli = compile("model = Model()", "/venv/site-packages/lightning/pytorch/cli.py", "exec")
    exec(cli, {"Model": Model}, built)
    assert ev.built_at(types.SimpleNamespace(modules=lambda: [built["model"]])) == "imagenet.py:178"
    assert ev.built_by("imagenet.py:178") == "LightningCLI"
    # A model the program builds itself has no builder.
    monkeypatch.setattr(ev, "call_site", lambda frame: "train.py:9")
    Model()
    assert ev.built_by("train.py:9") is None
