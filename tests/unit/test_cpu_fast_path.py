"""The encoder's CPU fast path: batch-chunked attention and packed oneDNN linears, against stock
transformers (SDPA attention, plain ``nn.Linear``) on a small randomly initialised BERT."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from batch_worker.engines import cpu_attention, cpu_linear
from batch_worker.engines.cpu_tuning import OnlineChoice
from batch_worker.engines.encoder import apply_fast_path, cpu_supports_bf16, select_attention
from torch import nn
from transformers import BertConfig, BertModel
from transformers.masking_utils import bidirectional_mask_function


def _tiny_bert(dtype: torch.dtype = torch.float32) -> BertModel:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, attn_implementation="sdpa")
    return BertModel(cfg).eval().to(dtype)


def _batch(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 500, (len(lengths), width), generator=gen)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def _mean_pool(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    m = mask.unsqueeze(-1).float()
    return (hidden * m).sum(1) / m.sum(1)


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 12, 1 << 30], ids=["row_per_step", "several_rows", "one_step"])
def test_chunked_attention_equals_sdpa_with_padding(monkeypatch, chunk_bytes: int) -> None:
    monkeypatch.setattr(cpu_attention, "CHUNK_BYTES", chunk_bytes)
    ref_model = _tiny_bert()
    model = copy.deepcopy(ref_model)
    model.set_attn_implementation(cpu_attention.register())  # in fp32, to compare tightly
    ids, mask = _batch([40, 33, 7, 1, 40], 40)
    torch.testing.assert_close(_mean_pool(model, ids, mask), _mean_pool(ref_model, ids, mask), atol=1e-5, rtol=1e-4)
    full = torch.ones_like(mask)  # no padding: the mask function returns None
    torch.testing.assert_close(_mean_pool(model, ids, full), _mean_pool(ref_model, ids, full), atol=1e-5, rtol=1e-4)


def test_padding_bias_mask_shapes_and_delegation() -> None:
    from transformers.masking_utils import causal_mask_function

    real = torch.tensor([[True, True, False], [True, True, True]])
    bias = cpu_attention.padding_bias_mask(2, 3, 3, mask_function=bidirectional_mask_function,
                                           attention_mask=real, dtype=torch.bfloat16)
    assert bias.shape == (2, 1, 1, 3) and bias.dtype == torch.bfloat16
    assert bias[0, 0, 0].tolist() == [0.0, 0.0, torch.finfo(torch.bfloat16).min] and not bias[1].any()
    assert cpu_attention.padding_bias_mask(2, 3, 3, mask_function=bidirectional_mask_function,
                                           attention_mask=torch.ones(2, 3, dtype=torch.bool)) is None
    causal = cpu_attention.padding_bias_mask(2, 3, 3, mask_function=causal_mask_function, attention_mask=real,
                                             allow_is_causal_skip=False)
    assert causal.dtype == torch.bool and causal.shape == (2, 1, 3, 3)  # transformers' own 4-D mask


def test_attention_outside_the_chunked_path_goes_to_sdpa() -> None:
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    causal = nn.Module()
    causal.is_causal = True
    got, _ = cpu_attention.chunked_attention_forward(causal, q, k, v, None)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(got, want)
    plain = nn.Module()
    got, _ = cpu_attention.chunked_attention_forward(plain, q, k, v, None)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v).transpose(1, 2), atol=1e-5, rtol=1e-4)


def test_select_attention_only_for_native_bf16_on_cpu() -> None:
    assert select_attention(_tiny_bert(torch.bfloat16), "cuda", "bfloat16") == "sdpa"
    assert select_attention(_tiny_bert(), "cpu", "float32") == "sdpa"  # measured no faster in fp32
    native = cpu_supports_bf16()
    want = cpu_attention.ATTENTION_NAME if native else "sdpa"
    assert select_attention(_tiny_bert(torch.bfloat16), "cpu", "bfloat16") == want


@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh"])
def test_packed_linear_equals_linear_and_activation(activation: str) -> None:
    torch.manual_seed(3)
    layer = nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    ref = {"none": layer(x), "gelu": F.gelu(layer(x)), "gelu_tanh": F.gelu(layer(x), approximate="tanh")}[activation]
    with torch.inference_mode():
        torch.testing.assert_close(cpu_linear.PackedLinear(layer, activation)(x), ref.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_bert_matches_stock_bert(dtype: torch.dtype) -> None:
    """Packed where this host's oneDNN runs the dtype (float32 on every x86-64 host; bf16 needs AVX-512BW/
    VL/DQ or AVX-NE-CONVERT, absent on AVX2-only CPUs), else left stock; either way the same outputs."""
    supported = cpu_linear.fast_linear_supported(dtype)
    assert supported or dtype == torch.bfloat16
    ref_model = _tiny_bert(dtype)
    model = copy.deepcopy(ref_model)
    select_attention(model, "cpu", str(dtype).removeprefix("torch."))
    counts = cpu_linear.pack_for_cpu(model, "cpu", dtype)
    if supported:
        assert counts == {"packed": 2 * 6 + 1, "fused_gelu": 2}  # 6 linears per layer and the pooler
        assert isinstance(model.encoder.layer[0].intermediate.intermediate_act_fn, nn.Identity)
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
    else:
        assert counts == {"packed": 0, "fused_gelu": 0}
        assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 2 * 6 + 1
    ids, mask = _batch([30, 12, 30, 2], 32)
    got, want = _mean_pool(model, ids, mask), _mean_pool(ref_model, ids, mask)
    assert F.cosine_similarity(got, want).min() >= (0.99999 if dtype == torch.float32 else 0.999)


def test_pack_for_cpu_leaves_other_devices_and_dtypes_alone() -> None:
    model = _tiny_bert()
    assert cpu_linear.pack_for_cpu(model, "cuda", torch.float32) == {"packed": 0, "fused_gelu": 0}
    assert cpu_linear.pack_for_cpu(model, "cpu", torch.float16) == {"packed": 0, "fused_gelu": 0}
    assert isinstance(model.encoder.layer[0].intermediate.dense, nn.Linear)


def test_failed_probe_means_unsupported(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(cpu_linear.PackedLinear, "forward", broken)
    assert not cpu_linear.fast_linear_supported(torch.float32)


def test_apply_fast_path_reports_what_it_did_and_skips_compiled_models() -> None:
    compiled = _tiny_bert()
    assert apply_fast_path(compiled, "cpu", torch.float32, compiled=True) == {
        "attention": "sdpa", "packed_linears": 0, "fused_gelu": 0}
    assert isinstance(compiled.encoder.layer[0].intermediate.dense, nn.Linear)
    eager = _tiny_bert()
    assert apply_fast_path(eager, "cpu", torch.float32, compiled=False, tune=False) == {
        "attention": "sdpa", "packed_linears": 13, "fused_gelu": 2}
    tuned = apply_fast_path(_tiny_bert(), "cpu", torch.float32, compiled=False)
    assert tuned == {"attention": "sdpa", "packed_linears": 13, "fused_gelu": 2, "linear_choice": {}}


@pytest.mark.parametrize("act, kind", [("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu_new", None),
                                       ("relu", None)])
def test_gelu_fusion_only_for_activations_onednn_computes_the_same(act: str, kind: str | None) -> None:
    from transformers.activations import ACT2FN

    assert cpu_linear._fusable_gelu(ACT2FN[act]) == kind


def test_online_choice_tries_each_candidate_then_keeps_the_fastest_per_key() -> None:
    choice = OnlineChoice(("a", "b", "c"), warmup=1, samples=2)
    cost = {"a": 3.0, "b": 1.0, "c": 2.0}
    names = []
    for _ in range(9):  # 3 candidates x (1 warm-up + 2 samples)
        name, timed = choice.next(64)
        assert timed
        names.append(name)
        choice.record(64, name, cost[name] * 100, work=100)  # per-unit cost, work-normalised
    assert names == ["a", "b", "c"] * 3
    assert choice.chosen == {"64": "b"} and choice.next(64) == ("b", False)
    assert choice.next(128) == ("a", True)  # another key is measured on its own
    choice.record(128, "a", 50.0, work=1)  # a slow warm-up call is discarded, not held against "a"
    assert choice.run(128, 1.0, {"a": lambda: 1, "b": lambda: 2, "c": lambda: 3}) == 2


def test_online_choice_ignores_the_warm_up_call() -> None:
    choice = OnlineChoice(("a", "b"), warmup=1, samples=1)
    for name, seconds in (("a", 9.0), ("b", 2.0), ("a", 1.0), ("b", 2.0)):
        choice.record("k", name, seconds, work=1)
    assert choice.chosen == {"k": "a"}


def test_length_class_and_host_step(monkeypatch) -> None:
    assert [cpu_attention.length_class(n) for n in (1, 16, 17, 32, 33, 512, 513)] == [16, 16, 32, 32, 64, 512, 1024]
    l2 = {"caches": [{"level": 2, "type": "Unified", "size_bytes": 2 << 20, "shared_by": 1}]}
    monkeypatch.setattr(cpu_attention, "host_facts", lambda: l2)
    assert cpu_attention.host_step_bytes(2) == 4 << 20  # one L2 per thread
    monkeypatch.setenv("BATCH_WORKER_THREADS", "1")
    assert cpu_attention.host_step_bytes() == 2 << 20  # the runner's cap, applied after load
    assert cpu_attention.AttentionPlan.for_host(1).steps == {"chunked_2048k": 2 << 20, "chunked_8192k": 8 << 20}
    monkeypatch.setattr(cpu_attention, "host_facts", lambda: {"caches": []})
    assert cpu_attention.host_step_bytes(2) == cpu_attention.CHUNK_BYTES


def test_attention_plan_outputs_equal_sdpa_while_and_after_it_decides() -> None:
    ref_model = _tiny_bert()
    model = copy.deepcopy(ref_model)
    plan = cpu_attention.AttentionPlan({"chunked_1k": 1 << 10, "chunked_1m": 1 << 20})
    model.set_attn_implementation(cpu_attention.register(plan))
    try:
        ids, mask = _batch([40, 33, 7, 1, 40], 40)
        for _ in range(6):  # 2 layers per forward; 3 candidates x 3 calls decide class 64
            torch.testing.assert_close(_mean_pool(model, ids, mask), _mean_pool(ref_model, ids, mask),
                                       atol=1e-5, rtol=1e-4)
        assert set(plan.info()["attention_choice"]) == {"64"}
        assert plan.info()["attention_choice"]["64"] in {"sdpa", "chunked_1k", "chunked_1m"}
    finally:
        cpu_attention.register(None)


@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh"])
def test_tuned_linear_equals_linear_whichever_form_wins(activation: str) -> None:
    torch.manual_seed(3)
    layer = nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    ref = {"none": layer(x), "gelu": F.gelu(layer(x)), "gelu_tanh": F.gelu(layer(x), approximate="tanh")}[activation]
    choice = OnlineChoice(cpu_linear.TunedLinear.CANDIDATES)
    tuned = cpu_linear.TunedLinear(layer, activation, choice)
    with torch.inference_mode():
        for _ in range(7):  # 2 candidates x 3 calls decide, then the winner runs alone
            torch.testing.assert_close(tuned(x), ref.detach(), atol=1e-5, rtol=1e-4)
    winner = choice.chosen[tuned.key]
    assert tuned.key == f"48x80{'' if activation == 'none' else '+' + activation}"
    assert (tuned.weight is None) == (winner == "stock") and (tuned.stock_weight is None) == (winner == "packed")


def test_tuned_bert_matches_stock_bert_and_records_its_choices() -> None:
    ref_model = _tiny_bert()
    model = copy.deepcopy(ref_model)
    choice = OnlineChoice(cpu_linear.TunedLinear.CANDIDATES)
    assert cpu_linear.pack_for_cpu(model, "cpu", torch.float32, choice) == {"packed": 13, "fused_gelu": 2}
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    ids, mask = _batch([30, 12, 30, 2], 32)
    for _ in range(4):
        got, want = _mean_pool(model, ids, mask), _mean_pool(ref_model, ids, mask)
        assert F.cosine_similarity(got, want).min() >= 0.99999
    assert set(choice.chosen) == {"64x64", "64x128+gelu", "128x64"}  # the pooler's 64x64 shares a key
