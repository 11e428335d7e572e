"""``volsynth tune``: measure, on the user's model and this machine, which settings pay; keep the answer.

What is fast depends on the machine (bf16 that doubles the speed on one CPU runs 100x slower on another),
so the app's presets are a view of measurements made here, never of one machine's constants.

How it measures (built on :mod:`engine.measure.bench`: the same timed proxy, one process per row; repeats,
median/IQR and the noise rule from :mod:`engine.measure.harness`):

1. Candidate settings for this device come from :func:`candidate_rows`; settings the optimization report
   predicts not to apply, or to run slower than fp32 (:mod:`engine.machine.probe`), are listed as not
   measured, with the reason, instead of being run (a 60x slower row would eat the whole budget).
2. Each row gets its own worker process (``python -m engine.measure.tune --worker``), which loads the model,
   prepares the settings once (calibration, mixed search, compiles: the *one-off* cost, timed and reported
   apart) and then, on each request, runs the one sampling loop for a few steps at the model's default
   guidance from the same seed and noise and decodes the result.
3. Rounds interleave the rows (the order rotates every round), so a busy spell on this shared machine hits
   every row alike. After each round the noise rule (:mod:`engine.metrics.speed_verdict`) compares every row with fp32
   on the per-round end-to-end estimate; rounds go on until every row is decided or the time budget would
   be exceeded.
4. Per row: U-Net step time (median, IQR; the warm-up step of each run excluded), decode time, an
   end-to-end estimate for a default generation (the model's default steps x the step time + the decode;
   one-off costs apart), its peak memory, and PSNR/SSIM of its volume against fp32's.
5. Rows that change the result by design (step caching, a shorter schedule: ``trades``) cannot be judged on a
   few steps: a step-caching row runs 1 + its interval steps a run (the timed steps then hold its full and
   cached passes in the schedule's proportion), and after the rounds one run of the model's whole default
   schedule for fp32, each caching row and each shorter schedule gives their PSNR/SSIM against fp32's whole
   schedule on the same seed. The rounds leave room in the budget for those runs.

The result is kept per machine fingerprint, model and library versions (:mod:`engine.optimization.tune_store`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from engine.api import Progress
from engine.errors import InvalidRequest
from engine.measure.harness import median_iqr, paired_speed_verdict, rotated, speed_verdict

DEFAULT_BUDGET_S = 120.0
DEFAULT_STEPS = 4  # per measured run: the first warms up, the rest are timed
MIN_ROUNDS = 3
MAX_ROUNDS = 12
TUNE_STAGE = "tune"

# Candidate rows: (name, settings, why it is worth measuring). Presets of the app are measured under their
# own names so the app can label each one measured-here.
CPU_CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {}),
    ("int8+sdpa", {"quantization": "int8", "attention": "sdpa"}),
    ("int8+sdpa+streamed", {"quantization": "int8", "attention": "sdpa", "streamed_decode": True}),
    (
        "int8+sdpa+streamed+dec:int8-cl",
        {
            "quantization": "int8",
            "attention": "sdpa",
            "streamed_decode": True,
            "decoder_quantization": "int8",
            "decoder_channels_last": True,
        },
    ),
    (
        "bf16+sdpa+streamed+dec:bf16-cl",
        {
            "autocast": "bf16",
            "attention": "sdpa",
            "streamed_decode": True,
            "decoder_autocast": "bf16",
            "decoder_channels_last": True,
        },
    ),
    # The mixed plan (int8 except the layers the 40 dB floor needs in float): its search is a one-off cost,
    # kept beside the calibration (engine.optimization.calibration_cache.mixed_plan) and reported apart.
    (
        "mixed+sdpa+streamed",
        {"quantization": "mixed", "attention": "sdpa", "streamed_decode": True, "psnr_budget_db": 40.0},
    ),
    # Where bf16 is native, the mixed plan's float layers and the rest of the step in bf16: the bundle-sized
    # U-Net's fastest row on an AVX-512 BF16 CPU (3.32x fp32 per step at 45.8 dB, against 2.48x without).
    (
        "mixed+bf16+sdpa+streamed+dec:bf16-cl",
        {
            "quantization": "mixed",
            "autocast": "bf16",
            "attention": "sdpa",
            "streamed_decode": True,
            "decoder_autocast": "bf16",
            "decoder_channels_last": True,
            "psnr_budget_db": 40.0,
        },
    ),
    (
        "int8+sdpa+subpixel+streamed",
        {"quantization": "int8", "attention": "sdpa", "unet_subpixel": True, "streamed_decode": True},
    ),
    (
        "int8+sdpa+streamed+dec:bf16-cl",
        {
            "quantization": "int8",
            "attention": "sdpa",
            "streamed_decode": True,
            "decoder_autocast": "bf16",
            "decoder_channels_last": True,
        },
    ),
]
CUDA_CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {}),
    ("tf32+cl", {"tf32": True, "channels_last_3d": True}),
    ("tf32+cl+sdpa", {"tf32": True, "channels_last_3d": True, "attention": "sdpa"}),
    ("bf16+sdpa+cl", {"autocast": "bf16", "attention": "sdpa", "channels_last_3d": True}),
    ("bf16+sdpa+streamed", {"autocast": "bf16", "attention": "sdpa", "streamed_decode": True}),
]


# Rows measured only when asked for by name (``volsynth tune --rows cache:k3-l1``): step caching changes the
# result by design, so the few steps a tune runs cannot judge it; it is recommended only with a quality verdict
# that holds (engine.optimization.tune_store.trades_fidelity), measured by python -m benchmarks.step_cache.
def opt_in_rows() -> list[tuple[str, dict[str, Any]]]:
    from engine.api.optimization_config import NAMED_SETTINGS

    return [(name, values) for name, values in NAMED_SETTINGS.items() if name.startswith("cache:")]


# Shorter schedules (``volsynth tune --rows steps:25``): fp32 on fewer steps. Not run: projected from fp32's own
# measured steps and decode (the same kernels, fewer of them), and, like caching, advised only with a kept cohort
# verdict that holds (``volsynth quality --settings steps:25``). Never the recommended settings: a schedule is
# the request's steps, not an optimization setting.
def split_schedules(rows: list[str] | None) -> tuple[list[int], list[str] | None]:
    """(the schedules asked for in ``rows``, the other rows); with only schedules asked for, fp32 is measured."""
    from engine.quality.run import schedule_steps

    if not rows:
        return [], rows
    schedules = [steps for steps in map(schedule_steps, rows) if steps is not None]
    others = [name for name in rows if schedule_steps(name) is None]
    return schedules, others or ["fp32"]


def preset_rows() -> list[tuple[str, dict[str, Any]]]:
    """The app's named presets (app.core.optimization_presets mirrors these names), as rows."""
    from engine.api.optimization_config import NAMED_PRESETS

    return [(f"preset:{name}", values) for name, values in NAMED_PRESETS.items() if values]


def candidate_rows(device, spec, probe=None) -> tuple[list[tuple[str, dict]], list[dict[str, str]]]:
    """(rows to measure, rows left out with the reason) for ``device`` and the model ``spec``."""
    base = CUDA_CANDIDATES if device.type == "cuda" else CPU_CANDIDATES
    return _applicable([*base, *preset_rows()], device, spec, probe)


def _applicable(named, device, spec, probe=None) -> tuple[list[tuple[str, dict]], list[dict[str, str]]]:
    """(the rows of ``named`` worth measuring here, those left out with the reason): a row whose settings
    would not apply, or are predicted slower than fp32 here, is listed instead of run."""
    from engine.api.optimization_config import OptimizationConfig
    from engine.optimization.apply import expected_report, slower_here

    rows, skipped, seen = [], [], set()
    for name, values in named:
        config = OptimizationConfig.from_dict(values)
        key = json.dumps(config.to_dict(), sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        slower = slower_here(config, device, probe=probe)  # whatever override the process carries
        if slower:
            reason = "expected slower than fp32 here - " + "; ".join(why for _, why in slower)
            skipped.append({"name": name, "config": values, "reason": reason})
            continue
        try:
            report = expected_report(config, device, spec, probe=probe)
        except InvalidRequest as exc:
            skipped.append({"name": name, "config": values, "reason": str(exc)})
            continue
        missing = [
            f"{setting}: {entry['reason']}"
            for setting, entry in report.items()
            if entry.get("requested") not in (None, False, "default") and not entry.get("applied")
        ]
        if missing:
            skipped.append(
                {"name": name, "config": values, "reason": "does not apply here - " + "; ".join(missing)}
            )
            continue
        rows.append((name, values))
    return rows, skipped


# -- worker: one row, prepared once, run on request ---------------------------------------------------------


def worker_main() -> int:
    """``python -m engine.measure.tune --worker``: JSON commands on stdin, one JSON answer line each on stdout."""
    import torch

    from engine.api import drive
    from engine.machine.devices import resolve_device
    from engine.machine.peak_memory import peak_rss_bytes
    from engine.measure.bench import _Timed
    from engine.models.registry import ModelRegistry
    from engine.optimization.apply import OptimizationConfig, prepare
    from engine.sampling import denoise

    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the answers
    state: dict[str, Any] = {}
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["cmd"] == "prepare":
                if command.get("threads"):
                    torch.set_num_threads(int(command["threads"]))
                device = resolve_device(command["device"])
                started = time.perf_counter()
                source = ModelRegistry().get(command["model"])
                model = source.load().to(device)
                load_s = time.perf_counter() - started
                config = OptimizationConfig.from_dict({**command["config"], "allow_slower": True})
                started = time.perf_counter()
                prepared = prepare(model, config, device, use_cache=False)
                state.update(source=source, device=device, prepared=prepared, config=config)
                answer = {
                    "load_s": load_s,
                    "prepare_s": time.perf_counter() - started,
                    "one_off": _one_off(prepared.details),
                    "report": prepared.report,
                    "details": prepared.details,
                }
            elif command["cmd"] == "run":
                from engine.api import SamplingRequest

                source, device, prepared = state["source"], state["device"], state["prepared"]
                timed = _Timed(prepared, device, skip_decode=False)
                request = SamplingRequest(
                    model=str(source.path),
                    steps=int(command["steps"]),
                    seed=int(command["seed"]),
                    optimization=state["config"],
                )
                started = time.perf_counter()
                loop = drive(denoise(timed, source.spec, request, device))
                assert loop is not None  # nothing asks it to stop: the loop ran to its end
                answer = {
                    "step_s": loop.step_times_s,
                    "decode_s": timed.decode_s,
                    "wall_s": time.perf_counter() - started,
                    "peak_rss_bytes": peak_rss_bytes(),
                }
                if command.get("save"):
                    np.save(command["save"], loop.volumes[:, :1].float().numpy())
            elif command["cmd"] == "quit":
                return 0
            else:
                answer = {"error": f"unknown command {command['cmd']!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the parent as this row's error
            answer = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()
    return 0


def _one_off(details: dict[str, Any]) -> dict[str, Any]:
    """What a row's preparation paid once and what it found in the caches (calibration, the mixed search)."""
    found: dict[str, Any] = {}
    if "calibration" in details:
        found["calibration_from_cache"] = details["calibration"].get("from_cache")
    for where, plan in (
        ("unet", details.get("mixed_plan")),
        ("decoder", (details.get("decoder") or {}).get("mixed_plan")),
    ):
        if plan:
            found[f"{where}_mixed_from_cache"] = plan.get("from_cache")
            found[f"{where}_mixed_search_s"] = plan.get("search_s")  # what the search took when it ran
    return found


class _RowWorker:
    """The parent's handle on one row's worker process."""

    def __init__(self, name: str, values: dict[str, Any]):
        self.name, self.values = name, values
        env = {**os.environ, "VOLSYNTH_ALLOW_SLOWER": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.measure.tune", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.prepared: dict[str, Any] | None = None
        self.runs: list[dict[str, Any]] = []
        self.error: str | None = None
        self.distance: dict[str, Any] | None = None  # its first run's volume against fp32's
        self.trial: dict[str, Any] | None = None  # fp32's untimed first run (it sizes the measurement)
        # fp32's worker only: row name -> distances measured on the whole default schedule (step 5)
        self.whole_distances: dict[str, dict[str, Any]] = {}

    @property
    def cache_interval(self) -> int:
        return int(self.values.get("step_cache_interval", 1))

    def run_steps(self, steps: int) -> int:
        """Steps a round's run takes: a step-caching row runs 1 + its interval, so its timed steps (all but
        the first) hold its full and cached passes in the proportion of a whole schedule."""
        return max(steps, 1 + self.cache_interval) if self.cache_interval > 1 else steps

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            return {"error": f"the row's process ended ({exc})"}
        if not line:
            return {"error": f"the row's process ended (exit {self.proc.poll()})"}
        return json.loads(line)

    def send_quit(self) -> None:
        """Ask the process to end, without waiting (it answers a quit by exiting)."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()

    def end_by(self, deadline: float) -> None:
        """Wait for the process to end until ``deadline`` (perf_counter), then kill it."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.send_quit()
        self.end_by(time.perf_counter() + 5.0)


def _close_all(workers: list[_RowWorker]) -> None:
    """End every row's process at once, after the parent has every answer it needs (the volumes were saved
    in round 1): SIGTERM ends a worker without the interpreter's teardown, which took about a second each,
    and 11 of them ended one after another made a 120 s tune take 134 s."""
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.terminate()
    deadline = time.perf_counter() + 5.0
    for worker in workers:
        worker.end_by(deadline)


# -- parent: rounds, verdicts, the stored result ------------------------------------------------------------


def tune(
    model: str = "",
    device: str = "auto",
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    rows: list[str] | None = None,
    out_dir: Path | None = None,
    should_pause: Callable[[], bool] | None = None,
    save: bool = True,
    estimate_only: bool = False,
    trades: list[str] | None = None,
) -> Generator[Progress, None, dict[str, Any]]:
    """Measure the candidate settings (module docstring); yields Progress, returns the result (also stored).

    ``trades``: rows that change the result by design (``cache:...``, ``steps:N``) measured beside the
    candidates (or beside ``rows``), each with its quality cost on the whole default schedule (step 5).

    Close the generator to cancel: every row process is ended. ``should_pause`` (polled between runs)
    holds the measurement while it returns True, e.g. while the user generates. After preparing fp32 and one
    untimed fp32 run it yields an estimate of the whole measurement ("estimated N s"); ``estimate_only``
    stops there and returns ``{"estimate_s", "rows", "not_measured"}`` (for large models, whose budget is the
    user's choice).
    """
    import tempfile

    from engine.machine.devices import resolve_device
    from engine.machine.probe import probe_machine
    from engine.models.registry import ModelRegistry
    from engine.optimization import tune_store

    if steps < 2:
        raise InvalidRequest("tune needs at least 2 steps per run (the first warms up)")
    if budget_s <= 0:
        raise InvalidRequest("the time budget must be a positive number of seconds")
    started = time.perf_counter()
    torch_device = resolve_device(device)
    source = ModelRegistry().get(model or None)
    spec = source.spec
    probe = probe_machine()
    schedules, rows = split_schedules(rows)
    trade_schedules, trades = split_schedules(trades)
    schedules += [n for n in trade_schedules if n not in schedules]
    measured_rows, skipped = _select_rows(
        torch_device, spec, probe, rows, [t for t in trades or () if t != "fp32"]
    )
    default_steps = spec.default_steps
    # The rows' volumes (one .npy each) live in a scratch folder of our own unless the caller gave one, and
    # go with it: a measurement leaves nothing behind in the temporary folder.
    folder = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="volsynth-tune-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        threads = probe.cpu.logical_cores if torch_device.type == "cpu" else None

        def progress(done: float, total: float, message: str) -> Progress:
            return Progress(TUNE_STAGE, int(done), int(total), time.perf_counter() - started, message)

        workers: list[_RowWorker] = []
        try:
            # 1. Start and prepare every row (one-off costs), fp32 first: it is the yardstick.
            prepare = {
                "cmd": "prepare",
                "model": str(source.path),
                "device": str(torch_device),
                "threads": threads,
            }
            whole_runs = _whole_schedule_runs(measured_rows, schedules, default_steps)
            estimate_s = yield from _prepare_rows(
                workers,
                measured_rows,
                prepare,
                steps,
                seed,
                started,
                progress,
                estimate_only,
                budget_s,
                whole_runs,
                default_steps,
            )
            if estimate_s is not None:  # estimate_only: stopped after sizing the measurement on fp32
                return {
                    "estimate_s": estimate_s,
                    "rows": [n for n, _ in measured_rows],
                    "not_measured": skipped,
                }
            # 2. Rounds, interleaved, until the noise rule decides every row or the budget runs out.
            live = [w for w in workers if w.error is None]
            # Room kept in the budget for the whole-schedule runs of step 5, sized on fp32's trial run.
            reserve_s = whole_runs * _whole_run_s(workers, steps, default_steps)
            rounds = yield from _measure_rounds(
                live,
                folder,
                steps,
                seed,
                default_steps,
                budget_s - reserve_s,
                started,
                should_pause,
                progress,
            )
            yield from _quality_pass(live, folder, schedules, default_steps, seed, started, progress)
        finally:
            _close_all(workers)

        # 3. Summarise against fp32.
        created = datetime.now(UTC).isoformat(timespec="seconds")
        results = _summarise(workers, folder, default_steps, created)
        fp32_row = next(r for r in results if r["name"] == "fp32")
        fp32_worker = next(w for w in workers if w.name == "fp32")
        results += [_schedule_row(fp32_row, fp32_worker, n, default_steps) for n in schedules]
        for row in results:  # the quality pass's distances, on the whole schedule, where it measured them
            row.update(fp32_worker.whole_distances.get(row["name"], {}))
        versions = tune_store.current_versions()
        result: dict[str, Any] = {
            "format": tune_store.TUNE_FORMAT,
            "created": created,
            "fingerprint": probe.fingerprint(),
            "machine": probe.to_dict(),
            "machine_words": probe.describe(),
            "model": {"id": spec.id, "name": spec.name, "key": tune_store.model_key(source.weights_sha256())},
            "versions": versions,
            "versions_key": tune_store.versions_key(versions),
            "device": str(torch_device),
            "method": _method(steps, rounds, seed, spec, budget_s, started),
            "rows": results,
            "not_measured": skipped,
        }
        if rows:
            # Some rows measured: they replace theirs in this machine's stored result, the others stay.
            stored = tune_store.load_result(source.weights_sha256(), probe.fingerprint(), versions)
            result = tune_store.merge_results(stored, result)
        else:
            result = tune_store.merge_results(None, result)  # the verdicts and the recommendation, one way
        from engine.measure.bench import quality_block_for

        # The cohort verdicts `volsynth quality` kept for these rows here (per-seed PSNR/SSIM are in the rows).
        rows_now = [(r.get("name", ""), r.get("config") or {}) for r in result["rows"]]
        shorter = {r["name"]: r["steps"] for r in result["rows"] if r.get("steps") is not None}
        result["quality"] = quality_block_for(model, rows_now, shorter)
        # A row that trades fidelity (step caching, a shorter schedule) is advised only with a kept verdict that holds.
        best = tune_store.recommendation(result)
        result["recommended"] = best["name"] if best else None
        schedule = tune_store.schedule_advice(result)
        result["shorter_schedule"] = schedule["name"] if schedule else None
        if save:
            result["path"] = str(tune_store.save_result(result))
        return result
    finally:
        if not out_dir:
            shutil.rmtree(folder, ignore_errors=True)


def _method(steps: int, rounds: int, seed: int, spec, budget_s: float, started: float) -> dict[str, Any]:
    """How the measurement was made, as the stored result records it."""
    return {
        "steps_per_run": steps,
        "warmup_steps": 1,
        "rounds": rounds,
        "seed": seed,
        "guidance_scale": spec.default_guidance_scale if spec.supports_guidance else 1.0,
        "default_steps": spec.default_steps,
        "end_to_end": f"{spec.default_steps} x the mean timed step of a run + that run's decode; load and one-off "
        "costs (calibration, compiles) apart",
        "budget_s": budget_s,
        "wall_s": time.perf_counter() - started,
    }


def _select_rows(
    torch_device, spec, probe, rows: list[str] | None, trades: list[str] | None = None
) -> tuple[list, list[dict[str, Any]]]:
    """The candidate rows for this device, narrowed to ``rows`` (fp32 always stays), with the step-caching
    rows of ``trades`` beside them, and those not measured."""
    measured_rows, skipped = candidate_rows(torch_device, spec, probe)
    if trades:
        wanted = [(n, v) for n, v in opt_in_rows() if n in trades]
        unknown = [t for t in trades if t not in {n for n, _ in wanted}]
        if unknown:
            raise InvalidRequest(
                f"unknown step-caching row(s) {unknown}; known: {[n for n, _ in opt_in_rows()]}"
            )
        more, left_out = _applicable(wanted, torch_device, spec, probe)
        measured_rows, skipped = measured_rows + more, skipped + left_out
        rows = rows and [*rows, *(n for n, _ in more)]
    if rows:
        measured_rows += [(n, v) for n, v in opt_in_rows() if n in rows and (n, v) not in measured_rows]
        unknown = [r for r in rows if r not in {n for n, _ in measured_rows} | {s["name"] for s in skipped}]
        if unknown:
            raise InvalidRequest(
                f"unknown tune row(s) {unknown}; known: {', '.join(n for n, _ in measured_rows)}"
            )
        measured_rows = [(n, v) for n, v in measured_rows if n in rows or n == "fp32"]
    return measured_rows, skipped


def _prepare_rows(
    workers: list[_RowWorker],
    measured_rows: list,
    prepare: dict[str, Any],
    steps: int,
    seed: int,
    started: float,
    progress: Callable[[float, float, str], Progress],
    estimate_only: bool,
    budget_s: float,
    whole_runs: float = 0.0,
    default_steps: int = 0,
) -> Generator[Progress, None, float | None]:
    """Step 1: a worker process per row, prepared (its one-off costs), appended to ``workers`` as it starts.
    After fp32, one untimed run sizes the whole measurement; with ``estimate_only`` it stops there and
    returns that estimate (seconds), else None once every row is prepared."""
    total_prep = len(measured_rows)
    for index, (name, values) in enumerate(measured_rows):
        yield progress(index, total_prep, f"preparing {name} ({index + 1}/{total_prep})")
        worker = _RowWorker(name, values)
        workers.append(worker)
        answer = worker.ask({**prepare, "config": values})
        if "error" in answer:
            worker.error = answer["error"]
            worker.close()
        else:
            worker.prepared = answer
        if name == "fp32" and worker.error:
            raise InvalidRequest(f"the fp32 reference could not run here: {worker.error}")
        if name == "fp32":
            # One untimed fp32 run sizes the whole measurement before the other rows start.
            trial = worker.ask({"cmd": "run", "steps": steps, "seed": seed, "save": None})
            if "error" in trial:
                raise InvalidRequest(f"the fp32 reference could not run here: {trial['error']}")
            worker.trial = trial
            prep = answer["load_s"] + answer["prepare_s"]
            estimate_s = (
                time.perf_counter()
                - started
                + (total_prep - 1) * 2 * prep  # other rows: their load, plus calibration of about as long
                + MIN_ROUNDS * total_prep * trial["wall_s"]
                + whole_runs * _whole_run_s([worker], steps, default_steps)
            )
            message = f"estimated {estimate_s:.0f} s for {total_prep} rows"
            if estimate_s > budget_s and not estimate_only:
                # Said before the rounds start: a budget the minimum cannot fit must not be blown in silence.
                message += (
                    f", over the {budget_s:.0f} s budget: the {MIN_ROUNDS} rounds the noise rule needs run "
                    "anyway (cancel stops them; --rows measures fewer)"
                )
            yield progress(index, total_prep, message)
            if estimate_only:
                return estimate_s
    return None


def _measure_rounds(
    live: list[_RowWorker],
    folder: Path,
    steps: int,
    seed: int,
    default_steps: int,
    budget_s: float,
    started: float,
    should_pause: Callable[[], bool] | None,
    progress: Callable[[float, float, str], Progress],
) -> Generator[Progress, None, int]:
    """Step 2: rounds over the live rows, the order rotating each round, until the noise rule decides every
    row or the next round would pass the budget. Round 0 saves each row's volume; returns the rounds run."""
    round_s = 0.0
    rounds = 0
    while rounds < MAX_ROUNDS:
        # The noise rule needs MIN_ROUNDS samples a row to decide anything: those always run.
        if rounds >= MIN_ROUNDS and (
            _all_decided(live, default_steps) or time.perf_counter() - started + round_s > budget_s
        ):
            break
        round_started = time.perf_counter()
        order = rotated(live, rounds)
        for position, worker in enumerate(order):
            while should_pause is not None and should_pause():
                yield progress(rounds, MAX_ROUNDS, "paused while a generation runs")
                time.sleep(0.25)
            yield progress(
                rounds * len(order) + position,
                MAX_ROUNDS * len(order),
                f"round {rounds + 1}: {worker.name}",
            )
            # A step-caching row's volume is judged on the whole schedule (step 5), not on a few steps.
            save_to = (
                folder / f"{_safe(worker.name)}.npy" if rounds == 0 and worker.cache_interval == 1 else None
            )
            answer = worker.ask(
                {
                    "cmd": "run",
                    "steps": worker.run_steps(steps),
                    "seed": seed,
                    "save": str(save_to) if save_to else None,
                }
            )
            if "error" in answer:
                worker.error = answer["error"]
            else:
                worker.runs.append(answer)
        live = [w for w in live if w.error is None]
        if rounds == 0:
            # Each row's distance from fp32 (SSIM: about 1 s a volume of the shipped model here) is taken
            # now, inside the rounds the budget checks, not after them: 11 rows made a 120 s tune 134 s.
            _measure_distances(live, folder)
        rounds += 1
        round_s = time.perf_counter() - round_started
    return rounds


def _whole_schedule_runs(measured_rows: list, schedules: list[int], default_steps: int) -> float:
    """How many whole default schedules step 5 runs (a shorter schedule counts as its share of one)."""
    caching = sum(1 for _, values in measured_rows if values.get("step_cache_interval", 1) > 1)
    if not caching and not schedules:
        return 0.0
    return 1 + caching + sum(n / default_steps for n in schedules)


def _whole_run_s(workers: list[_RowWorker], steps: int, default_steps: int) -> float:
    """A whole default schedule's time, from fp32's trial run of ``steps`` steps (0 before it ran)."""
    fp32 = next((w for w in workers if w.name == "fp32" and w.trial), None)
    if fp32 is None or fp32.trial is None:
        return 0.0
    trial = fp32.trial
    per_step = float(np.mean(trial["step_s"])) if trial.get("step_s") else trial["wall_s"] / steps
    return default_steps * per_step + float(trial.get("decode_s") or 0.0)


def _quality_pass(
    live: list[_RowWorker],
    folder: Path,
    schedules: list[int],
    default_steps: int,
    seed: int,
    started: float,
    progress: Callable[[float, float, str], Progress],
) -> Generator[Progress, None, None]:
    """Step 5: the whole default schedule for fp32 and each step-caching row, and each shorter schedule on
    fp32, from the same seed; their volumes against fp32's whole schedule. A caching row keeps the result as
    its distance; a schedule's goes to fp32's worker under the schedule's row name."""
    from engine.metrics.image import compare as volume_distance
    from engine.quality.run import SCHEDULE_PREFIX

    fp32 = next((w for w in live if w.name == "fp32"), None)
    caching = [w for w in live if w.cache_interval > 1]
    if fp32 is None or (not caching and not schedules):
        return
    plan = [(fp32, default_steps, "fp32-whole")]
    plan += [(w, default_steps, f"{_safe(w.name)}-whole") for w in caching]
    plan += [(fp32, n, f"steps-{n}") for n in schedules]
    for index, (worker, run_steps, stem) in enumerate(plan):
        what = f"{worker.name}, {run_steps} steps" if stem.startswith("steps") else worker.name
        yield progress(index, len(plan), f"quality on the whole schedule: {what}")
        answer = worker.ask(
            {"cmd": "run", "steps": run_steps, "seed": seed, "save": str(folder / f"{stem}.npy")}
        )
        if "error" in answer:
            if worker is fp32:
                return  # no reference: the rows keep what the rounds measured
            worker.error = answer["error"]
    reference = np.load(folder / "fp32-whole.npy")
    how = f"one run of the whole {default_steps}-step schedule against fp32's, same seed"
    for worker in caching:
        volume = folder / f"{_safe(worker.name)}-whole.npy"
        if volume.is_file():
            worker.distance = {**volume_distance(reference, np.load(volume)), "quality_measured": how}
    for n in schedules:
        volume = folder / f"steps-{n}.npy"
        if volume.is_file():
            fp32.whole_distances[f"{SCHEDULE_PREFIX}{n}"] = {
                **volume_distance(reference, np.load(volume)),
                "quality_measured": f"one run of {n} steps against fp32's whole {default_steps}-step "
                "schedule, same seed",
            }


def _measure_distances(workers: list[_RowWorker], folder: Path) -> None:
    """Each row's saved volume against fp32's (PSNR, SSIM, max and mean error), kept on its worker."""
    from engine.metrics.image import compare as volume_distance

    reference_file = folder / "fp32.npy"
    if not reference_file.is_file():
        return
    reference = np.load(reference_file)
    for worker in workers:
        volume_file = folder / f"{_safe(worker.name)}.npy"
        if volume_file.is_file():
            worker.distance = volume_distance(reference, np.load(volume_file))


def _summarise(
    workers: list[_RowWorker], folder: Path, default_steps: int, measured_at: str
) -> list[dict[str, Any]]:
    """Step 3: one result row per worker: its timings, their verdicts against fp32's, and its volume's
    distance from fp32's."""
    fp32 = next(w for w in workers if w.name == "fp32")
    if not fp32.runs:
        raise InvalidRequest(
            f"the fp32 reference did not complete a run: {fp32.error or 'time budget too small'}"
        )
    _measure_distances([w for w in workers if w.runs and w.distance is None], folder)
    fp32_e2e = _e2e_samples(fp32, default_steps)
    fp32_steps = _step_samples(fp32)
    fp32_decode = [r["decode_s"] for r in fp32.runs]
    results: list[dict[str, Any]] = []
    for worker in workers:
        if worker.error and not worker.runs:
            results.append({"name": worker.name, "config": worker.values, "error": worker.error})
            continue
        e2e, step_samples, decode = (
            _e2e_samples(worker, default_steps),
            _step_samples(worker),
            [r["decode_s"] for r in worker.runs],
        )
        distance = worker.distance or {}
        step_median, step_iqr = median_iqr(step_samples)
        decode_median, decode_iqr = median_iqr(decode)
        e2e_median, e2e_iqr = median_iqr(e2e)
        results.append(
            {
                "name": worker.name,
                "config": worker.values,
                "runs": len(worker.runs),
                "steps_per_run": len(worker.runs[0]["step_s"]),
                "step_ms_median": 1e3 * step_median,
                "step_ms_iqr": 1e3 * step_iqr,
                "decode_s_median": decode_median,
                "decode_s_iqr": decode_iqr,
                "end_to_end_s": e2e_median,
                "end_to_end_s_iqr": e2e_iqr,
                # The samples the noise rule judges, kept so a merged result can judge this row again
                # against the fp32 of its own run (engine.optimization.tune_store.merge_results).
                "end_to_end_samples_s": e2e,
                "reference_end_to_end_samples_s": fp32_e2e,
                "measured": measured_at,
                "one_off_s": worker.prepared["prepare_s"] if worker.prepared else None,
                "one_off": worker.prepared.get("one_off", {}) if worker.prepared else {},
                "load_s": worker.prepared["load_s"] if worker.prepared else None,
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in worker.runs),
                "step_verdict": speed_verdict(fp32_steps, step_samples).to_dict("its U-Net step", "fp32's"),
                "decode_verdict": speed_verdict(fp32_decode, decode).to_dict("its decode", "fp32's"),
                "end_to_end_verdict": speed_verdict(fp32_e2e, e2e).to_dict("it", "fp32"),
                "speedup_end_to_end": float(np.median(fp32_e2e) / np.median(e2e)),
                "report": worker.prepared["report"] if worker.prepared else {},
                **distance,
                **({"error": worker.error} if worker.error else {}),
            }
        )
    return results


def _schedule_row(fp32: dict[str, Any], worker: _RowWorker, steps: int, default_steps: int) -> dict[str, Any]:
    """A shorter schedule's row, projected from fp32's measured runs: each run's mean step times ``steps``, plus
    that run's decode (the same kernels, fewer of them), against the same runs at ``default_steps``."""
    from engine.quality.run import SCHEDULE_PREFIX

    reference = fp32["end_to_end_samples_s"]
    samples = _e2e_samples(worker, steps)
    e2e_median, e2e_iqr = median_iqr(samples)
    return {
        **{
            k: fp32[k]
            for k in ("step_ms_median", "step_ms_iqr", "decode_s_median", "decode_s_iqr", "measured")
        },
        "name": f"{SCHEDULE_PREFIX}{steps}",  # the name volsynth quality takes
        "config": {},
        "steps": steps,
        "default_steps": default_steps,
        "projected": f"{steps} of fp32's measured steps + its decode, against {default_steps} steps + the decode",
        "runs": fp32["runs"],
        "end_to_end_s": e2e_median,
        "end_to_end_s_iqr": e2e_iqr,
        "end_to_end_samples_s": samples,
        "reference_end_to_end_samples_s": reference,
        "one_off_s": 0.0,
        "peak_rss_bytes": fp32["peak_rss_bytes"],
        "end_to_end_verdict": paired_speed_verdict(reference, samples).to_dict("it", "fp32"),
        "speedup_end_to_end": float(np.median(reference) / np.median(samples)),
        "report": {},
    }


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _step_samples(worker: _RowWorker) -> list[float]:
    return [s for run in worker.runs for s in run["step_s"][1:]]


def _e2e_samples(worker: _RowWorker, default_steps: int) -> list[float]:
    """One estimate per run: a default generation's steps at this run's mean timed step, plus its decode."""
    return [default_steps * float(np.mean(run["step_s"][1:])) + run["decode_s"] for run in worker.runs]


def _all_decided(workers: list[_RowWorker], default_steps: int) -> bool:
    fp32 = next((w for w in workers if w.name == "fp32"), None)
    if fp32 is None:
        return True
    reference = _e2e_samples(fp32, default_steps)
    return all(
        speed_verdict(reference, _e2e_samples(w, default_steps)).decided for w in workers if w is not fp32
    )


def format_result(result: dict[str, Any]) -> str:
    """The tune table for terminals."""
    header = (
        f"{'row':34s} {'step ms':>8s} {'IQR':>6s} {'decode s':>8s} {'e2e s':>7s} {'x fp32':>7s} "
        f"{'verdict':>9s} {'PSNR dB':>8s} {'one-off s':>9s} {'peak GiB':>8s}"
    )
    lines = [f"tune: {result['model']['name']} on {result['machine_words']}", header, "-" * len(header)]
    for row in result["rows"]:
        if "step_ms_median" not in row:
            lines.append(f"{row['name']:34s} ERROR {row.get('error')}")
            continue
        psnr = row.get("psnr_db")
        psnr_text = (
            "exact" if psnr is not None and np.isinf(psnr) else f"{psnr:.1f}" if psnr is not None else "-"
        )
        mark = (
            "  <- recommended"
            if row["name"] == result.get("recommended")
            else "  <- shorter schedule that keeps the quality verdict"
            if row["name"] == result.get("shorter_schedule")
            else ""
        )
        verdict = "ref" if row["name"] == "fp32" else row["end_to_end_verdict"]["verdict"]
        lines.append(
            f"{row['name']:34s} {row['step_ms_median']:8.1f} {row['step_ms_iqr']:6.1f} {row['decode_s_median']:8.2f} "
            f"{row['end_to_end_s']:7.1f} {row['speedup_end_to_end']:7.2f} {verdict:>9s} "
            f"{psnr_text:>8s} {row['one_off_s'] or 0:9.1f} {row['peak_rss_bytes'] / 2**30:8.2f}{mark}"
        )
    for row in result["not_measured"]:
        lines.append(f"{row['name']:34s} not measured: {row['reason'][:160]}")
    if result.get("kept_from_earlier_runs"):
        lines.append(
            "kept from earlier runs (each judged against the fp32 of its own run): "
            + ", ".join(
                f"{row['name']} ({row.get('measured') or 'earlier'})"
                for row in result["rows"]
                if row["name"] in result["kept_from_earlier_runs"]
            )
        )
    method = result["method"]
    lines.append(
        f"{method['rounds']} interleaved round(s) of {method['steps_per_run']} steps (1 warm-up) per row, "
        f"guidance {method['guidance_scale']:g}; e2e = {method['end_to_end']}; verdicts by the noise rule "
        f"(engine.metrics.speed_verdict); {method['wall_s']:.0f} s of a {method['budget_s']:.0f} s budget"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(worker_main())
    sys.exit("usage: python -m engine.measure.tune --worker (started by volsynth tune)")
