"""The native BERT path (batch_worker.engines.native_bert): the same token ids and hidden states as
transformers' tokenizer and BertModel, the engine picks it only where it applies (and says why not
otherwise), and a worker process that embeds with it never imports transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from batch_contract.engine_config import EncoderConfig, WorkerSettings
from batch_worker.engines import native_bert as nb
from batch_worker.engines.encoder import EncoderEngine, default_model_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(default_model_path())


def _sample_texts(n: int) -> list[str]:
    path = next((ROOT / "data" / "sample").glob("*.parquet"))
    return [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t][:n]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL, local_files_only=True)


def _ids(backend, texts: list[str], max_length: int = 512) -> list[list[int]]:
    """Token ids as the engine asks for them: no padding, truncation at ``max_length``."""
    backend.no_padding()
    backend.enable_truncation(max_length=max_length)
    return [e.ids for e in backend.encode_batch(texts)]


def _copy_model(tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(MODEL, out)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=8))
def test_token_ids_equal_transformers(hf_tokenizer, texts: list[str]) -> None:
    native = nb.NativeTokenizer(MODEL).backend
    assert _ids(native, texts, 64) == _ids(hf_tokenizer.backend_tokenizer, texts, 64)


def test_sample_token_ids_and_pad_id_equal_transformers(hf_tokenizer) -> None:
    texts = _sample_texts(200)
    native = nb.NativeTokenizer(MODEL)
    assert native.pad_token_id == hf_tokenizer.pad_token_id
    assert native.model_max_length == hf_tokenizer.model_max_length
    assert _ids(native.backend, texts) == _ids(hf_tokenizer.backend_tokenizer, texts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hidden_states_equal_bert_model(hf_tokenizer, dtype) -> None:
    from transformers import AutoModel

    texts = _sample_texts(24) + ["a", "short one", "x " * 300]  # mixed lengths: padding and truncation
    enc = hf_tokenizer(texts, padding=True, truncation=True, max_length=160, return_tensors="pt")
    reference = AutoModel.from_pretrained(MODEL, dtype=dtype, local_files_only=True).eval()
    native = nb.load_native(MODEL, dtype)
    with torch.inference_mode():
        want = reference(**enc).last_hidden_state.float()
        got = native(enc["input_ids"], enc["attention_mask"]).last_hidden_state.float()
    real = enc["attention_mask"].bool()
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert torch.allclose(got[real], want[real], atol=tol, rtol=0)
    assert float(torch.nn.functional.cosine_similarity(got[real], want[real]).min()) > 0.999


def test_prefixed_checkpoint_loads_and_extra_heads_are_dropped(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    model_dir = _copy_model(tmp_path)
    state = load_file(str(MODEL / nb.WEIGHTS_FILE))
    prefixed = {f"bert.{k}": v.contiguous() for k, v in state.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(3)
    save_file(prefixed, str(model_dir / nb.WEIGHTS_FILE))
    a, b = nb.load_native(MODEL, torch.float32), nb.load_native(model_dir, torch.float32)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_checkpoint_missing_a_layer_is_a_clear_error(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    model_dir = _copy_model(tmp_path)
    state = {k: v for k, v in load_file(str(MODEL / nb.WEIGHTS_FILE)).items() if ".layer.5." not in k}
    save_file(state, str(model_dir / nb.WEIGHTS_FILE))
    with pytest.raises(ValueError, match="missing"):
        nb.load_native(model_dir, torch.float32)


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, reason", [
    (lambda d: _edit_json(d / "config.json", model_type="roberta"), "model_type"),
    (lambda d: _edit_json(d / "config.json", position_embedding_type="relative_key"), "position_embedding_type"),
    (lambda d: _edit_json(d / "config.json", hidden_act="relu"), "hidden_act"),
    (lambda d: _edit_json(d / "tokenizer_config.json", do_lower_case=False), "normaliser"),
    (lambda d: (d / nb.WEIGHTS_FILE).rename(d / "other.safetensors"), "model.safetensors"),
    (lambda d: (d / nb.TOKENIZER_FILE).unlink(), "tokenizer.json"),
])
def test_native_support_says_why_not(tmp_path, edit, reason) -> None:
    model_dir = _copy_model(tmp_path)
    assert nb.native_support(model_dir, "embedding", "cpu", False) is None
    edit(model_dir)
    assert reason in (nb.native_support(model_dir, "embedding", "cpu", False) or "")


def test_native_support_by_run_settings() -> None:
    assert nb.native_support(MODEL, "embedding", "cpu", False) is None
    assert "task" in nb.native_support(MODEL, "classification", "cpu", False)
    assert "device" in nb.native_support(MODEL, "embedding", "cuda", False)
    assert "compile" in nb.native_support(MODEL, "embedding", "cpu", True)


def test_engine_falls_back_to_transformers_with_the_reason(tmp_path) -> None:
    model_dir = _copy_model(tmp_path)
    _edit_json(model_dir / "tokenizer_config.json", do_lower_case=False)
    info = EncoderEngine(EncoderConfig(model_path=str(model_dir), dtype="float32"), WorkerSettings()).load().info
    assert info["implementation"] == "transformers"
    assert "normaliser" in info["implementation_reason"]
    native = EncoderEngine(EncoderConfig(dtype="float32"), WorkerSettings()).load().info
    assert native["implementation"] == "native_bert" and "implementation_reason" not in native
    # the fast path applies to both: six linears per layer (transformers' BertModel adds its pooler's)
    assert native["packed_linears"] == 6 * native["num_layers"] == info["packed_linears"] - 1
    assert native["fused_gelu"] == info["fused_gelu"] == native["num_layers"]


WORKER_PROBE = """
import json, sys
from batch_contract.engine_config import EncoderConfig, WorkerSettings
from batch_worker.engines.base import ChunkRows
from batch_worker.engines.encoder import EncoderEngine
import pyarrow as pa
eng = EncoderEngine(EncoderConfig(), WorkerSettings())
info = eng.load().info
texts = ["apt front end", "a library for parsing XML documents quickly"]
rows = ChunkRows(ids=["a", "b"], texts=texts, text_repaired=[False, False], source_uri=["x", "x"],
                 source_row=[0, 1], fields=pa.table({"id": ["a", "b"]}))
out = eng.process(eng.prepare(rows), lambda: False)
print(json.dumps({"implementation": info["implementation"], "rows": out.table.num_rows,
                  "transformers_imported": "transformers" in sys.modules}))
"""


def test_worker_process_embeds_without_importing_transformers() -> None:
    env = {"PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT / 'worker_image'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", WORKER_PROBE], env=env, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"implementation": "native_bert", "rows": 2, "transformers_imported": False}


def test_engine_embeddings_equal_transformers_path(monkeypatch) -> None:
    """End to end through the engine (tokenize, batch, fast path, pool, normalise): the native and the
    transformers implementation give the same embeddings within bf16 rounding."""
    import pyarrow as pa
    from batch_worker.engines.base import ChunkRows

    texts = _sample_texts(64)
    ids = [f"r{i}" for i in range(len(texts))]
    rows = ChunkRows(ids=ids, texts=texts, text_repaired=[False] * len(ids), source_uri=["x"] * len(ids),
                     source_row=list(range(len(ids))), fields=pa.table({"id": ids}))
    out = {}
    for name in ("native_bert", "transformers"):
        if name == "transformers":
            monkeypatch.setattr(nb, "native_support", lambda *a: "the test's reference")
        eng = EncoderEngine(EncoderConfig(), WorkerSettings())
        assert eng.load().info["implementation"] == name
        table = eng.process(eng.prepare(rows), lambda: False).table
        out[name] = dict(zip(table.column("id").to_pylist(), np.asarray(table.column("embedding").to_pylist()), strict=True))
    cos = [float(np.dot(out["native_bert"][i], out["transformers"][i])) for i in ids]
    assert min(cos) > 0.998
