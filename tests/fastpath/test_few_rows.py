"""The few-row kernels (`few_rows.c`): `W @ x^T (+ bias)` as torch computes it, by hand on a small case and against
`torch.addmm` across the shapes its blocks split into (odd weight rows, rows not a multiple of 8, widths not a
multiple of 16); the RMSNorm of a few rows as the model's module computes it; when they are used, when not, and why
not; the column decode step on them."""

import os

import pytest
import torch

import grpokit.fastpath.column_step as column
from grpokit.fastpath import few_rows

needs_kernel = pytest.mark.skipif(few_rows.library() is None, reason=f"{few_rows.unavailable_reason()}")


@needs_kernel
def test_a_product_by_hand():
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # (out 3, in 2)
    x = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # two rows
    # column r holds weight @ x[r]: [1 + 2, 3 + 4, 5 + 6] and [2, 4, 6]
    assert torch.equal(few_rows.mm(weight, x), torch.tensor([[3.0, 2.0], [7.0, 4.0], [11.0, 6.0]]))
    bias = torch.tensor([10.0, 20.0, 30.0])
    assert torch.equal(few_rows.mm(weight, x, bias), torch.tensor([[13.0, 12.0], [27.0, 24.0], [41.0, 36.0]]))
    assert torch.equal(few_rows.mm(weight, x, bias[:, None]), few_rows.mm(weight, x, bias))  # the column form too


@needs_kernel
@pytest.mark.parametrize("out_features", [1, 2, 7, 64, 1536])
@pytest.mark.parametrize("in_features", [1, 15, 16, 17, 33, 576, 1536])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 17, 24, 32])
def test_equals_torch_up_to_rounding(out_features, in_features, rows):
    torch.manual_seed(out_features * 1000 + in_features * 10 + rows)
    weight, x, bias = torch.randn(out_features, in_features), torch.randn(rows, in_features), torch.randn(out_features)
    for b in (None, bias):
        expected = torch.mm(weight, x.t()) if b is None else torch.addmm(b[:, None], weight, x.t())
        got = few_rows.mm(weight, x, b)
        assert got.shape == (out_features, rows) and got.is_contiguous()
        # float32 sums of in_features products, summed in another order
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * in_features**0.5)


@needs_kernel
def test_more_threads_than_weight_rows_and_one_thread():
    weight, x = torch.randn(3, 40), torch.randn(5, 40)
    expected = torch.mm(weight, x.t())
    threads = torch.get_num_threads()
    try:
        for n in (1, 4):
            torch.set_num_threads(n)
            assert torch.allclose(few_rows.mm(weight, x), expected, atol=1e-5)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_applies_only_to_what_it_computes():
    weight, x = torch.randn(64, 32), torch.randn(16, 32)
    assert few_rows.applies(weight, x)
    assert not few_rows.applies(weight.bfloat16(), x.bfloat16())  # float32 only
    assert not few_rows.applies(weight, torch.randn(few_rows.MAX_ROWS + 1, 32))  # many rows: BLAS is as fast
    wide = few_rows.MAX_ELEMENTS // 16
    assert few_rows.applies(torch.randn(8, wide), torch.randn(16, wide))
    assert not few_rows.applies(torch.randn(8, wide + 1), torch.randn(16, wide + 1))  # x would not stay in L1
    assert not few_rows.applies(weight, torch.randn(32, 16).t())  # rows not contiguous
    assert not few_rows.applies(weight.t().contiguous().t(), x)  # a transposed weight
    assert not few_rows.applies(torch.nn.Parameter(weight), x)  # autograd would not see the product
    with torch.no_grad():
        assert few_rows.applies(torch.nn.Parameter(weight), x)


def test_why_it_cannot_be_used():
    cpu = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"
    assert few_rows.unavailable_reason({"GRPOKIT_CPU_KERNELS": "0"}, cpu) == "GRPOKIT_CPU_KERNELS is off"
    if few_rows.unavailable_reason({}, cpu) is not None:  # not Linux x86-64, or no compiler
        pytest.skip(few_rows.unavailable_reason({}, cpu))
    assert few_rows.unavailable_reason({}, cpu.replace(" avx512f", "")) == "this CPU has no AVX-512F"
    no_compiler = {"CC": "/nonexistent/cc"}
    assert few_rows.unavailable_reason(no_compiler, cpu) == "no C compiler (set CC, or install gcc)"


def test_built_into_grpokits_cache(tmp_path):
    assert few_rows.cache_dir({"GRPOKIT_CACHE": str(tmp_path)}) == tmp_path / "kernels"
    assert few_rows.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "grpokit" / "kernels"


@needs_kernel
def test_built_once_and_reused(tmp_path):
    cc = few_rows.compiler()
    first = few_rows.build(cc, tmp_path)
    built = first.stat().st_mtime_ns
    assert few_rows.build(cc, tmp_path) == first and first.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no scratch left behind


def test_a_build_error_is_reported(tmp_path, monkeypatch):
    if few_rows.compiler() is None:
        pytest.skip("no C compiler")
    broken = tmp_path / "few_rows.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(few_rows, "SOURCE", broken)
    with pytest.raises(RuntimeError, match="failed"):
        few_rows.build(few_rows.compiler(), tmp_path / "kernels")
    assert list((tmp_path / "kernels").iterdir()) == []


def one_column_step(model, rows):
    """The column step's next-token logits for `rows` (each a row of one of two prompts) and the model's own."""
    from grpokit.fastpath.kv_cache import buffered_cache
    from tests.fastpath.test_column_step import model_step, prefill

    prompts = torch.randint(2, 40, (2, 5))
    mask = torch.ones_like(prompts)
    cache, last = prefill(model, prompts, mask)
    tokens = torch.randint(2, 40, (rows.numel(),))
    mask, positions = torch.nn.functional.pad(mask[rows], (0, 1), value=1), last[rows] + 1
    with torch.no_grad():
        got = column.ColumnStep(model)(tokens, positions, mask, buffered_cache(cache, rows, capacity=8))
        expected = model_step(model, tokens, positions, mask, buffered_cache(cache, rows, capacity=8))
    return got, expected


@needs_kernel
def test_the_column_step_multiplies_on_it(monkeypatch):
    from tests.fastpath.test_column_step import lively, llama_with_biases

    model = lively(llama_with_biases())  # biases on q/k/v, o and the MLP
    calls = []
    real = few_rows.mm
    monkeypatch.setattr(few_rows, "mm", lambda *a: calls.append(a[0].shape) or real(*a))
    got, expected = one_column_step(model, torch.tensor([0, 0, 1, 1]))
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    # per layer: q/k/v stacked, o, gate, up, down; then the LM head
    assert len(calls) == 2 * 5 + 1 and calls[-1] == model.lm_head.weight.shape


@needs_kernel
def test_silu_times_within_a_few_ulps_of_torch():
    a = torch.cat([torch.linspace(-120, 120, 4800), torch.randn(4800) * 4])
    b = torch.randn(9600)
    expected, got = torch.nn.functional.silu(a) * b, few_rows.silu_mul(a, b)
    ulps = (got - expected).abs() / (expected.abs() * 2**-23)
    assert ulps[expected.abs() > 1e-30].max() <= 4  # two roundings (SiLU, the product) of ~1 ulp each, both sides
    assert (got - expected).abs().max() < 1e-6  # and where SiLU underflows, both are about 0
    assert torch.equal(few_rows.silu_mul(torch.zeros(16), torch.ones(16)), torch.zeros(16))  # silu(0) = 0
    with pytest.raises(ValueError, match="multiple of 16"):
        few_rows.silu_mul(torch.zeros(15), torch.zeros(15))


@needs_kernel
@pytest.mark.parametrize("in_features", [17, 576])
def test_gated_equals_silu_of_gate_times_up(in_features):
    torch.manual_seed(in_features)
    gate, up, x = torch.randn(37, in_features), torch.randn(37, in_features), torch.randn(16, in_features)
    expected = torch.nn.functional.silu(x @ gate.t()) * (x @ up.t())  # (rows, out)
    got = few_rows.gated(gate, up, x)
    assert got.shape == (16, 37) and got.is_contiguous()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * in_features)
    assert few_rows.gated_applies(gate, up, x)
    assert not few_rows.gated_applies(gate, up, x[:15])  # its block is 16 rows


@needs_kernel
def test_the_column_step_runs_the_gated_half_of_the_mlp_on_it(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.fastpath.test_column_step import lively

    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )  # no biases: gate, up and SiLU fuse
    model = lively(LlamaForCausalLM(config))
    calls = []
    real = few_rows.gated
    monkeypatch.setattr(few_rows, "gated", lambda *a: calls.append(a[0].shape) or real(*a))
    got, expected = one_column_step(model, torch.arange(2).repeat_interleave(8))  # 16 rows: the gated block
    assert torch.allclose(got, expected, atol=5e-5, rtol=1e-5)  # logits up to ~5: float32 rounding
    assert calls == [model.model.layers[0].mlp.gate_proj.weight.shape] * 2  # once per layer


@needs_kernel
def test_rms_norm_by_hand_and_as_the_module():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, weight = torch.tensor([[3.0, 4.0], [0.0, 0.0]]), torch.tensor([1.0, 2.0])
    # row 1: mean of squares 12.5, so x / sqrt(12.5) = [0.8485, 1.1314], times the weight; row 2 (eps 1e-6): zeros
    expected = torch.tensor([[3.0, 8.0], [0.0, 0.0]]) / 12.5**0.5
    assert torch.allclose(few_rows.rms_norm(x, weight, 1e-6), expected, atol=1e-6)
    for rows, hidden in [(1, 576), (16, 576), (5, 17), (24, 1)]:
        norm = LlamaRMSNorm(hidden, eps=1e-5)
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.5)
            x = torch.randn(rows, hidden) * 3
            assert few_rows.rms_norm_applies(x, norm.weight)
            assert torch.allclose(few_rows.rms_norm(x, norm.weight, 1e-5), norm(x), atol=1e-6, rtol=1e-5)
    assert not few_rows.rms_norm_applies(x, norm.weight)  # outside no_grad: the weight wants a gradient
    with torch.no_grad():
        assert not few_rows.rms_norm_applies(x.bfloat16(), norm.weight)
        assert not few_rows.rms_norm_applies(torch.randn(few_rows.MAX_ROWS + 1, hidden), norm.weight)


def test_switched_off_the_step_uses_torch(monkeypatch):
    monkeypatch.setitem(os.environ, "GRPOKIT_CPU_KERNELS", "0")
    few_rows.library.cache_clear()
    try:
        assert few_rows.library() is None
        assert not few_rows.applies(torch.randn(8, 4), torch.randn(2, 4))
        assert not few_rows.rms_norm_applies(torch.randn(2, 4), torch.ones(4))
    finally:
        monkeypatch.delitem(os.environ, "GRPOKIT_CPU_KERNELS")
        few_rows.library.cache_clear()
