"""Argument types shared by the benchmark scripts: a bad value is an argparse error naming the flag and the value
(``error: argument --steps: must be an integer of at least 1, got '0'``), never a traceback from inside a run."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any


def at_least(lo: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``lo``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer of at least {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer of at least {lo}, got {text!r}")
        return v

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return v


def scenario(ap: argparse.ArgumentParser, name: str, rate: float | None = None) -> Any:
    """``get_scenario(name, rate=rate)``, or an argparse error naming ``--scenario`` and what it accepts."""
    from flowgym.lab.scenarios import get_scenario

    try:
        return get_scenario(name, rate=rate)
    except (ValueError, OSError) as e:
        ap.error(f"argument --scenario: {e}")


def model_dir(ap: argparse.ArgumentParser, flag: str, path: str | None, shipped: bool = True) -> None:
    """An argparse error naming ``flag`` unless ``path`` is ``None``, a model directory written by ``flowgym train``
    or, with ``shipped``, ``"shipped"`` (the default model, where the script takes that name): checked before any
    work, not after minutes of it."""
    if path is None or (shipped and path == "shipped"):
        return
    from flowgym.agents import LearnedBudget

    try:
        LearnedBudget(path)
    except (ValueError, OSError) as e:
        ap.error(f"argument {flag}: {e}")


def writable_file(ap: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """An argparse error naming ``flag`` unless ``path`` (a file to write at the end) is in an existing, writable
    folder: checked before the run, not after it."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        ap.error(f"argument {flag}: cannot write {path!r}: its folder {folder!r} does not exist or is not writable")
