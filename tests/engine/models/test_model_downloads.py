"""`volsynth models get/add` against a hub on 127.0.0.1 with the real huggingface_hub client.

The hub (tests/engine/models/hub_server.py) answers HEAD/GET /{repo}/resolve/{revision}/{path} as the Hugging
Face hub does for LFS files; it serves the real catalogue's files (same repositories, names, revisions)
with small seeded weights in the real layouts, so a fetched folder opens and generates.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.cli import main
from engine.errors import ModelInvalid, OutputError
from engine.models import download
from engine.models.catalogue import find_entry, load_catalogue
from engine.models.registry import ModelRegistry
from tests.engine.models.hub_fixtures import (
    MAISI_DIM,
    build_hub_content,
    copy_on_a_stick,
    serve_entries,
    widen_one_tensor,
    write_test_catalogue,
)
from tests.engine.models.hub_server import HubServer

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def content(tmp_path_factory):
    return build_hub_content(tmp_path_factory.mktemp("hub-content"))


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's own data and config folders, and huggingface_hub's, all inside the test's tmp dir."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("VOLSYNTH_MODEL_PATH", raising=False)
    return tmp_path / "data" / "volsynth" / "models"


@pytest.fixture
def hub(content, tmp_path, monkeypatch, user):
    catalogue = write_test_catalogue(tmp_path / "catalogue", content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    with HubServer() as server:
        server.sizes = serve_entries(server.state, content, catalogue)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _generate(models_dir: Path, model_id: str, **fields):
    backend = LocalBackend("cpu", ModelRegistry([models_dir]))
    request = SamplingRequest(model=model_id, steps=2, seed=1, **fields)
    return run(backend.sample(request))


def test_the_shipped_catalogue_names_the_owners_sources_and_facts():
    entries = {e.name: e for e in load_catalogue()}
    nv = entries["nv-generate-mr-brain"]
    assert {(f.repo, f.filename) for f in nv.hub_files} == {
        ("nvidia/NV-Generate-MR-Brain", "models/diff_unet_3d_rflow-mr-brain_v1.pt"),
        ("nvidia/NV-Generate-CT", "models/autoencoder_v1.pt"),
    }
    assert (nv.version, nv.released, nv.licence.name) == ("v1", "2026-08-12", "NVIDIA Open Model License")
    assert nv.makes["guidance_scale"] == 2 and "10" in nv.makes["guidance_note"]
    codes = {m["name"]: m["code"] for m in nv.makes["modalities"]}
    assert codes["mra"] == 16 and codes["mra-skullstripped"] == 33
    assert "mra (all planes)" in nv.not_guaranteed() and "swi (sagittal and coronal)" in nv.not_guaranteed()
    # The shipped config is the one whose guidance scale the catalogue states.
    config = next(f for f in nv.files if f.path.endswith("rflow-mr-brain.json")).shipped
    assert json.loads(config.read_text())["diffusion_unet_inference"]["cfg_guidance_scale"] == 2
    # The shipped copies are the ones the catalogue records (a drifted copy would be refused at download).
    for file in (f for e in entries.values() for f in e.files if f.shipped):
        assert hashlib.sha256(file.shipped.read_bytes()).hexdigest() == file.sha256, file.path
    ldm = entries["brain-ldm"]
    assert {f.repo for f in ldm.hub_files} == {"MONAI/brain_image_synthesis_latent_diffusion_model"}
    # The engine's own estimator: more memory for a larger volume, the weights counted from the networks.
    needs = [n["total"] for n in nv.memory_needs()]
    assert needs == sorted(needs) and needs[0] < needs[-1]
    assert 500e6 < nv.weight_bytes_estimate() < 2e9


@pytest.mark.slow
def test_get_each_entry_then_it_is_listed_and_generates(hub, user, capsys):
    # The bundle's metadata states a licence, as a model-zoo bundle may: it is shown after the get.
    key = ("MONAI/brain_image_synthesis_latent_diffusion_model", "1.0.3", "configs/metadata.json")
    metadata = json.loads(hub.state.files[key])
    hub.state.files[key] = json.dumps({**metadata, "license": "Apache-2.0 (test bundle)"}).encode()
    assert main(["models", "get", "nv-generate-mr-brain", "--accept-licence"]) == 0
    assert main(["models", "get", "brain-ldm", "--accept-licence"]) == 0
    out = capsys.readouterr().out
    assert "installed NV-Generate-MR-Brain" in out and "checked against the hub's LFS SHA-256" in out
    assert "licence: NVIDIA Open Model License (https://www.nvidia.com/" in out
    assert "the bundle's metadata says: license: Apache-2.0 (test bundle)" in out
    served = hub.state.bytes_served
    assert served == sum(len(data) for data in hub.state.files.values())  # each file once, whole
    assert sorted(p.name for p in user.iterdir()) == [
        "brain_image_synthesis_latent_diffusion_model",
        "nv-generate-mr-brain",
    ]  # and no staging folder inside the models folder
    assert main(["models"]) == 0
    listing = capsys.readouterr().out
    assert "nv-generate-mr-brain" in listing and "brain_image_synthesis_latent_diffusion_model" in listing
    assert "[broken" not in listing and "can be fetched" not in listing
    # Where a user picks the modality (--modality), the contrasts NVIDIA does not guarantee are marked.
    assert "quality not guaranteed by its owners: mra (all planes), swi (sagittal and coronal)" in listing
    source = ModelRegistry([user]).get("nv-generate-mr-brain")
    assert source.spec.extra["licence"] == "NVIDIA Open Model License"  # as the loader reads the folder
    nv = _generate(user, "nv-generate-mr-brain", modality="t2w")
    assert nv.volumes.shape[-3:] == MAISI_DIM and nv.volumes.max() > 0
    ldm = _generate(user, "brain_image_synthesis_latent_diffusion_model")
    assert ldm.volumes.shape[-3:] == (32, 64, 32)  # the fixture bundle's output shape
    # The licence acceptance is remembered per model and version: a second get does not ask again.
    accepted = json.loads((user.parents[2] / "config" / "volsynth" / "accepted-licences.json").read_text())
    assert set(accepted) == {"nv-generate-mr-brain@v1", "brain-ldm@1.0.3"}


def test_a_declined_licence_makes_no_request(hub, user, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115 - not a terminal: nobody to say yes
    assert main(["models", "get", "nv-generate-mr-brain"]) != 0
    err = capsys.readouterr().err
    assert "NVIDIA Open Model License was not accepted" in err and "--accept-licence" in err
    assert hub.state.requests == []
    assert not user.exists() or not any(user.iterdir())


def test_a_disk_too_small_is_refused_before_the_first_byte(hub, user, capsys, monkeypatch):
    monkeypatch.setattr(download, "free_disk_bytes", lambda path: 1 << 20)
    assert main(["models", "get", "brain-ldm", "--accept-licence"]) != 0
    err = capsys.readouterr().err.strip()
    assert "needs" in err and "free" in err and len(err.splitlines()) == 1
    assert hub.state.bytes_served == 0 and {m for m, _, _ in hub.state.requests} == {"HEAD"}


def test_a_flipped_byte_is_refused_and_nothing_is_placed(hub, user, capsys):
    hub.state.flipped.add("models/autoencoder_v1.pt")
    assert main(["models", "get", "nv-generate-mr-brain", "--accept-licence"]) != 0
    err = capsys.readouterr().err
    assert "models/autoencoder_v1.pt" in err and "SHA-256" in err and "nothing was placed" in err
    assert not (user / "nv-generate-mr-brain").exists()
    staged = download.staging_dir(user, find_entry("nv-generate-mr-brain"))
    assert not (staged / "models" / "autoencoder_v1.pt").exists()
    assert not (staged / "models" / "autoencoder_v1.pt.part").exists()


def test_a_file_other_than_the_catalogues_sha256_is_refused(content, tmp_path, monkeypatch, user):
    def edit(data):
        data["models"][1]["files"][3]["sha256"] = "0" * 64  # models/model.pt of the bundle

    catalogue = write_test_catalogue(tmp_path / "edited", content, edit)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    with HubServer() as server:
        serve_entries(server.state, content, catalogue)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ModelInvalid, match="models/model.pt .*the catalogue"):
            download.get_model(find_entry("brain-ldm"), accept_licence=True)
    assert not (user / "brain_image_synthesis_latent_diffusion_model").exists()


def test_the_hub_unreachable_gives_the_one_line_offline_error(content, tmp_path, monkeypatch, user, capsys):
    catalogue = write_test_catalogue(tmp_path / "catalogue", content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    with HubServer() as closed:  # a port that was just served and is now closed: nothing listens
        url = closed.url
    monkeypatch.setenv("HF_ENDPOINT", url)
    assert main(["models", "get", "nv-generate-mr-brain", "--accept-licence"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"cannot reach the model hub {url}" in err and "HTTPS_PROXY" in err and "HF_ENDPOINT" in err
    assert "nvidia/NV-Generate-MR-Brain/resolve/main/models/diff_unet_3d_rflow-mr-brain_v1.pt" in err
    assert "volsynth models add FOLDER --model nv-generate-mr-brain" in err


def test_a_kill_mid_file_then_a_resume_fetches_only_the_rest(hub, user, tmp_path):
    entry = find_entry("brain-ldm")
    part = download.staging_dir(user, entry) / "models" / "model.pt.part"
    # The hub sends the first 1 MiB and a bit of model.pt, then holds the rest: the client has written its
    # first 1 MiB (download.WRITE_CHUNK_BYTES) and waits for more when it is killed.
    hub.state.chunk = 16 << 10
    hub.state.stall_after["models/model.pt"] = download.WRITE_CHUNK_BYTES + (32 << 10)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-m", "engine", "models", "get", "brain-ldm", "--accept-licence"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Wait for the event (part of the big file on disk), bounded by steps, not by the clock.
        for _ in range(6000):
            if part.is_file() and part.stat().st_size >= download.WRITE_CHUNK_BYTES:
                break
            if child.poll() is not None:
                pytest.fail(
                    "the download ended before it was killed: " + (tmp_path / "child.err").read_text()
                )
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    kept = part.stat().st_size
    model_size = len(hub.state.files[(entry.hub_files[3].repo, "1.0.3", "models/model.pt")])
    assert 0 < kept < model_size
    assert not (user / entry.folder).exists()  # a half-fetched model is never in the models folder
    seen = len(hub.state.requests)
    placed = download.get_model(entry)  # the licence was accepted by the killed run and remembered
    gets = [
        (path, rng, sent)
        for (method, path, rng), sent in zip(hub.state.requests[seen:], hub.state.served[seen:], strict=True)
        if method == "GET"
    ]
    # Only the rest of the killed file is fetched: one ranged GET; the files finished before it are kept.
    assert gets == [
        (f"/{entry.hub_files[3].repo}/resolve/1.0.3/models/model.pt", f"bytes={kept}-", model_size - kept)
    ]
    assert (placed / "models" / "model.pt").stat().st_size == model_size
    ModelRegistry([user]).get(entry.folder)


def test_add_a_folder_brought_by_hand_is_checked_and_copied(content, tmp_path, monkeypatch, user, capsys):
    catalogue = write_test_catalogue(tmp_path / "catalogue", content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    stick = tmp_path / "stick"
    (stick / "models").mkdir(parents=True)
    for name in ("diff_unet_3d_rflow-mr-brain_v1.pt", "autoencoder_v1.pt"):
        (stick / "models" / name).write_bytes(
            (content["nv-generate-mr-brain"] / "models" / name).read_bytes()
        )
    code = main(["models", "add", str(stick), "--model", "nv-generate-mr-brain", "--accept-licence"])
    assert code == 0, capsys.readouterr().err
    assert "installed NV-Generate-MR-Brain" in capsys.readouterr().out
    assert (stick / "models" / "autoencoder_v1.pt").is_file()  # copied, the stick left as it was
    result = _generate(user, "nv-generate-mr-brain")
    assert result.volumes.shape[-3:] == MAISI_DIM
    # Its SHA-256 was recorded on trust, and said to be: it proves nothing, so it refuses no other copy.
    hashes = download.RecordedHashes()
    entry = find_entry("nv-generate-mr-brain")
    assert hashes.origin(entry, "models/autoencoder_v1.pt") == download.ON_TRUST
    assert main(["models", "remove", "nv-generate-mr-brain"]) == 0
    assert (
        not (user / "nv-generate-mr-brain").exists() and hashes.get(entry, "models/autoencoder_v1.pt") is None
    )


def test_get_refuses_an_installed_model_in_one_line(hub, user):
    download.get_model(find_entry("brain-ldm"), accept_licence=True)
    served = hub.state.bytes_served
    with pytest.raises(OutputError, match="already exists"):
        download.get_model(find_entry("brain-ldm"))
    assert hub.state.bytes_served == served


def test_the_listing_offers_what_can_be_fetched_and_a_typed_yes_accepts(hub, user, capsys, monkeypatch):
    assert main(["models"]) == 0
    listing = capsys.readouterr().out
    assert "nv-generate-mr-brain  [can be fetched: volsynth models get nv-generate-mr-brain]" in listing
    assert "brain-ldm  [can be fetched" in listing and "memory per volume: 128x128x64: about" in listing
    assert "quality not guaranteed by its owners: mra (all planes)" in listing
    assert hub.state.requests == []  # listing asks the hub nothing

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    assert main(["models", "get", "brain-ldm"]) == 0
    out = capsys.readouterr().out
    assert "is under the Apache License 2.0" in out and "installed" in out
    assert download.LicenceAcceptances().accepted(find_entry("brain-ldm"))


def test_add_a_bundle_folder_as_it_is(content, tmp_path, user, capsys):
    assert main(["models", "add", str(content["brain-ldm"])]) == 0, capsys.readouterr().err
    assert (user / content["brain-ldm"].name / "configs" / "inference.json").is_file()
    assert content["brain-ldm"].is_dir()  # the source is left as it was
    ModelRegistry([user]).get(content["brain-ldm"].name)


class _Payload:
    """A checkpoint entry that needs pickled objects: what weights_only=True refuses."""


def test_a_checkpoint_that_needs_pickled_objects_is_refused_and_nothing_is_placed(content, tmp_path, user):
    bundle = tmp_path / "hostile"
    shutil.copytree(content["brain-ldm"], bundle)
    torch.save({"state": _Payload()}, bundle / "models" / "model.pt")
    catalogue = write_test_catalogue(tmp_path / "catalogue", {**content, "brain-ldm": bundle})
    with HubServer() as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
        patch.setenv("HF_ENDPOINT", server.url)
        serve_entries(server.state, {**content, "brain-ldm": bundle}, catalogue)
        with pytest.raises(ModelInvalid, match="does not pass VolSynth's checks .*nothing was placed"):
            download.get_model(find_entry("brain-ldm"), accept_licence=True)
    entry = find_entry("brain-ldm", catalogue)
    assert not (user / entry.folder).exists() and not download.staging_dir(user, entry).exists()


def test_a_connection_lost_mid_file_resumes_in_the_same_run(hub, user, monkeypatch):
    monkeypatch.setattr(download, "WRITE_CHUNK_BYTES", 16 << 10)  # scaled to the 1 MB fixture weights
    hub.state.chunk = 16 << 10
    hub.state.drop_after["models/model.pt"] = 200 << 10
    entry = find_entry("brain-ldm")
    placed = download.get_model(entry, accept_licence=True)
    gets = [
        (path, rng)
        for (method, path, rng) in hub.state.requests
        if method == "GET" and path.endswith("/models/model.pt")
    ]
    assert len(gets) == 2 and gets[0][1] is None and gets[1][1].startswith("bytes=")
    assert int(gets[1][1][len("bytes=") : -1]) > 0  # the second asks only for what the first did not bring
    size = len(hub.state.files[(entry.hub_files[3].repo, "1.0.3", "models/model.pt")])
    assert (placed / "models" / "model.pt").stat().st_size == size


def test_without_huggingface_hub_get_says_so_in_one_line(hub, user, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as in a build that left it out
    assert main(["models", "get", "brain-ldm", "--accept-licence"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs huggingface_hub" in err and "models add FOLDER" in err
    assert hub.state.requests == []


# ------------------------------------------------------------------- a hub that is not to be trusted (issue 50)


def test_the_token_goes_only_to_the_hubs_host_never_across_a_redirect(hub, user, monkeypatch):
    """The hub answers each file with a 302 to a CDN (another origin), as huggingface.co does for LFS files.
    Before: every GET to the CDN carried the HF_TOKEN (4 of 4)."""
    monkeypatch.setenv("HF_TOKEN", "hf_" + "t" * 34)
    with HubServer(hub.state, name="cdn") as cdn:
        hub.state.redirect_to = cdn.url
        placed = download.get_model(find_entry("brain-ldm"), accept_licence=True)
    assert (placed / "models" / "model.pt").is_file()
    seen = hub.state.authorizations
    assert [a for s, _, a in seen if s == "hub"] and all(
        a == "Bearer hf_" + "t" * 34 for s, _, a in seen if s == "hub"
    )
    cdn_gets = [a for s, m, a in seen if s == "cdn" and m == "GET"]
    assert len(cdn_gets) == 4 and cdn_gets == [None] * 4


@pytest.mark.parametrize("how", ["plain", "gzip"])
def test_no_more_bytes_than_the_hub_announced_are_written(hub, user, monkeypatch, how):
    """Before: the whole over-long answer was written (9.5 MB for the 1.1 MB fixture file; 256 MiB for a 4.3 MB
    file in the issue), then refused by size as "cannot write"."""
    (hub.state.oversend if how == "plain" else hub.state.gzip_oversend)["models/model.pt"] = 8 << 20
    written = []
    real_write = download._CountingFile.write
    monkeypatch.setattr(
        download._CountingFile,
        "write",
        lambda self, data: written.append(len(data)) or real_write(self, data),
    )
    entry = find_entry("brain-ldm")
    size = len(hub.state.files[(entry.hub_files[3].repo, "1.0.3", "models/model.pt")])
    with pytest.raises(ModelInvalid, match="sent more of models/model.pt than") as refused:
        download.get_model(entry, accept_licence=True)
    assert "\n" not in str(refused.value)
    assert sum(written) <= sum(len(d) for k, d in hub.state.files.items() if k[0] == entry.hub_files[3].repo)
    staged = download.staging_dir(user, entry) / "models"
    assert not (staged / "model.pt.part").exists() and not (staged / "model.pt").exists()
    assert size > 0


def test_a_dripping_hub_meets_the_progress_deadline(hub, user, monkeypatch):
    """One byte every 50 ms: the read timeout never fires. Before: the get sat at "0 B" for good."""
    import threading

    monkeypatch.setattr(download, "PROGRESS_WINDOW_S", 0.5)
    monkeypatch.setattr(download, "MIN_WINDOW_BYTES", 64 << 10)
    hub.state.drip_s["configs/inference.json"] = 0.05
    outcome: list[BaseException] = []

    def get():
        try:
            download.get_model(find_entry("brain-ldm"), accept_licence=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=get, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the get was still waiting for a dripping hub after 30 s"
    assert len(outcome) == 1 and isinstance(outcome[0], download.HubTooSlow), outcome
    assert "in the last 0.5 s" in str(outcome[0]) and "resume" in str(outcome[0])


def test_a_full_disk_leaves_no_partial_file_and_says_so(hub, user, monkeypatch):
    import errno

    real_write = download._CountingFile.write
    calls = []

    def write(self, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(download, "WRITE_CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(download._CountingFile, "write", write)
    entry = find_entry("brain-ldm")
    with pytest.raises(OutputError, match="is full") as refused:
        download.get_model(entry, accept_licence=True)
    assert "nothing was placed" in str(refused.value)
    staged = download.staging_dir(user, entry)
    assert not [p for p in staged.rglob("*.part")], "a partial file was left on the full disk"
    assert not (user / entry.folder).exists()


def test_hub_and_catalogue_text_reaches_the_terminal_without_escape_sequences(
    content, tmp_path, monkeypatch, user, capsys
):
    clipboard = "\x1b]52;c;" + "ZWNobyBvd25lZA==" + "\x07"

    def edit(data):
        for entry in data["models"]:
            entry["licence"]["name"] += clipboard
            entry["title"] = "\x1b[2J\x1b[H" + entry["title"]
            entry["licence"]["text"] = "line one\n\x1b[31mred\x1b[0m\x9b2J line two"

    catalogue = write_test_catalogue(tmp_path / "catalogue", content, edit)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115 - nobody to type yes
    assert main(["models"]) == 0
    assert main(["models", "get", "nv-generate-mr-brain"]) != 0
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "NVIDIA Open Model License" in captured.out and "line one\nred line two" in captured.out


def test_two_gets_of_one_model_at_once_the_second_says_the_first_runs(hub, user):
    import threading

    hub.state.stall_after["models/model.pt"] = 0
    entry = find_entry("brain-ldm")
    first: list[object] = []
    worker = threading.Thread(
        target=lambda: first.append(download.get_model(entry, accept_licence=True)), daemon=True
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not any(m == "GET" and p.endswith("/models/model.pt") for m, p, _ in hub.state.requests):
        assert time.monotonic() < deadline and worker.is_alive(), "the first get never reached the weights"
        time.sleep(0.02)
    with pytest.raises(OutputError, match="is being fetched already"):
        download.get_model(entry, accept_licence=True)
    hub.state.release.set()
    worker.join(60)
    assert first and Path(first[0]).is_dir()  # the first one was not disturbed


def test_the_catalogue_and_the_licence_prompt_say_when_the_publisher_pins_nothing(
    hub, user, capsys, monkeypatch
):
    nv = find_entry("nv-generate-mr-brain")
    assert "pins nothing for 2 of its 2 hub files" in nv.pinning_note() and "'main'" in nv.pinning_note()
    assert "pins nothing for 4 of its 4" in find_entry("brain-ldm").pinning_note()
    assert main(["models"]) == 0
    assert "the publisher pins nothing for 2 of its 2 hub files" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115
    assert main(["models", "get", "nv-generate-mr-brain"]) != 0
    assert "Note: the publisher pins nothing" in capsys.readouterr().out


# ------------------------------------------------------------- a copy added by hand is checked (issue 50)


def _stick_with(tmp_path, content, change=None) -> Path:
    return copy_on_a_stick(tmp_path / "stick", content, change)


@pytest.mark.parametrize("case", ["one-tensor-widened", "files-far-too-small"])
def test_a_hand_added_copy_that_is_not_the_configs_network_is_refused(
    content, tmp_path, monkeypatch, user, case
):
    """Before: a 6 MB copy with NVIDIA's file names was installed as NV-Generate-MR-Brain and its SHA-256
    recorded as the trusted reference."""
    catalogue = write_test_catalogue(tmp_path / "catalogue", content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    if case == "one-tensor-widened":
        stick = _stick_with(tmp_path, content, widen_one_tensor)
        match = "the network its config describes needs"
    else:
        stick = _stick_with(
            tmp_path,
            content,
            lambda name, ckpt: (ckpt.clear(), ckpt.update(state_dict={"x": torch.zeros(4)})),
        )
        match = "at 16 bits each.*not this model's file"
    entry = find_entry("nv-generate-mr-brain")
    with pytest.raises(ModelInvalid, match=match) as refused:
        download.add_folder(stick, entry, accept_licence=True)
    assert "\n" not in str(refused.value) and "nothing was installed" in str(refused.value)
    assert not (user / entry.folder).exists()
    assert download.RecordedHashes().get(entry, "models/autoencoder_v1.pt") is None


@pytest.mark.slow
def test_a_hash_recorded_on_trust_never_outranks_the_hubs_and_can_be_forgotten(
    hub, content, tmp_path, user, capsys
):
    """Before: the hash of a hand-added copy ranked above the hub's, so the genuine download was refused."""
    perturbed = _stick_with(
        tmp_path,
        content,
        lambda name, ckpt: [
            t.add_(0.001)
            for t in ckpt.get("state_dict", ckpt).values()
            if getattr(t, "is_floating_point", lambda: False)()
        ],
    )
    assert main(["models", "add", str(perturbed), "--model", "nv-generate-mr-brain", "--accept-licence"]) == 0
    assert "recorded on trust" in capsys.readouterr().out
    assert main(["models", "verify", "nv-generate-mr-brain"]) == 0
    assert "recorded on trust when added by hand" in capsys.readouterr().out
    shutil.rmtree(user / "nv-generate-mr-brain")  # gone by hand: the trusted hashes stay recorded
    entry = find_entry("nv-generate-mr-brain")
    assert download.RecordedHashes().origin(entry, "models/autoencoder_v1.pt") == download.ON_TRUST
    placed = download.get_model(entry, accept_licence=True)  # the genuine files: the hub's hash rules
    provenance = json.loads((placed / download.PROVENANCE_FILE).read_text())
    assert all(
        "the hub's LFS SHA-256" in f["checked_against"]
        for p, f in provenance["files"].items()
        if p.startswith("models/")
    )
    assert download.RecordedHashes().origin(entry, "models/autoencoder_v1.pt") == download.DOWNLOADED
    assert main(["models", "verify", "nv-generate-mr-brain", "--forget-trusted"]) == 0
    out = capsys.readouterr().out
    assert "matches the hash recorded at download" in out and "no hash was recorded on trust" in out, out


@pytest.mark.parametrize("with_model", [True, False], ids=["catalogue-copy", "plain-folder"])
def test_a_link_inside_a_copy_pointing_outside_is_refused_read_or_not(
    content, tmp_path, monkeypatch, user, with_model
):
    catalogue = write_test_catalogue(tmp_path / "catalogue", content)
    monkeypatch.setenv("VOLSYNTH_CATALOGUE", str(catalogue))
    secret = tmp_path / "secret.txt"
    secret.write_text("not a model file")
    if with_model:
        stick = _stick_with(tmp_path, content)
    else:
        stick = tmp_path / "stick"
        shutil.copytree(content["brain-ldm"], stick)
    os.symlink(secret, stick / "notes.txt")  # never read by the loader
    entry = find_entry("nv-generate-mr-brain") if with_model else None
    with pytest.raises(ModelInvalid, match="notes.txt .*is a link to .*outside the folder"):
        download.add_folder(stick, entry, accept_licence=True)
    assert not user.exists() or not any(user.iterdir())


def test_weights_that_do_not_fit_their_networks_fail_to_load_with_the_copy_checks_finding(content, tmp_path):
    """Before: a copy placed before the copy check existed failed to generate with torch's "size mismatch"
    message cut off at 300 characters, mid-word."""
    from engine.models.copy_check import CopyMismatch
    from engine.models.registry import open_model_folder

    folder = tmp_path / "nv-generate-mr-brain"
    shutil.copytree(content["nv-generate-mr-brain"], folder)
    wrong = copy_on_a_stick(tmp_path / "stick", content, widen_one_tensor)
    shutil.copyfile(wrong / "models" / "autoencoder_v1.pt", folder / "models" / "autoencoder_v1.pt")
    with pytest.raises(CopyMismatch) as refused:
        open_model_folder(folder).load()
    message = str(refused.value)
    assert message.startswith("cannot load model 'nv-generate-mr-brain': its weights do not fit the networks")
    assert "autoencoder_v1.pt: the autoencoder's tensor" in message and "size mismatch" not in message
    assert (
        message.endswith("remove this copy and install the model again")
        and refused.value.role == "autoencoder"
    )
