"""The ``tls.*`` keys of broker.conf (and of ``mqlake namesrv -c``): RocketMQ's ``TlsSystemConfig`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TlsMode = Literal["disabled", "permissive", "enforcing"]

class TlsConfig(BaseModel):
    """RocketMQ's ``TlsSystemConfig`` keys (``tls.server.*`` for our ports, ``tls.client.*``/``tls.enable`` for
    the connections we open). mqlake's mode defaults to disabled: it makes no certificate of its own."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    server_mode: TlsMode = Field("disabled", alias="tls.server.mode")
    server_cert_path: Path | None = Field(None, alias="tls.server.certPath")
    server_key_path: Path | None = Field(None, alias="tls.server.keyPath")
    server_key_password: str | None = Field(None, alias="tls.server.keyPassword", repr=False)
    server_trust_cert_path: Path | None = Field(None, alias="tls.server.trustCertPath")
    server_need_client_auth: Literal["none", "optional", "require"] = Field(
        "none", alias="tls.server.need.client.auth"
    )
    client_enable: bool = Field(False, alias="tls.enable")
    client_cert_path: Path | None = Field(None, alias="tls.client.certPath")
    client_key_path: Path | None = Field(None, alias="tls.client.keyPath")
    client_key_password: str | None = Field(None, alias="tls.client.keyPassword", repr=False)
    client_trust_cert_path: Path | None = Field(None, alias="tls.client.trustCertPath")
    client_auth_server: bool = Field(False, alias="tls.client.authServer")

    @model_validator(mode="after")
    def _server_files(self) -> TlsConfig:
        if self.server_mode != "disabled" and (self.server_cert_path is None or self.server_key_path is None):
            raise ValueError(
                f"tls.server.mode={self.server_mode} needs tls.server.certPath and tls.server.keyPath "
                "(mqlake does not make a self-signed certificate)"
            )
        if self.server_need_client_auth == "require" and self.server_trust_cert_path is None:
            raise ValueError("tls.server.need.client.auth=require needs tls.server.trustCertPath")
        return self
