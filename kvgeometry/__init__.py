"""The kit's vLLM general plugin: one `KV cache geometry:` line per engine start.

vLLM loads general plugins (entry-point group `vllm.general_plugins`) in every process, the engine
core included, before the KV cache is planned. `register` wraps the planner entry point the
engine core calls, `vllm.v1.engine.core.get_kv_cache_configs` (the same name in vLLM 0.32 and
0.33), and logs the plan it returns (`kvgeometry.report`). Nothing the planner decides changes:
the wrapper returns vLLM's result as it is, and a failure to describe it is logged, never raised.
If this vLLM has no such hook, one WARNING says so; the smoke check names it as the reason for
every geometry check it cannot make.

`launch run` enables it in every image (`launch.plugin`): it writes the entry point's metadata
to a directory of its own and puts it on PYTHONPATH, beside /opt/kit where this package lives
(built into the kit's images, mounted with the launcher into the qualified one).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from kvgeometry.report import HOOK_MISSING, PREFIX, format_geometry

__all__ = ["ENTRY_POINT", "HOOK", "HOOK_MISSING", "PREFIX", "format_geometry", "register"]

ENTRY_POINT = ("vllm.general_plugins", "kit_kv_geometry", "kvgeometry:register")
"""(group, name, object): what vLLM's plugin loader finds in the metadata `launch run` writes."""
HOOK = ("vllm.v1.engine.core", "get_kv_cache_configs")
"""The module attribute the engine core calls to plan the KV cache."""

# vLLM's logging configuration formats the `vllm` logger tree; a child logger prints in vLLM's
# own line format, which the smoke check's parser reads.
logger = logging.getLogger("vllm.kvgeometry")
_WRAPPED = "_kvgeometry_wrapped"


def _logged(planner: Any) -> Any:
    @functools.wraps(planner)
    def plan_and_report(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        configs = planner(vllm_config, *args, **kwargs)
        try:
            if configs and getattr(configs[0], "kv_cache_groups", None):
                logger.info("%s", format_geometry(vllm_config, configs[0]))
        except Exception as err:  # a report must never stop a start
            logger.warning("%s not reported: %s: %s", PREFIX, type(err).__name__, err)
        return configs

    setattr(plan_and_report, _WRAPPED, True)
    return plan_and_report


def _version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "unknown"


def register() -> None:
    """The entry point: wrap the engine core's planner call once per process."""
    module_name, attribute = HOOK
    try:
        module = __import__(module_name, fromlist=[attribute])
    except Exception as err:
        logger.warning(HOOK_MISSING, f"{module_name} does not import: {type(err).__name__}")
        return
    planner = getattr(module, attribute, None)
    if planner is None:
        logger.warning(HOOK_MISSING, f"{module_name} has no {attribute} in vLLM {_version()}")
        return
    if not getattr(planner, _WRAPPED, False):
        setattr(module, attribute, _logged(planner))
