"""The Airflow plugin registers the offsets page without touching Kafka at import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plugin_registers_app_and_nav_entry() -> None:
    spec = importlib.util.spec_from_file_location(
        "tidemark_plugin", ROOT / "plugins" / "tidemark_plugin" / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.TidemarkPlugin
    assert plugin.name == "tidemark"
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/tidemark"
    paths = {route.path for route in app["app"].routes}
    assert {"/", "/feeds/{name}", "/api/feeds/{name}", "/api/feeds/{name}/replay/preview"} <= paths
    assert app["app"].router.dependencies, "the app must carry Airflow's auth dependencies"
    [trigger] = [r for r in app["app"].routes if getattr(r, "path", "") == "/api/feeds/{name}/replay"]
    assert trigger.dependencies, "the replay trigger must check that the user may run tidemark_replay"
    [view] = plugin.external_views
    assert view["href"] == "/tidemark/" and view["destination"] == "nav"
