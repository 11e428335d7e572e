"""engine.backends.make_backend: one factory from a device name (or a server address) to a backend."""

from __future__ import annotations

import builtins

import pytest

from engine.api import Backend
from engine.backends import LocalBackend, is_xla_device, make_backend
from engine.backends.remote import RemoteBackend
from engine.errors import BackendUnavailable


@pytest.mark.parametrize("device", ["cpu", "CPU", " cpu ", "auto", None])
def test_torch_devices_make_a_local_backend(device):
    backend = make_backend(device)
    assert isinstance(backend, LocalBackend) and isinstance(backend, Backend)
    assert backend.device.type == "cpu"


def test_the_registry_reaches_the_local_backend():
    from engine.models.registry import ModelRegistry

    registry = ModelRegistry()
    assert make_backend("cpu", registry=registry).registry is registry


def test_an_unknown_device_is_refused_as_before():
    with pytest.raises(BackendUnavailable, match="unknown device"):
        make_backend("floppy")


@pytest.mark.parametrize(("device", "xla"), [("xla", True), ("TPU", True), (" xla ", True), ("cpu", False)])
def test_xla_names(device, xla):
    assert is_xla_device(device) is xla


def test_xla_and_tpu_make_the_xla_backend(monkeypatch):
    made = []

    class FakeXla:
        def __init__(self, registry=None, precision="highest"):
            made.append((registry, precision))

    monkeypatch.setattr("engine.backends.xla.XlaBackend", FakeXla)
    assert isinstance(make_backend("xla", xla_precision="default"), FakeXla)
    assert isinstance(make_backend("tpu"), FakeXla)
    assert made == [(None, "default"), (None, "highest")]


def test_xla_without_jax_says_what_to_install(monkeypatch):
    import sys

    real_import = builtins.__import__

    def no_jax(name, *args, **kwargs):
        if name == "engine.backends.xla" or name.startswith("jax"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="jax")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "engine.backends.xla", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_jax)
    with pytest.raises(BackendUnavailable, match=r"volsynth-studio\[xla\]"):
        make_backend("xla")


def test_a_server_address_makes_a_remote_backend():
    backend = make_backend(server="http://127.0.0.1:9", token="t", timeout_s=2.0)
    assert isinstance(backend, RemoteBackend)
    assert backend.url == "http://127.0.0.1:9"
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def test_a_server_address_is_checked_like_before():
    from engine.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="refusing to send the token"):
        make_backend(server="http://gpu-box:8765", token="secret")
