"""A Ray driver started as the cohort runner starts one (test_local_ray.py)."""

import json
import os
import sys

import ray

from engine.cohort.runner import start_ray

start_ray(num_cpus=1)


@ray.remote
def worker_pid():
    return os.getpid()


pid = ray.get(worker_pid.remote())  # a worker process exists too
print(json.dumps({"worker": pid, "token": os.environ["RAY_AUTH_TOKEN_PATH"]}), flush=True)
sys.stdin.read()  # until the test kills this driver
