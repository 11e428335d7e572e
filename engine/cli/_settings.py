"""Optimization settings in the CLI: reading them (a bench row name or JSON: ``--settings``, ``compare A B``) and the
prediction printed before a run (``generate``, ``compare``)."""

from __future__ import annotations

import json

from engine.errors import InvalidRequest


def prediction_lines(request, device: str) -> list[str]:
    """One line per requested setting: applies, does not apply (why), or expected slower here (why).

    Raises ``InvalidRequest`` where the engine would refuse the run (the same check, made before loading).
    """
    from engine.machine.devices import resolve_device
    from engine.machine.probe import probe_machine
    from engine.models.registry import ModelRegistry
    from engine.optimization.apply import expected_report
    from engine.optimization.tune_store import load_result

    config = request.optimization
    if config.settings.is_default:
        return []
    source = ModelRegistry().get(request.model or None)
    measured = load_result(source.weights_sha256())
    resolved = resolve_device(device)
    report = expected_report(config, resolved, source.spec, measured=measured)
    lines = [f"settings on {resolved} ({probe_machine().describe()}):"]
    for name, entry in report.items():
        requested = entry.get("requested")
        if requested in (None, False, "default"):
            continue
        verdict = "applies" if entry.get("applied") else "does not apply"
        lines.append(
            f"  {name} = {requested}: {verdict}" + (f" - {entry['reason']}" if entry.get("reason") else "")
        )
        if entry.get("expected_slower"):
            lines.append(f"  warning: expected slower than fp32 here - {entry['expected_slower']}")
    return lines


def print_prediction(request, device: str) -> None:
    """What the settings will do on this machine, before anything loads (stderr); refuses what the engine
    would refuse (settings expected slower here without --allow-slower), so that fails in a second."""
    import sys

    for line in prediction_lines(request, device):
        print(line, file=sys.stderr)


FASTEST_HERE = "fastest-here"


def settings_from_text(text: str, model: str = ""):
    """``--settings``: a bench row name, a JSON object of optimization fields, or ``fastest-here`` (what
    ``volsynth tune`` recommends for ``model`` on this machine). Returns an ``OptimizationConfig``."""
    from engine.api.optimization_config import OptimizationConfig
    from engine.errors import InvalidRequest

    if text.strip() != FASTEST_HERE:
        return parse_settings(text)[1]
    from engine.models.registry import ModelRegistry
    from engine.optimization.tune_store import load_result, recommendation

    result = load_result(ModelRegistry().get(model or None).weights_sha256())
    best = recommendation(result)
    if best is None:
        raise InvalidRequest(
            "nothing measured for this model on this machine yet: run `volsynth tune` first (about 2 minutes)"
        )
    return OptimizationConfig.from_dict(best["config"])


#: ``--settings`` JSON: deeper or longer text is refused before it is parsed.
MAX_SETTINGS_DEPTH = 4
MAX_SETTINGS_CHARS = 16 * 1024


def parse_settings(text: str):
    """A bench row name or a JSON object -> (label, OptimizationConfig)."""
    from engine.api.optimization_config import NAMED_SETTINGS, OptimizationConfig
    from engine.models.source import json_depth_ok

    text = text.strip()
    if text[:1] in ("{", "["):
        # Settings are one flat object of a few dozen fields: refuse deep or huge text before parsing,
        # where Python's JSON reader would raise RecursionError instead of a one-line error.
        if len(text) > MAX_SETTINGS_CHARS or not json_depth_ok(text, MAX_SETTINGS_DEPTH):
            raise InvalidRequest(
                f"settings must be a flat JSON object of optimization fields (at most {MAX_SETTINGS_DEPTH} "
                f"levels and {MAX_SETTINGS_CHARS:,} characters), got {text[:40]!r}..."
            )
        try:
            values = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InvalidRequest(f"settings {text[:80]!r} are not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise InvalidRequest(f"settings must be a JSON object of optimization fields, got {text!r}")
        config = OptimizationConfig.from_dict(values)
        return config.summary(), config
    if text not in NAMED_SETTINGS:
        raise InvalidRequest(
            f"unknown settings {text!r}: use a JSON object or one of {', '.join(NAMED_SETTINGS)}"
        )
    return text, OptimizationConfig.from_dict(NAMED_SETTINGS[text])


def add_setting_arguments(group, rows=None) -> None:
    """One flag per optimization setting (``engine.api.optimization_config.SETTING_ROWS``, or ``rows``), its
    help the setting's tip: a switch for a true/false setting (``--sdpa`` sets attention to "sdpa"), the values
    of a text setting, a number otherwise. Each flag's value lands under the setting's name."""
    from engine.api.optimization_config import SETTING_ROWS

    for row in SETTING_ROWS if rows is None else rows:
        common = {"dest": row.name, "default": row.default, "help": row.help}
        if row.is_switch or row.flag_value is not True:  # a flag without an argument: --tf32, --sdpa
            group.add_argument(row.flag, action="store_const", const=row.flag_value, **common)
        elif row.values:
            group.add_argument(row.flag, choices=[v for v in row.values if v is not None], **common)
        elif row.bounds is not None:
            low, high = row.bounds
            parse = _whole_in(int(low), int(high), row.what) if row.whole else float
            group.add_argument(row.flag, type=parse, metavar=row.metavar, **common)
        else:
            raise ValueError(f"setting {row.name} has neither values nor bounds for its flag")


def setting_fields(args, rows=None) -> dict:
    """The ``OptimizationConfig`` fields from the flags of :func:`add_setting_arguments`."""
    from engine.api.optimization_config import SETTING_ROWS

    return {row.name: getattr(args, row.name) for row in (SETTING_ROWS if rows is None else rows)}


def _whole_in(low: int, high: int, what: str):
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be from {low} to {high}, got {value}")
        return value

    return parse
