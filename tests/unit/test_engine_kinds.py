"""Every per-engine registry names exactly the :class:`EngineKind` members, and the engine config is
parsed once per manifest and fingerprinted normalised."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from batch_contract import manifest as manifest_mod
from batch_contract.engine_config import ConfigError
from batch_contract.engines import ENGINE_CONFIG_TYPES, engine_config_from_dict, engine_kinds
from batch_contract.enums import EngineKind
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec, config_fingerprint
from batch_inference.params import ENGINES, PARAM_FIELDS
from batch_worker.engines.base import Engine, engine_class, engine_module

KINDS = {k.value for k in EngineKind}
LLM = {"kind": "llm", "model_path": "/models/tiny", "max_tokens": 32}


def test_config_registry_names_every_engine_kind() -> None:
    assert set(ENGINE_CONFIG_TYPES) == set(EngineKind)
    for kind, cls in ENGINE_CONFIG_TYPES.items():
        kind_field = {f.name: f for f in dataclasses.fields(cls)}["kind"]
        assert kind_field.default == kind.value, cls


def test_params_engine_enum_is_every_engine_kind() -> None:
    assert set(ENGINES) == KINDS == set(engine_kinds())
    assert set(PARAM_FIELDS["engine"].enum) == KINDS
    assert PARAM_FIELDS["engine"].default in KINDS


@pytest.mark.parametrize("kind", list(EngineKind))
def test_worker_has_one_engine_class_per_kind(kind: EngineKind) -> None:
    assert engine_module(kind) == f"batch_worker.engines.{kind.value}"
    cls = engine_class(kind.value)
    assert issubclass(cls, Engine) and cls.kind is kind


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="'encoder', 'llm'"):
        engine_config_from_dict({"kind": "diffusion"})
    with pytest.raises(ConfigError, match="engine.kind"):
        engine_class("diffusion")


def _manifest(engine: dict) -> Manifest:
    return Manifest(
        run_id="r1",
        input=InputSpec(uri="/d/x.parquet", format="parquet", id_column="id", text_column="text",
                        files=[InputFile(uri="/d/x.parquet", rows=4)]),
        shards=[ShardSpec("00000", [Segment(0, 0, 4)])],
        engine=engine,
    )


@pytest.mark.parametrize("omitted, explicit", [
    ({"kind": "encoder"}, {"kind": "encoder", "pooling": "auto", "normalize": True, "model_path": None}),
    ({}, {"kind": "encoder"}),
    (LLM, {**LLM, "temperature": 0.0, "user_template": "{{ text }}", "stop": []}),
])
def test_explicit_default_has_the_fingerprint_of_the_omitted_default(omitted: dict, explicit: dict) -> None:
    assert config_fingerprint(explicit) == config_fingerprint(omitted)
    assert _manifest(explicit).config_fingerprint == _manifest(omitted).config_fingerprint


@pytest.mark.parametrize("base, change", [
    ({"kind": "encoder"}, {"pooling": "mean"}),
    ({"kind": "encoder"}, {"model_path": "/models/other"}),
    ({"kind": "encoder"}, {"dtype": "float32"}),
    ({"kind": "encoder"}, {"compile": True}),
    (LLM, {"model_path": "/models/other"}),
    (LLM, {"temperature": 0.5}),
    (LLM, {"enforce_eager": True}),
])
def test_a_real_change_changes_the_fingerprint(base: dict, change: dict) -> None:
    assert config_fingerprint({**base, **change}) != config_fingerprint(base)


@pytest.mark.parametrize("base, change", [
    ({"kind": "encoder"}, {"pad_to_multiple_of": 64}),
    (LLM, {"gpu_memory_utilization": 0.5, "max_num_seqs": 8, "enable_prefix_caching": False}),
])
def test_speed_only_fields_leave_the_fingerprint(base: dict, change: dict) -> None:
    assert config_fingerprint({**base, **change}) == config_fingerprint(base)


def test_manifest_parses_the_engine_config_once_and_stores_it_normalised() -> None:
    raw = _manifest({"kind": "encoder", "pooling": "mean"}).to_json_bytes()
    with mock.patch.object(manifest_mod, "engine_config_from_dict", wraps=engine_config_from_dict) as parse:
        m = Manifest.from_json_bytes(raw)
        assert m.engine_config is m.engine_config
        assert m.engine_config.pooling == "mean" and m.engine["normalize"] is True
    assert parse.call_count == 1
    assert m.config_fingerprint == config_fingerprint(m.engine)
    assert m == Manifest.from_json_bytes(raw) and "_engine_config" not in m.to_dict()


def test_every_number_or_flag_field_of_wrong_type_names_the_field() -> None:
    """A wrong-typed number or flag in engine or worker settings is a ConfigError naming the field
    (it used to surface as a bare TypeError from a range check, retried like a crash)."""
    from dataclasses import fields

    from batch_contract.engine_config import NUMBER_TYPES, ConfigError, EncoderConfig, WorkerSettings
    from batch_contract.llm_config import LLMConfig

    checked = 0
    for cls, where, base in ((EncoderConfig, "engine", {}), (LLMConfig, "engine", {"model_path": "/m"}),
                             (WorkerSettings, "worker", {})):
        for f in fields(cls):
            if str(f.type) not in NUMBER_TYPES:
                continue
            for bad in ("12", [1]) + ((1.5,) if "int" in str(f.type) else ()):
                with pytest.raises(ConfigError, match=rf"^{where}\.{f.name}: "):
                    cls.from_dict({**base, f.name: bad})
                checked += 1
    assert checked > 20
