"""The production worker loads the workflow modules once (worker.WORKFLOW_RUNNER) instead of
re-importing them for every run, so no run may leave anything behind in them: every module
global and class attribute of `workflows` is a constant, never a list, dict, set or an object
that can change."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import types
from typing import Any

import pytest
from temporalio.common import RetryPolicy

import workflows

MODULES = sorted(m.name for m in pkgutil.iter_modules(workflows.__path__, "workflows."))
MUTABLE = (list, dict, set, bytearray)


def changeable(value: Any) -> bool:
    if isinstance(value, RetryPolicy):  # a plain dataclass the SDK only reads into commands
        return False
    if isinstance(value, MUTABLE):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(type(value), "__dataclass_params__", None)
        return params is None or not params.frozen
    return False


@pytest.mark.parametrize("name", MODULES)
def test_a_workflow_module_holds_constants_only(name: str):
    module = importlib.import_module(name)
    held = {f"{name}.{k}": v for k, v in vars(module).items() if not k.startswith("__")}
    for cls in (v for v in vars(module).values() if inspect.isclass(v)):
        if cls.__module__ == name:
            held |= {
                f"{name}.{cls.__name__}.{k}": v
                for k, v in vars(cls).items()
                if not k.startswith("__") and not isinstance(v, types.FunctionType)
            }
    assert [k for k, v in held.items() if changeable(v)] == []
