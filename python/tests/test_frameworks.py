"""The framework callbacks: `detcheck.hf.DetcheckCallback` on a real `transformers.Trainer` and
`detcheck.lightning.DetcheckCallback` on a real Lightning `Trainer`, each with gradient
accumulation: one detcheck step per optimizer update, every module's output, the gradients the
update uses and the parameters it made, and the writer closed at the end. Each program runs in a
fresh interpreter (accelerate's and Lightning's state is process-wide). Skipped without the
frameworks unless DETCHECK_REQUIRE_FRAMEWORKS is set (CI sets it)."""

import pytest
from support import PROGRAMS, check, decode, requires, run_python


def steps_of(records):
    by_step = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r["name"])
    return by_step


TRAINER = """
    import json, sys, torch, detcheck
    from transformers import Trainer, TrainingArguments
    from detcheck.hf import DetcheckCallback
    dump, work = sys.argv[1], sys.argv[2]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": (self.fc(x).squeeze(-1) - labels).pow(2).mean()}

    data = [{"x": torch.randn(4, generator=torch.Generator().manual_seed(i)),
             "labels": torch.tensor(float(i % 3))} for i in range(16)]
    args = TrainingArguments(output_dir=work, max_steps=3, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", seed=0)
    writer = detcheck.TraceWriter(dump, 0, 1)
    callback = DetcheckCallback(writer)
    Trainer(model=Model(), args=args, train_dataset=data, callbacks=[callback]).train()
    assert callback.handle is None, "hooks removed at the end"
    writer.close()
    print(json.dumps({"ok": True}))
"""


def test_trainer_callback_records_one_step_per_update(tmp_path):
    requires("transformers")
    requires("accelerate")
    run_python(tmp_path, TRAINER, tmp_path / "dump", tmp_path / "work")
    by_step = steps_of(decode(tmp_path / "dump" / "rank0.dctrace"))
    assert sorted(by_step) == [0, 1, 2], by_step  # max_steps=3 updates
    for names in by_step.values():
        # two micro-batches per update: the model's output (its loss) twice, then the update's
        assert names == [
            "fwd/fc",
            "fwd/(model).loss",
            "loss",
            "fwd/fc",
            "fwd/(model).loss",
            "loss",
            "grad/fc.weight",
            "grad/fc.bias",
            "param/fc.weight",
            "param/fc.bias",
        ], names


LIGHTNING = """
    import json, sys, torch, detcheck
    import lightning.pytorch as pl
    from detcheck.lightning import DetcheckCallback
    dump, work = sys.argv[1], sys.argv[2]

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return (self.fc(x).squeeze(-1) - y).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(16, 4, generator=g), torch.randn(16, generator=g)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    writer = detcheck.TraceWriter(dump, 0, 1)
    callback = DetcheckCallback(writer)
    trainer = pl.Trainer(max_steps=3, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=work, callbacks=[callback])
    torch.manual_seed(0)
    trainer.fit(Module(), loader)
    writer.close()
    print(json.dumps({"ok": True}))
"""


def test_lightning_callback_records_one_step_per_update(tmp_path):
    requires("lightning")
    run_python(tmp_path, LIGHTNING, tmp_path / "dump", tmp_path / "work")
    by_step = steps_of(decode(tmp_path / "dump" / "rank0.dctrace"))
    assert sorted(by_step) == [0, 1, 2], by_step
    for names in by_step.values():
        assert names == [
            "fwd/fc",
            "loss",
            "fwd/fc",
            "grad/fc.weight",
            "grad/fc.bias",
            "param/fc.weight",
            "param/fc.bias",
            "loss",
        ], names


FRAMEWORKS = PROGRAMS / "frameworks"


#: Each framework's example and its control, checked as one command per framework (two
#: workers share them: a check of the Trainer's takes minutes).
FRAMEWORK_PAIRS = {
    "transformers": ("gpt2_trainer", "control_gpt2_clock_dropout"),
    "lightning": ("lightning_module", "control_lightning_clock_dropout"),
}


@pytest.mark.parametrize(
    "framework",
    [
        # The full tier (docs/testing.md): the Trainer's callback is checked in CI by the test
        # above (its example and control under torchrun: test_zero_change.py's full tier); the
        # zoo's Lightning program, Lightning's own ranks.
        pytest.param(
            "lightning",
            marks=pytest.mark.full(
                covered_by="test_zoo.py::test_lightning_starting_its_own_ranks_is_checked_at_every_rank"
            ),
        ),
        pytest.param(
            "transformers",
            marks=pytest.mark.full(
                covered_by="test_frameworks.py::test_trainer_callback_records_one_step_per_update"
            ),
        ),
    ],
)
def test_the_framework_examples_pass_world_sizes_and_their_controls_are_caught(
    detcheck_bin, framework
):
    """The tiny GPT-2 under `Trainer` and the Lightning module: repeat, replicas and world_sizes
    [1, 2] hold; their clock-seeded dropout controls are caught, the Trainer's down to the
    dropout's operator."""
    requires(framework)
    clean, control = FRAMEWORK_PAIRS[framework]
    assert sorted(p.stem for p in FRAMEWORKS.glob("*.json")) == sorted(
        n for pair in FRAMEWORK_PAIRS.values() for n in pair
    )
    paths = [FRAMEWORKS / f"{name}.json" for name in (clean, control)]
    scenarios = check(detcheck_bin, *paths, code=0).scenarios
    assert sorted(scenarios) == sorted([clean, control])
    checks = {c["check"]: c for c in scenarios[clean]["checks"]}
    assert sorted(checks) == ["repeat", "replicas", "world_sizes"]
    assert all(c["holds"] for c in checks.values()), clean
    assert checks["world_sizes"]["comparison"]["num_compared"] > 0, "gradients compared"
    caught = scenarios[control]
    assert caught["verdict"] == "ok (caught)", caught
    if framework == "transformers":
        first = caught["first_divergence"]
        assert first["name"] == "fwd/transformer.drop", first["name"]
        operator = first["operator"]
        assert operator["finding"] == "nondeterministic", operator
        assert operator["call"]["operator"] == "aten.bernoulli_.float", operator
        assert operator["hint"]["about"] == "bernoulli", operator
