"""``memlib mcp``: the MCP server over stdio, for an agent on one user's machine (the same tools
are served over HTTP at ``/mcp`` by ``memlib serve``)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, fail, get_config


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp_cmd(
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        tenant: Annotated[Optional[str], typer.Option("--tenant", "-t", help="bind the connection to this tenant "
                                                      "(default: every tenant of the store)")] = None,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """MCP server on stdin/stdout: tools search_memory, list_tenants, get_session."""
        from memlib.io.store import read_manifest
        from memlib.io.validate import validate_tenant_id

        manifest = read_manifest(store)
        if manifest is None:
            fail(f"{store} is not a memlib store (no manifest.json); run `memlib build` first")
            return
        if tenant is not None:
            reason = validate_tenant_id(tenant)
            if reason:
                fail(f"--tenant: {reason}")
            if tenant not in manifest.get("tenants", {}):
                fail(f"tenant {tenant!r} is not in store {store} (version {manifest['version']}); "
                     f"known: {', '.join(sorted(manifest.get('tenants', {}))[:20])}")
        cfg = get_config(config, overrides)
        from memlib.serve.mcp_stdio import run_stdio

        run_stdio(store, cfg, tenant)
