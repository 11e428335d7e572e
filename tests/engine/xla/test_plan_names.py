"""``volsynth plan --model`` names for the large-activation workloads (Med-DDPM 128^3, MAISI v2's latent
U-Net): they build the right planning network without compiling the full size; unknown names still list."""

from __future__ import annotations

import math

import pytest

from engine.models.bundle import _resolve
from engine.xla import convert

jax = jnp = None  # bound by the first test that runs here (tests/engine/xla/conftest.py)


def monai_parameter_count(definition: dict) -> int:
    return sum(p.numel() for p in convert.meta_network(definition).parameters())


def abstract_count(network) -> int:
    return sum(math.prod(s.shape) for s in network.params.values())


def output_shape(network):
    x, t, ctx = network.abstract_inputs()
    return jax.eval_shape(
        lambda p, x, t, c: network.apply(network.arch, p, x, t, c, precision=network.precision),
        network.params,
        x,
        t,
        ctx,
    ).shape


def test_med_ddpm_128_is_the_gpu_checks_pixel_unet():
    from benchmarks.gpu_check import network_defs
    from engine.xla.planning import network_for_model

    network = network_for_model("med-ddpm-128", batch=1, cfg=False)
    checked = network_defs(smoke=False)["med-ddpm-128"]
    assert network.spatial == tuple(checked["input"][2:]) == (128, 128, 128)
    assert network.in_channels == checked["input"][1] == 2 and network.batch == 1
    assert network.levels == 4 and network.context_dim is None
    assert abstract_count(network) == monai_parameter_count(checked["unet"])
    assert output_shape(network) == (1, 128, 128, 128, 1)  # traced, not compiled
    assert network_for_model("med-ddpm-128", batch=2, cfg=True).batch == 4


def test_maisi_v2_brain_is_the_nv_generate_unet_at_its_latent():
    from engine.testing import maisi_definitions
    from engine.xla.planning import network_for_model

    network = network_for_model("maisi-v2-brain", batch=1, cfg=True)
    config = maisi_definitions(tiny=False)  # what write_maisi_folder(tiny=False) writes
    assert isinstance(network.arch, convert.MaisiUNetArch)
    assert network.arch.class_embedding == "class_embedding.weight"
    assert [name for name, _keys in network.arch.input_embeddings] == ["spacing"]
    assert network.spatial == (64, 64, 32) and network.in_channels == 4 and network.batch == 2
    assert network.context_dim == 4  # class label + spacing, packed as the sampling loop passes them
    assert abstract_count(network) == monai_parameter_count(_resolve(config, config["diffusion_unet_def"]))
    assert output_shape(network) == (2, 64, 64, 32, 4)


def test_a_maisi_model_folder_is_planned_with_the_maisi_port(tmp_path):
    from engine.testing import write_maisi_folder
    from engine.xla.planning import network_for_model

    folder = write_maisi_folder(tmp_path / "maisi", dim=(64, 64, 32), docs=False)
    network = network_for_model(str(folder), batch=1, cfg=True)
    assert isinstance(network.arch, convert.MaisiUNetArch) and network.spatial == (16, 16, 8)
    assert output_shape(network) == (2, 16, 16, 8, 4)


def test_the_plan_command_accepts_the_names_and_lists_known_ones_for_others(monkeypatch, capsys):
    from engine.cli import main
    from engine.xla import planner

    seen = []

    def fake_plan(network, topology, **_kwargs):  # the full-size compile is a benchmark's, not a test's
        seen.append(network)
        return planner.PlanResult(
            network.name,
            topology.summary(),
            network.batch,
            network.cfg,
            [],
            0,
            0,
            0,
            0,
            0.0,
            "default",
            None,
            None,
            None,
        )

    monkeypatch.setattr(planner, "plan", fake_plan)
    assert main(["plan", "--model", "med-ddpm-128", "--no-cfg", "--topology", "v5e:2x4"]) == 0
    assert main(["plan", "--model", "maisi-v2-brain", "--topology", "v5e:4x4"]) == 0
    assert "no plan compiled" in capsys.readouterr().out
    assert [(n.name, n.spatial, n.batch) for n in seen] == [
        ("med-ddpm-128", (128, 128, 128), 1),
        ("maisi-v2-brain", (64, 64, 32), 2),
    ]
    assert main(["plan", "--model", "med-ddpm-64", "--topology", "v5e:2x4"]) == 3  # ModelNotFound's code
    err = capsys.readouterr().err
    assert "unknown model 'med-ddpm-64'" in err and "available:" in err
    assert all(name in err for name in ("brain-ldm-bundle", "med-ddpm-128", "maisi-v2-brain"))
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_tiny_maisi_unet_plans_and_compiles_on_a_tpu_slice():
    from engine.testing import maisi_definitions
    from engine.xla.planner import network_from_definition, plan
    from engine.xla.topology import parse_topology

    config = maisi_definitions(tiny=True)
    two_levels = {"num_channels": [8, 16], "attention_levels": [False, True], "num_head_channels": [0, 8]}
    definition = {**_resolve(config, config["diffusion_unet_def"]), **two_levels}
    network = network_from_definition("tiny-maisi", definition, (8, 8, 4))
    result = plan(network, parse_topology("v5e:2x2"), compile_top=1)
    assert result.compiled >= 1 and result.best is not None and result.gain >= 1.0
