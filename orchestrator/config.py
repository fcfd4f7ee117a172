"""Settings, built once at start-up from flags and `ORRERY_*` variables (SPEC section 8)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.domain.dag import Limits

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Every orchestrator setting. Each has an `ORRERY_<NAME>` variable and a flag on `serve`."""

    model_config = SettingsConfigDict(env_prefix="ORRERY_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="address the REST API and device WebSocket listen on")
    port: int = Field(
        default=8765, ge=0, le=65535, description="port of the REST API and the device WebSocket (one port)"
    )
    data_dir: Path = Field(
        default=Path(".orrery"), description="the SQLite file, admin.key and secret.key (and artifacts on files)"
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the store: Postgres for replicas (default: SQLite in the data dir)"
    )
    redis_url: str | None = Field(
        default=None, description="Redis for replicas (their bus and cluster); unset: one process"
    )
    secret_key: str | None = Field(
        default=None,
        description="HMAC key for stored key and token hashes (default: <data-dir>/secret.key); "
        "the same on every replica",
    )
    admin_key: str | None = Field(default=None, description="first admin API key to create on an empty store")

    heartbeat_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="agents send a heartbeat this often; silent for two intervals, a device is suspect",
    )
    heartbeat_timeout_s: float = Field(
        default=50.0, gt=0, description="silent this long, a device is offline and its batch in flight ends device_lost"
    )
    hello_timeout_s: float = Field(
        default=10.0, gt=0, description="a device connection must say hello within this (else close 4408)"
    )
    batch_accept_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="an online device must accept a batch sent to it within this, else the attempt times out",
    )
    queue_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="a node no device took in this time fails with queue_timeout (a node may set its own)",
    )
    approval_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="a command waiting this long for a person's approval fails with approval_timeout",
    )
    # An operator's approve or deny is asked of the device (its ledger decides); the API waits
    # this long for the device to confirm the decision that holds before it answers 202.
    approval_confirm_s: float = Field(
        default=10.0,
        ge=0,
        description="how long an approve or deny through the API waits for the device to confirm what holds "
        "before it answers 202",
    )
    probe_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="a node whose outcome is unknown waits this long for a device to run its verify commands, "
        "then fails with its original error",
    )
    max_frame_bytes: int = Field(
        default=4 * MiB, ge=1024, description="largest device protocol frame (a larger one closes the connection, 4413)"
    )
    max_request_bytes: int = Field(
        default=2 * MiB, ge=1024, description="largest request body, chunked or not (else 413 payload_too_large)"
    )
    max_nodes_per_task: int = Field(
        default=1000, ge=1, description="most nodes one task may have (else limit_exceeded)"
    )
    max_argument_bytes: int = Field(
        default=64 * 1024, ge=64, description="largest arguments of one command, as JSON (else limit_exceeded)"
    )
    handshakes_per_minute: int = Field(
        default=120, ge=1, description="device handshakes per device per minute (else 429 rate_limited)"
    )
    auth_failures_per_minute: int = Field(
        default=30,
        ge=1,
        description="failed authentications (REST and devices) per client address per minute (else 429)",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a request head must arrive within this (else 408 and the connection closes)"
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body must arrive within this (else 408 request_timeout)"
    )
    keepalive_timeout_s: float = Field(
        default=5.0, gt=0, description="an idle kept-alive connection is closed after this"
    )
    max_connections: int = Field(
        default=20_000,
        ge=1,
        description="open connections and requests (device sockets too) before new requests get 503",
    )
    max_header_bytes: int = Field(
        default=16 * 1024, ge=1024, description="largest request head (request line and headers; else 431)"
    )
    mcp_allowed_hosts: str = Field(
        default="",
        description="the MCP server at /mcp answers requests for loopback hosts and these too: comma-separated "
        "host[:port] (host:* for any port), the names clients reach this server by (DNS rebinding protection)",
    )
    mcp_allowed_origins: str = Field(
        default="",
        description="browser origins (scheme://host[:port], :* for any port) allowed at /mcp besides loopback ones",
    )

    llm_base_url: str | None = Field(
        default=None, description="an OpenAI-compatible endpoint; with llm_model unset there is no planner"
    )
    llm_api_key: str | None = Field(default=None, description="the endpoint's API key")
    llm_model: str | None = Field(default=None, description="the model to ask (plans, re-plans and agent nodes)")
    llm_timeout_s: float = Field(default=120.0, gt=0, description="one model call, including its retries' waits")
    llm_max_retries: int = Field(default=4, ge=0, le=20, description="retries on rate limits and server errors")
    llm_vision: bool = Field(default=False, description="the model accepts images (agent nodes see screenshots)")
    llm_calls_per_task: int = Field(default=60, ge=1, description="LLM call budget of one task")
    llm_context_tokens: int = Field(default=24_000, ge=1000, description="budget for the device inventory in a prompt")
    max_replans: int = Field(default=3, ge=0, le=50, description="re-planning rounds per task")
    # The model's context in agent nodes: screenshots kept, their size, their bytes.
    llm_screenshots_kept: int = Field(
        default=1, ge=0, le=20, description="newest screenshots an agent node's model sees; older ones become notes"
    )
    llm_screenshot_max_side: int = Field(
        default=1280, ge=64, le=8192, description="longest side in pixels of a screenshot shown to the model"
    )
    llm_screenshot_max_pixels: int = Field(
        default=1280 * 800, ge=4096, description="pixel budget (width x height) of a screenshot shown to the model"
    )
    llm_screenshot_max_bytes: int = Field(
        default=1 * MiB, ge=16 * 1024, description="a larger screenshot is re-encoded (JPEG) and shrunk, never dropped"
    )
    prompts_dir: Path | None = Field(
        default=None, description="prompt templates that replace the built-in ones of the same name"
    )

    tls_cert: Path | None = Field(default=None, description="PEM certificate: serve HTTPS and WSS (with tls_key)")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    replica_id: str | None = Field(default=None, description="this replica's name (default: host-pid-random)")
    lease_ttl_s: float = Field(default=10.0, gt=0.5, description="engine lease lifetime; renewed every third of it")
    cluster_request_timeout_s: float = Field(
        default=30.0, gt=0, description="a request another replica's engine must answer (else 503 cluster_unavailable)"
    )
    reconcile_interval_s: float = Field(
        default=2.0, gt=0, description="how often the engine adopts tasks it finds in the store but not in memory"
    )
    device_history_kept: int = Field(
        default=1000, ge=10, description="state changes kept per device in its history (the newest)"
    )
    schedule_ticks_kept: int = Field(
        default=1000, ge=10, description="past ticks kept per schedule in its history (the newest; queued ones stay)"
    )
    log_format: str = Field(
        default="text",
        description="text, or json: one object per line with task_id, node_id, batch_id, device_id, request_id",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error")
    # ---- artifacts: files commands publish (orchestrator/artifacts/)
    max_artifact_bytes: int = Field(default=1024 * MiB, ge=0, description="largest artifact a device may publish")
    artifact_store: str = Field(
        default="auto",
        description="where artifact bytes live: files (under artifact_dir), database (chunks in the store: "
        "every replica serves them), or auto (database on Postgres, files on SQLite)",
    )
    artifact_dir: Path | None = Field(default=None, description="the files store's directory (<data-dir>/artifacts)")
    # Quotas (0: none), so a command publishing in a loop cannot fill the disk: 413 quota_exceeded.
    artifact_task_quota_bytes: int = Field(
        default=10 * 1024 * MiB, ge=0, description="artifact bytes one task may publish (0: no quota)"
    )
    artifact_task_quota_count: int = Field(
        default=1000, ge=0, description="artifact uploads one task may publish (0: no quota)"
    )
    artifact_device_quota_bytes: int = Field(
        default=100 * 1024 * MiB, ge=0, description="artifact bytes one device may publish, all tasks (0: no quota)"
    )
    artifact_device_quota_count: int = Field(
        default=100_000, ge=0, description="artifact uploads one device may publish, all tasks (0: no quota)"
    )

    @field_validator("prompts_dir")
    @classmethod
    def _prompts_parse(cls, value: Path | None) -> Path | None:
        """A broken override directory is a start-up error naming the file, not a failure later."""
        if value is not None:
            from orchestrator.planner.prompts import PromptError, check_dir

            try:
                check_dir(value)
            except PromptError as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("artifact_store")
    @classmethod
    def _artifact_store(cls, value: str) -> str:
        if value not in ("auto", "files", "database"):
            raise ValueError(f"artifact_store must be auto, files or database, got {value!r}")
        return value

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'orrery.db').resolve()}"

    @property
    def dag_limits(self) -> Limits:
        return Limits(max_nodes=self.max_nodes_per_task, max_argument_bytes=self.max_argument_bytes)

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm_base_url and self.llm_model)

    @property
    def link_report_interval_s(self) -> float:
        """How often each replica re-announces its device links to the engine (SPEC section 7):
        often enough that the engine hears of every live device several times per timeout."""
        return max(0.05, min(5.0, self.heartbeat_interval_s / 2, self.heartbeat_timeout_s / 4))

    @property
    def suspect_after_s(self) -> float:
        """SPEC section 4: no frame for two heartbeat intervals makes a device suspect."""
        return 2 * self.heartbeat_interval_s
