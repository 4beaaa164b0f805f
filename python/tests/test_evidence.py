"""The evidence of a seed's cause, in process (`detcheck._core.evidence`): a global generator's
draws before anything seeded it, and a seeding call given a value such a draw returned
(pytorch/examples' dcgan: `opt.manualSeed = random.randint(1, 10000)`, then
`torch.manual_seed(opt.manualSeed)`). The launched checks of the zoo's dcgan and regression
rows (test_zoo.py) prove the same end to end."""

import types

import numpy as np
import pytest
from detcheck._core import evidence as ev


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
