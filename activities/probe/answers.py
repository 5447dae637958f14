"""What the probe's sources answer, read strictly (docs/design.md, "The load probe"): ComfyUI's
`/system_stats` and `/queue`, the guard's status. A "42" string where a number belongs is a
measurement error, not a number; every problem becomes one line of the probe's `errors`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator


class Device(BaseModel):
    model_config = ConfigDict(strict=True)

    vram_total: Annotated[int, Field(gt=0)]
    vram_free: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _free_within_total(self) -> Device:
        if self.vram_free > self.vram_total:
            raise ValueError("vram_free exceeds vram_total")
        return self


class SystemStats(BaseModel):
    model_config = ConfigDict(strict=True)

    # ComfyUI lists the one torch device it renders on.
    devices: Annotated[list[Device], Field(min_length=1)]


class Queue(BaseModel):
    model_config = ConfigDict(strict=True)

    queue_running: list[Any]
    queue_pending: list[Any]


class Guard(BaseModel):
    model_config = ConfigDict(strict=True)

    busy: StrictBool
    job: Any = None


M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Answer:
    source: str
    answered: bool  # an HTTP status line came back, whatever it said
    body: Any = None
    error: str | None = None


def parse(answer: Answer, model: type[M], errors: list[str]) -> M | None:
    """`answer` read as `model`, or None with what went wrong added to `errors`."""
    if answer.error is not None:
        errors.append(answer.error)
        return None
    try:
        return model.model_validate(answer.body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        errors.append(f"{answer.source}: unexpected answer ({problems})")
        return None
