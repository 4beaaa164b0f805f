"""Batch invariance (`detcheck.torch.batch_invariance`, issue 56): a sample's outputs must not
depend on what else is in its batch. Caught and explained on the CPU: a linear layer's `addmm`
at batch 1 against 8, a tiny GPT-2 decoding greedily (transformers, random init, nothing
downloaded), torchvision's resnet18 in eval mode; the fixed-shape fix (padding every batch to
one size) passes on one thread and is caught on two, the thread split named; the fix that needs
no padding (`batch_invariant()`: one sample at a time) passes on one and two threads; a model
that is invariant passes 20 of 20.

Needs torch; the GPT-2 and resnet18 cases need transformers and torchvision (CI installs both).
"""

import pytest
from support import requires, tiny_gpt2

requires("torch")

import detcheck.torch  # noqa: E402
import torch  # noqa: E402  (after `requires`: the module is skipped without torch)


@pytest.fixture
def threads():
    """Sets torch's intra-op threads for one test and puts them back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 16)
    ).eval()


def test_a_linear_layer_is_not_batch_invariant_and_its_addmm_is_named():
    found = detcheck.torch.batch_invariance(mlp(), torch.randn(16, 64), (1, 8))
    assert not found.holds, found
    assert found.first.sample == 0 and found.first.name == "fwd/0", found
    assert found.first.sizes == (1, 8)
    assert 0 < found.first.max_abs_diff < 1e-4, found.first
    assert found.culprit.module == "fwd/0", found
    assert found.operator == "aten.addmm.default", found
    assert found.operator_inputs == ("[256, 1x64, 64x256]", "[256, 8x64, 64x256]"), found
    text = str(found)
    assert "the module that breaks it: `fwd/0`" in text, text
    assert "pad every batch to one fixed size" in text, text


def test_an_invariant_model_passes_20_of_20():
    """Row-wise operations only (no reduction across rows, none whose tiling depends on the
    batch): every row bitwise equal at batch sizes 1, 3 and 8, every time."""
    model = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Softmax(dim=-1)).eval()
    samples = torch.randn(24, 33)
    for _ in range(20):
        found = detcheck.torch.batch_invariance(model, samples, (1, 3, 8))
        assert found.holds, found
        # 3 records (2 modules and the model) of 24 samples, at 2 sizes against the first
        assert found.num_compared == 3 * 24 * 2, found
    assert str(found).startswith("batch invariant: 24 samples at batch sizes 1, 3, 8")


def greedy(model, batch):
    return model.generate(
        batch, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0
    )


def test_a_tiny_gpt2_decoding_greedily_is_caught_at_its_matrix_product():
    model, prompts = tiny_gpt2()
    found = detcheck.torch.batch_invariance(model, prompts, (1, 8), forward=greedy)
    assert not found.holds, found
    # the first module whose output row differs on equal inputs: a projection's addmm, the
    # prompt's tokens as 6 rows at batch 1 against 48 at batch 8
    assert found.culprit.module.startswith("fwd/transformer.h.0."), found
    assert found.operator == "aten.addmm.default", found
    left, right = found.operator_inputs
    assert "6x64" in left and "48x64" in right, found.operator_inputs


def test_padding_to_one_size_passes_on_one_thread_and_the_thread_split_is_named_on_two(threads):
    model, prompts = tiny_gpt2()
    threads(1)
    for _ in range(3):
        found = detcheck.torch.batch_invariance(model, prompts, (1, 4, 8), forward=greedy, pad_to=8)
        assert found.holds, found
        assert found.num_compared > 1000, found
    threads(2)
    found = detcheck.torch.batch_invariance(model, prompts, (1, 8), forward=greedy, pad_to=8)
    assert not found.holds, found
    # one shape at both sizes: the sample's row is where the threads split the batch
    left, right = found.operator_inputs
    assert left == right, found.operator_inputs
    assert found.first.sample >= 4, found  # rows 4-7: the second thread's half at batch 8
    assert "splits the batch over 2 threads by position" in str(found), found


def test_one_sample_at_a_time_makes_the_tiny_gpt2_invariant_on_one_and_two_threads(threads):
    """The fix offered for shape dependence, verified: `batch_invariant()` around the greedy
    decoding makes every prompt's records bitwise equal at batch sizes 1, 4 and 8, unpadded, on
    one and on two threads, where without it the same decoding is caught (the control)."""
    model, prompts = tiny_gpt2()

    def invariant(model, batch):
        with detcheck.torch.batch_invariant():
            return greedy(model, batch)

    for n in (1, 2):
        threads(n)
        assert not detcheck.torch.batch_invariance(model, prompts, (1, 8), forward=greedy).holds
        found = detcheck.torch.batch_invariance(model, prompts, (1, 4, 8), forward=invariant)
        assert found.holds, found
        assert found.num_compared > 1000, found
    # The report of the control offers it.
    assert "detcheck.torch.batch_invariant()" in str(
        detcheck.torch.batch_invariance(model, prompts, (1, 8), forward=greedy)
    )


def test_resnet18_in_eval_mode_is_caught_at_a_convolution():
    requires("torchvision")
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10).eval()
    found = detcheck.torch.batch_invariance(net, torch.randn(8, 3, 32, 32), (1, 8))
    assert not found.holds, found
    assert found.operator == "aten.convolution.default", found
    assert found.culprit.module.startswith("fwd/layer"), found

    def invariant(model, batch):
        with detcheck.torch.batch_invariant():
            return model(batch)

    found = detcheck.torch.batch_invariance(
        net, torch.randn(8, 3, 32, 32), (1, 8), forward=invariant
    )
    assert found.holds, found


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_sizes"):
        detcheck.torch.batch_invariance(mlp(), torch.randn(8, 64), (8,))
    with pytest.raises(ValueError, match="fewer than the largest batch size 8"):
        detcheck.torch.batch_invariance(mlp(), torch.randn(4, 64), (1, 8))
    with pytest.raises(ValueError, match="pad_to"):
        detcheck.torch.batch_invariance(mlp(), torch.randn(8, 64), (1, 8), pad_to=4)


def test_prefill_and_decode_part_where_a_shape_changes_and_stay_within_rounding():
    """A tiny GPT-2's greedy decoding with its KV cache (what a sampler computes) against one
    forward over the sequence (what a trainer computes): not bitwise equal, parted at the first
    projection (the prompt's rows in another matrix shape), every record within 16 units of
    float32's roundoff, every decoded token the same."""
    model, prompts = tiny_gpt2()
    found = detcheck.torch.prefill_decode_parity(model, prompts[:1], 4, pad_token_id=0)
    assert not found.holds, found
    assert found.culprit.module == "fwd/transformer.h.0.attn.c_attn", found
    # inside it, the operator: the prompt's 6 rows in the prefill's matrix, 9 in the forward's
    assert found.operator == "aten.addmm.default", found
    left, right = found.operator_inputs
    assert "6x64" in left and "9x64" in right, found.operator_inputs
    assert "operator: `aten.addmm.default`" in str(found), found
    assert found.aligned and 0 < found.worst_units <= 16, found
    assert [position for position, *_ in found.logits] == [6, 7, 8], found.logits
    assert all(same for *_, same in found.logits), found.logits
    assert "within rounding" in str(found), found


def test_a_decoding_step_that_computes_otherwise_is_named_beyond_rounding():
    """A planted bug: the first block's activation is exact GELU in a decoding step (one
    position) and GPT-2's tanh approximation in the forward: beyond rounding, and named."""
    model, prompts = tiny_gpt2()
    act = model.transformer.h[0].mlp.act

    def exact_in_decoding(module, args, output):
        x = args[0]
        return torch.nn.functional.gelu(x) if x.shape[1] == 1 else output

    act.register_forward_hook(exact_in_decoding)
    found = detcheck.torch.prefill_decode_parity(model, prompts[:1], 4, pad_token_id=0)
    assert not found.aligned and found.worst_units > 16, found
    beyond = found.first_beyond
    assert beyond.module == "fwd/transformer.h.0.mlp.act" and beyond.call == 1, found
    assert beyond.positions == (6, 6), beyond
    assert "first beyond rounding: `fwd/transformer.h.0.mlp.act` at position 6" in str(found)
