"""``memlib submit build|nightly|status|logs|stop``: cluster jobs over the Ray Jobs API."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import fail

AddressOpt = Annotated[str, typer.Option("--address", help="Ray dashboard (Jobs API) address of the head")]
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _submit(ctx: typer.Context, command: str, address: str, python: str, working_dir: Optional[Path],
            requirements: bool, wait: bool, num_cpus: Optional[float], job_id: Optional[str]) -> None:
    from jobs import submit as js

    opts = js.SubmitOptions(address=address, python=python, with_requirements=requirements,
                            entrypoint_num_cpus=num_cpus, submission_id=job_id)
    if working_dir is not None:
        opts.working_dir = working_dir.resolve()
    try:
        jid = js.submit(js.JobCommand(command), list(ctx.args), opts)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        fail(f"submission to {address} failed: {exc}")
    typer.echo(jid)
    if wait:
        final = js.wait(address, jid)
        typer.echo(f"{jid} {final.value}", err=True)
        if final != js.JobStatus.SUCCEEDED:
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Submit memlib jobs to a Ray cluster (Ray Jobs API) and follow them.",
                      no_args_is_help=True)

    def _make(command: str, doc: str):
        @sub.command(command, context_settings=PASS_THROUGH, help=doc)
        def _cmd(
            ctx: typer.Context,
            address: AddressOpt = DEFAULT_ADDRESS,
            python: Annotated[str, typer.Option("--python", help="python on the cluster nodes")] = "python",
            working_dir: Annotated[Optional[Path], typer.Option("--working-dir", help="project directory to "
                                                                "upload (default: this checkout)")] = None,
            requirements: Annotated[bool, typer.Option("--requirements", help="install pyproject dependencies "
                                                       "as a pip runtime env (clusters without the image)")] = False,
            wait: Annotated[bool, typer.Option("--wait", help="block until the job ends")] = False,
            num_cpus: Annotated[Optional[float], typer.Option("--entrypoint-cpus", help="CPUs reserved for the "
                                                              "driver")] = None,
            job_id: Annotated[Optional[str], typer.Option("--job-id", help="submission id to use")] = None,
        ) -> None:
            _submit(ctx, command, address, python, working_dir, requirements, wait, num_cpus, job_id)

    _make("build", "Run `memlib build ARGS...` as a cluster job (unknown options go to build); prints the job id.")
    _make("nightly", "Run `python -m jobs.nightly ARGS...` (incremental rebuild) as a cluster job.")

    @sub.command("status")
    def status_cmd(job: str, address: AddressOpt = DEFAULT_ADDRESS) -> None:
        """Print the job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
        from jobs import submit as js

        typer.echo(js.status(address, job).value)

    @sub.command("logs")
    def logs_cmd(job: str, address: AddressOpt = DEFAULT_ADDRESS) -> None:
        """Print the job's driver logs."""
        from jobs import submit as js

        typer.echo(js.logs(address, job))

    @sub.command("stop")
    def stop_cmd(job: str, address: AddressOpt = DEFAULT_ADDRESS) -> None:
        """Request the job to stop."""
        from jobs import submit as js

        typer.echo("stopped" if js.stop(address, job) else "not running")

    app.add_typer(sub, name="submit")
