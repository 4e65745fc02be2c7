"""Argument types for the command line: each turns a string into a checked value, or raises
argparse.ArgumentTypeError with a message that says what was expected and what was given."""
from __future__ import annotations

import argparse
import math

from .errors import MinidnnError, parse_bytes


def _number(text: str, convert, ok, expected: str):
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def count(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < math.inf, "a positive finite number")


def non_negative_float(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < math.inf, "a finite number >= 0")


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def size(text: str) -> int:
    """'12GiB' -> bytes (errors.parse_bytes)."""
    try:
        return parse_bytes(text)
    except MinidnnError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def layer_chunks(text: str) -> tuple:
    """'conv1_1:pool1:2' (or several, comma-separated) -> (('conv1_1', 'pool1', 2),);
    'none' -> (): the layer chunks of MemoryDecision.chunks (minidnn/chunks.py checks the
    names against the network)."""
    if text.strip().lower() == "none":
        return ()
    chunks = []
    for part in text.split(","):
        fields = part.strip().split(":")
        if len(fields) != 3 or not all(fields):
            raise argparse.ArgumentTypeError(
                f"expected FIRST:LAST:PIECES (e.g. conv1_1:pool1:2), comma-separated, or "
                f"'none', got {text!r}")
        first, last, pieces = fields
        chunks.append((first, last, _number(pieces, int, lambda v: v >= 2,
                                            "PIECES, an integer >= 2")))
    return tuple(chunks)
