"""The Get Models tests' loopback hub (tests/engine/models/hub_server.py) serving the test catalogue's files."""

from __future__ import annotations

import pytest

from tests.app.generating import generating  # noqa: F401 - the fixture, for this package's tests
from tests.engine.models.hub_fixtures import build_hub_content, serve_entries, write_test_catalogue
from tests.engine.models.hub_server import HubServer


@pytest.fixture(scope="module")
def hub_content(tmp_path_factory):
    """The fixture model files (tiny seeded weights), written once per module: {entry name: folder}."""
    return build_hub_content(tmp_path_factory.mktemp("hub-content"))


@pytest.fixture
def catalogue(hub_content, tmp_path, monkeypatch):
    """The test catalogue, with the user's config (licences, recorded hashes) in this test's folder."""
    path = write_test_catalogue(tmp_path / "catalogue", hub_content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return path


@pytest.fixture
def hub(hub_content, catalogue, monkeypatch):
    """A hub on 127.0.0.1 serving every hub file of the test catalogue (HF_ENDPOINT points at it)."""
    with HubServer() as server:
        server.sizes = serve_entries(server.state, hub_content, catalogue)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def no_hub(catalogue, monkeypatch):
    """HF_ENDPOINT at a loopback port nothing listens on: the hub refuses every connection."""
    with HubServer() as closed:
        url = closed.url
    monkeypatch.setenv("HF_ENDPOINT", url)
    return url
