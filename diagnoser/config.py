"""Settings: one object, built once at an entry point and passed down.

Every value comes from `DIAGNOSER_*` environment variables (nested groups use `__`, e.g.
`DIAGNOSER_DB__URL`) or from explicit keyword arguments, which tests use instead of env vars.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SQLITE_FILE_NAME = "diagnoser.db"


class DbSettings(BaseModel):
    url: str | None = None
    """SQLAlchemy URL; None means the embedded SQLite file in the data directory."""
    pool_size: int = Field(default=10, ge=1)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    echo: bool = False


class RedisSettings(BaseModel):
    url: str | None = None
    """Optional; without it everything runs in-process."""
    socket_timeout_s: float = Field(default=2.0, gt=0)


class LlmSettings(BaseModel):
    base_url: str | None = None
    """Any OpenAI-compatible endpoint; None disables the LLM stage."""
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=2, ge=0)

    @property
    def enabled(self) -> bool:
        return self.base_url is not None


class AuthSettings(BaseModel):
    enabled: bool = False
    """Role-based bearer-token auth; off for the embedded single-user default."""


class ActionSettings(BaseModel):
    dry_run: bool = True
    """Recovery actions are recorded but not executed until an operator is configured."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DIAGNOSER_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    log_level: str = "info"

    db: DbSettings = DbSettings()
    redis: RedisSettings = RedisSettings()
    llm: LlmSettings = LlmSettings()
    auth: AuthSettings = AuthSettings()
    actions: ActionSettings = ActionSettings()

    @property
    def database_url(self) -> str:
        if self.db.url:
            return self.db.url
        return f"sqlite:///{(self.data_dir / SQLITE_FILE_NAME).resolve()}"
