"""The cohort spec: validation with one-line errors, and a fixed, reproducible expansion."""

from __future__ import annotations

import json

import pytest

from engine.cohort.spec import CohortSpec, load_spec
from engine.errors import InvalidRequest
from engine.testing import tiny_spec

MODEL = tiny_spec()  # conditions: brain_volume [900, 1500], ventricle_volume [5, 80]


def spec(**data):
    return CohortSpec.from_dict({"name": "c1", **data})


def test_grid_and_draws_and_seeds_expand_in_a_fixed_order():
    s = spec(
        seeds=3,
        draws=4,
        draw_seed=5,
        conditioning={
            "ventricle_volume": {"grid": {"start": 10, "stop": 70, "num": 3}},
            "brain_volume": {"distribution": "normal", "mean": 1200, "sd": 400},
        },
    )
    items = s.expand(MODEL)
    assert s.count == len(items) == 3 * 4 * 3
    assert [i.participant for i in items[:2]] == ["sub-synth0001", "sub-synth0002"]
    assert sorted({i.conditioning["ventricle_volume"] for i in items}) == [10.0, 40.0, 70.0]
    brains = [i.conditioning["brain_volume"] for i in items]
    assert min(brains) >= 900 and max(brains) <= 1500  # sd 400 would leave the range: clipped
    assert min(brains) == 900 or max(brains) == 1500
    assert len({i.seed for i in items}) == len(items)  # distinct seeds per point by default
    again = CohortSpec.from_dict(json.loads(s.to_json())).expand(MODEL)
    assert [i.to_dict() for i in again] == [i.to_dict() for i in items]
    assert CohortSpec.from_dict(json.loads(s.to_json())).cohort_id == s.cohort_id
    other = spec(seeds=3, draws=4, draw_seed=6, conditioning=s.to_dict()["conditioning"])
    assert other.cohort_id != s.cohort_id
    assert [i.conditioning for i in other.expand(MODEL)] != [i.conditioning for i in items]


def test_paired_seeds_and_seed_lists():
    s = spec(seeds=2, paired_seeds=True, conditioning={"ventricle_volume": [10, 20, 30]})
    assert [i.seed for i in s.expand(MODEL)] == [0, 1] * 3
    s = spec(seeds=[7, 3], conditioning={"brain_volume": 1000})
    assert [(i.seed, i.conditioning) for i in s.expand(MODEL)] == [
        (7, {"brain_volume": 1000.0}),
        (3, {"brain_volume": 1000.0}),
    ]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"colour": "red"}, "unknown cohort setting(s) colour"),
        ({"name": "has space"}, "cohort name must be"),
        ({"seeds": 0}, "seeds must be a whole number from 1"),
        ({"seeds": [1, 1]}, "lists a seed twice"),
        ({"sampler": "euler"}, "unknown sampler 'euler'"),
        ({"draws": 3}, "draws > 1 needs a condition with a distribution"),
        ({"conditioning": {"age": {"values": "old"}}}, "values must be a non-empty list"),
        ({"conditioning": {"age": {"distribution": "beta"}}}, "distribution must be one of normal, uniform"),
        ({"conditioning": {"age": {"distribution": "normal", "mean": 1}}}, "takes exactly mean, sd"),
        ({"conditioning": {"age": {"values": [1], "grid": {}}}}, "exactly one of"),
        ({"output": {"target": "vault"}}, "needs vault = "),
        ({"optimization": {"autocast": "int3"}}, "autocast"),
    ],
)
def test_bad_specs_say_what_is_wrong(data, message):
    with pytest.raises(InvalidRequest, match=None) as info:
        CohortSpec.from_dict({"name": "c1", **data})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_conditions_are_checked_against_the_model():
    with pytest.raises(InvalidRequest, match="has no condition 'age'"):
        spec(conditioning={"age": [40]}).expand(MODEL)
    with pytest.raises(InvalidRequest, match=r"ventricle_volume: 100 outside the model's range \[5, 80\]"):
        spec(conditioning={"ventricle_volume": [20, 100]}).expand(MODEL)


def test_toml_and_json_files(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('name = "t"\nseeds = 2\n[conditioning]\nbrain_volume = { values = [1000, 1100] }\n')
    assert load_spec(toml).count == 4
    js = tmp_path / "c.json"
    js.write_text(json.dumps(load_spec(toml).to_dict()))
    assert load_spec(js).cohort_id == load_spec(toml).cohort_id
    toml.write_text("name = \n")
    with pytest.raises(InvalidRequest, match="c.toml is not valid TOML"):
        load_spec(toml)
    with pytest.raises(InvalidRequest, match="no cohort spec at"):
        load_spec(tmp_path / "missing.toml")


def test_a_model_shipped_to_a_node_without_it_is_unpacked_intact(tmp_path, monkeypatch):
    """Cluster nodes may lack the model folder: the driver packs it, a worker unpacks it (same weights)."""
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    from engine.cohort.runner import _model_here, _pack_model
    from engine.models.registry import open_model_folder
    from engine.testing import make_tiny_model

    model = make_tiny_model(tmp_path / "m", model_id="shipped")
    packed = _pack_model(model)
    assert _model_here(str(model), packed) == str(model)  # present on this node: used in place
    here = _model_here(str(tmp_path / "elsewhere" / "m"), packed)
    assert here != str(model)
    assert open_model_folder(here).weights_sha256() == open_model_folder(model).weights_sha256()
    assert open_model_folder(here).spec.id == "shipped"
    other = _model_here(
        str(tmp_path / "elsewhere" / "m"),
        _pack_model(make_tiny_model(tmp_path / "o", model_id="shipped", seed=1)),
    )
    assert other != here  # same file names and sizes, other weights: not mistaken for the first


# -- hostile spec files (issue 24, point 9): one-line errors, never a traceback, bounded reads -------------


def _spec_error(path) -> str:
    from engine.cohort.spec import load_spec

    with pytest.raises(InvalidRequest) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    return message


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_deeply_nested_spec_is_a_clear_error(tmp_path, suffix):
    depth = 200_000
    path = tmp_path / f"deep{suffix}"
    body = "[" * depth + "]" * depth
    path.write_text(body if suffix == ".json" else f"name = 'x'\nseeds = {body}\n")
    message = _spec_error(path)
    assert path.name in message


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_100000_digit_number_is_a_clear_error(tmp_path, suffix):
    digits = "9" * 100_000
    path = tmp_path / f"big{suffix}"
    path.write_text(
        f'{{"name": "x", "seeds": {digits}}}' if suffix == ".json" else f"name = 'x'\nseeds = {digits}\n"
    )
    message = _spec_error(path)
    assert digits[:200] not in message


def test_a_huge_number_that_parses_is_refused_without_printing_it():
    from engine.cohort.spec import CohortSpec

    for field in ({"seeds": 10**3000}, {"steps": 10**3000}, {"guidance_scale": 10**3000}):
        with pytest.raises(InvalidRequest) as caught:
            CohortSpec.from_dict({"name": "x", "model": "m", **field})
        assert len(str(caught.value)) < 300
    with pytest.raises(InvalidRequest, match="finite number"):
        CohortSpec.from_dict({"name": "x", "model": "m", "conditioning": {"age": 10**3000}})


def test_a_200_mb_spec_is_refused_before_it_is_read(tmp_path):
    import tracemalloc

    path = tmp_path / "huge.toml"
    with open(path, "wb") as fh:
        fh.write(b"name = 'x'\n# ")
        fh.truncate(200 * 2**20)  # sparse: 200 MB that cost no disk
    tracemalloc.start()
    try:
        message = _spec_error(path)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "over 1024 KiB" in message and peak < 8 * 2**20  # read at most 1 MiB + 1 byte


def test_a_fifo_named_like_a_spec_is_refused_at_once(tmp_path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("FIFOs are a POSIX thing")
    path = tmp_path / "spec.toml"
    os.mkfifo(path)
    assert "FIFO" in _spec_error(path)


def test_a_spec_holds_one_request_template_and_keeps_its_cohort_id():
    from engine.api import SamplingRequest

    data = {
        "name": "full",
        "model": "brain-t1-demo",
        "sampler": "ddim",
        "steps": 20,
        "guidance_scale": 3,
        "optimization": {"tf32": True, "autocast": "bf16"},
        "seeds": [11, 42],
        "draws": 2,
        "draw_seed": 5,
        "conditioning": {
            "brain_volume": {"distribution": "normal", "mean": 1300, "sd": 120},
            "ventricle_volume": {"grid": {"start": 20, "stop": 80, "num": 4}},
        },
        "modality": "t2w",
        "output_size": [32, 32, 32],
        "voxel_spacing_mm": [1, 1, 2],
    }
    spec = CohortSpec.from_dict(data)
    assert spec.request == SamplingRequest(
        model="brain-t1-demo",
        sampler="ddim",
        steps=20,
        guidance_scale=3.0,
        optimization={"tf32": True, "autocast": "bf16"},
        modality="t2w",
        output_size=(32, 32, 32),
        voxel_spacing_mm=(1.0, 1.0, 2.0),
    )
    # The file says what it said, and the cohort id is the one the spec had before it held a template: a
    # folder made then resumes (both hashes computed by the spec's earlier code).
    assert CohortSpec.from_dict(json.loads(spec.to_json())) == spec
    assert spec.sha256 == "6b729948c9f609c994ff44d1229239d87d604eec57ad38f76256186308b84761"
    assert CohortSpec.from_dict({"name": "plain"}).sha256 == (
        "8da7ff331e98ce80da294702b0bb817289c037a3a177a8538373c5b887eb273d"
    )
    with pytest.raises(InvalidRequest, match="no seed, conditioning"):
        CohortSpec("c", request=SamplingRequest(seed=3))
