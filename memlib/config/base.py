"""What every config section shares: the output-effect marks, the section base, the backends."""
from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo

# marks a field whose value never changes what a build writes (throughput, endpoints, local
# paths, credentials): the build key leaves it out, so changing it rebuilds nothing
RUNTIME: dict[str, Any] = {"output_effect": False}
# marks a field of a post-build section (``affects_output`` False) that still changes what a
# build writes: the build key takes it in
BUILD_OUTPUT: dict[str, Any] = {"output_effect": True}


def affects_output(field: FieldInfo, section_default: bool = True) -> bool:
    extra = field.json_schema_extra
    mark = extra.get("output_effect") if isinstance(extra, dict) else None
    return section_default if mark is None else bool(mark)


class Section(BaseModel):
    # NaN and infinities are refused in every float field (dict values included): no bound holds for them
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # False for sections only read after the build (retrieval, evaluation, serving, scheduling)
    affects_output: ClassVar[bool] = True


class Backend(str, Enum):
    HEURISTIC = "heuristic"
    LLM = "llm"


class HeuristicOnly(Section):
    """A section with one (heuristic) implementation. Its former ``backend`` key was never read:
    ``heuristic`` is still accepted and dropped, anything else is an error naming the key."""

    @model_validator(mode="before")
    @classmethod
    def _drop_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and "backend" in data:
            data = dict(data)
            value = data.pop("backend")
            if str(getattr(value, "value", value)).strip().lower() != Backend.HEURISTIC.value:
                raise ValueError(f"backend = {value!r}: this section has only the heuristic implementation "
                                 "(remove the key)")
        return data
