"""Hugging Face decoder language models, built with transformers' own classes as users build them
(their key/value caches on, the default), import, tune and match PyTorch; and the exported
program's rewrite that makes them import (workloads/torch_prepass.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tvm
from tvm import relax

from workloads import WorkloadError, load_workload

torch = pytest.importorskip("torch")

TOKENS = 16
VOCAB = 100


class CacheLikeConcat(torch.nn.Module):
    """What transformers' DynamicCache does to each layer's keys: concatenates them to an empty (0,)
    tensor, a legacy case ``torch.cat`` skips; and a cast the empty float tensor forces on integers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("empty", torch.tensor([]), persistent=False)

    def forward(self, x, counts):
        keys = torch.cat([self.empty, x.transpose(1, 2)], dim=-2)
        promoted = torch.cat([self.empty, counts, counts], dim=-1)  # int64 with float32: float32
        return keys * 2.0, promoted


class Named(torch.nn.Module):
    def forward(self, x):
        return {"doubled": x * 2, "count": 3, "nothing": None, "pair": (x + 1, x.sum(dim=1))}


def test_a_module_returning_a_dict_gives_its_tensors_in_order():
    workload = load_workload(Named(), example_inputs=[(2, 3)])
    x = np.arange(6, dtype="float32").reshape(2, 3)
    got = _run(workload, x)
    expected = workload.reference(x)
    assert [e.shape for e in expected] == [(2, 3), (2, 3), (2,)]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e)
    np.testing.assert_allclose(expected[2], x.sum(axis=1))


def _run(workload, *inputs):
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def test_an_empty_tensor_concatenated_to_keys_imports_and_matches():
    module = CacheLikeConcat().eval()
    x = np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype("float32")
    counts = np.arange(6, dtype="int64").reshape(2, 3)
    workload = load_workload(module, example_inputs=[torch.from_numpy(x), torch.from_numpy(counts)])
    with torch.no_grad():
        expected = [t.numpy() for t in module(torch.from_numpy(x), torch.from_numpy(counts))]
    got = _run(workload, x, counts)
    assert [g.dtype for g in got] == [e.dtype for e in expected] == [np.float32, np.float32]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_a_failed_import_is_named_and_tvm_native_complaint_stays_off_the_terminal(monkeypatch, capfd, tmp_path):
    import workloads.torch_prepass
    from tuner import tune

    monkeypatch.setattr(workloads.torch_prepass, "prepare_exported_program", lambda exported: exported)
    with pytest.raises(WorkloadError, match="Concat expects all input tensors to have same ndim"):
        tune(
            CacheLikeConcat().eval(),
            example_inputs=[(1, 4, 2, 8), torch.zeros(2, 3, dtype=torch.int64)],
            work_dir=tmp_path,
            progress=False,
        )
    gc.collect()  # a failed importer still alive would say it now
    assert "BlockBuilder destroyed" not in capfd.readouterr().err


def _gpt2():
    import transformers

    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
    return transformers.GPT2Model(config)


def _llama():
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    return transformers.LlamaModel(config)


def _tuned_matches(module, inputs, second, tmp_path):
    """Tune ``module`` (one trial per kernel) and compare its compiled outputs with PyTorch's on
    ``inputs`` and on ``second``."""
    from tuner import tune
    from workloads.torch_prepass import torch_leaves

    result = tune(module, example_inputs=inputs, trials_per_task=1, batch_size=1, work_dir=tmp_path, progress=False)
    references = []
    for given in (inputs, second):
        with torch.no_grad():
            expected = [t.numpy() for t in torch_leaves(module(*given))]
        got = result.run(*[x.numpy() for x in given])
        got = [np.asarray(g) for g in (got if isinstance(got, list | tuple) else [got])]
        assert [g.shape for g in got] == [e.shape for e in expected] == [(1, TOKENS, 64)]
        scale = float(np.abs(expected[0]).max())
        assert 0.1 < scale < 100  # of order 1: a wrong kernel would show
        assert float(np.abs(got[0] - expected[0]).max()) / scale < 1e-3
        references.append(expected[0])
    assert not np.allclose(*references)  # the output follows the input


def _tokens(seed):
    return torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow  # 45 s; Llama's decoder is tuned in CI, GPT-2's import fix tested: out of CI (`pytest -m slow`)
def test_a_tiny_gpt2_imports_tunes_and_matches_pytorch(tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face models need transformers: pip install '.[hf]'")
    from workloads.hf_models import HFOutput

    torch.manual_seed(0)
    model = _gpt2().eval()
    assert model.config.use_cache  # the default: each layer's keys and values go through DynamicCache
    # as the correctness suite calls it: input ids and an attention mask by keyword, the last hidden state
    module = HFOutput(model, ["input_ids", "attention_mask"], ["last_hidden_state"]).eval()
    mask = torch.ones(1, TOKENS, dtype=torch.int64)
    _tuned_matches(module, [_tokens(1), mask], [_tokens(2), mask], tmp_path)


def test_a_tiny_llama_as_users_build_it_imports_tunes_and_matches_pytorch(tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face models need transformers: pip install '.[hf]'")
    torch.manual_seed(0)
    model = _llama().eval()
    assert model.config.use_cache
    # the model itself, called with input ids: it returns a ModelOutput holding the last hidden state and
    # the cache, of which the compiled model returns the tensor
    _tuned_matches(model, [_tokens(1)], [_tokens(2)], tmp_path)
