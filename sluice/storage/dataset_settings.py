"""Per-dataset parse settings: what a dataset may set for itself instead of the process's settings.

A dataset keeps only what it overrides (``Dataset.parse_settings``, JSON); everything else comes
from the SLUICE_* settings of the process. The effective settings decide the dataset's pipeline
version (``sluice.pipeline.running.context.pipeline_version``), so a change gives its documents new
chunk ids and the existing versioned reindex switches them over, one document at a time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluice.errors import SettingsError
from sluice.settings import Settings

KEYS = ("chunk_size", "chunk_overlap", "ocr_mode", "ocr_language", "context_size")

DESCRIPTIONS = {
    "chunk_size": "characters per chunk (100-8000)",
    "chunk_overlap": "characters shared by neighbouring chunks (smaller than the chunk size)",
    "ocr_mode": "auto (pages without text are read by OCR), always, or off",
    "ocr_language": "Tesseract language(s) of scanned pages, e.g. eng, deu, eng+fra",
    "context_size": "characters of a hit's own section returned with it as its context (0: none; "
    "no reindex: set small chunks to match, a larger context to answer)",
}


class DatasetSettings(BaseModel):
    """The keys a dataset may override, with the same bounds as the SLUICE_* variables."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int | None = Field(None, ge=100, le=8000)
    chunk_overlap: int | None = Field(None, ge=0)
    ocr_mode: Literal["auto", "always", "off"] | None = None
    ocr_language: str | None = Field(None, pattern=r"^[A-Za-z_]{3,20}(\+[A-Za-z_]{3,20})*$")
    context_size: int | None = Field(None, ge=0, le=20_000)


def overrides_of(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The keys a stored row sets (unknown or empty keys ignored)."""
    return {k: v for k, v in (raw or {}).items() if k in KEYS and v is not None}


def effective(settings: Settings, raw: dict[str, Any] | None) -> Settings:
    """The process's settings with the dataset's overrides in place."""
    over = overrides_of(raw)
    if not over:
        return settings
    return settings.model_copy(update=over)


def change(
    settings: Settings, current: dict[str, Any] | None, assignments: dict[str, str | None]
) -> dict[str, Any]:
    """The dataset's new overrides after ``assignments`` (KEY -> text; None or "" unsets the key),
    validated as a whole against the process's settings. Raises SettingsError saying what is
    wrong."""
    unknown = sorted(set(assignments) - set(KEYS))
    if unknown:
        raise SettingsError(
            f"unknown dataset setting(s) {', '.join(unknown)}: a dataset sets " + ", ".join(KEYS)
        )
    merged: dict[str, Any] = dict(overrides_of(current))
    for key, value in assignments.items():
        if value is None or str(value).strip() == "":
            merged.pop(key, None)
        else:
            merged[key] = str(value).strip()
    try:
        checked = DatasetSettings(**merged).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise SettingsError(f"{key}: {first['msg']} (got {merged.get(key)!r})") from None
    result = effective(settings, checked)
    if result.chunk_overlap >= result.chunk_size:
        raise SettingsError(
            f"chunk_overlap ({result.chunk_overlap}) must be smaller than chunk_size "
            f"({result.chunk_size})"
        )
    # A key set to the process's own value is still kept: the dataset then stays put when the
    # process default changes later.
    return checked
