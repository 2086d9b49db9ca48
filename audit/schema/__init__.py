"""The inventory.json contract: a JSON Schema shipped with the package, and the version check readers run.

CI scripts and dashboards parse inventory.json; the schema says what they may rely on. A reader
accepts any 1.x (minor versions only add fields); another major version is refused with one line.
Inventories written before the version field existed (no `schema_version`) read as 1.0: same fields.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

__all__ = ["MAJOR", "check_version", "inventory_schema", "validate"]

MAJOR = 1


@lru_cache(maxsize=1)
def inventory_schema() -> dict:
    """audit/schema/inventory.schema.json (package data)."""
    return json.loads(resources.files(__name__).joinpath("inventory.schema.json").read_text(encoding="utf-8"))


def check_version(data: dict) -> None:
    """ValueError (one line) unless `data` is an inventory of a schema major version this reader knows."""
    if not isinstance(data, dict):
        raise ValueError("not an inventory.json (top level is not an object)")
    version = data.get("schema_version")
    if version is None:
        return
    major = str(version).split(".")[0]
    if major != str(MAJOR):
        raise ValueError(f"inventory schema_version {version} is not supported: this dsv4-audit reads "
                         f"{MAJOR}.x (upgrade dsv4-audit, or rescan)")


def validate(data: dict) -> None:
    """jsonschema.ValidationError unless `data` matches the shipped schema (needs the dev extra's jsonschema)."""
    import jsonschema

    schema = inventory_schema()
    jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker()).validate(data)
