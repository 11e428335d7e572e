"""A kernel profile taken in a worker thread, as the app does (test_cli.py): nothing may reach the terminal."""

import threading

import engine.api
from engine.api import SamplingRequest
from engine.backends.local import LocalBackend


def run():  # as the app does: a worker thread drives the generator
    request = SamplingRequest(model="tiny-pixel", steps=3, kernel_profile_steps=2)
    result = engine.api.run(LocalBackend(device="cpu").sample(request))
    print("profiled steps", result.provenance["kernel_profile"]["steps"])


worker = threading.Thread(target=run)
worker.start()
worker.join()
