"""SSL contexts from the ``tls.*`` keys of broker.conf (broker.config.TlsConfig), for our ports and our clients."""

from __future__ import annotations

import ssl

from broker.remoting.tls import client_context, server_context
from broker.tls_config import TlsConfig


def tls_server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The context of a TLS port (``tls.server.*``), None when ``tls.server.mode`` is disabled."""
    if tls.server_mode == "disabled" or tls.server_cert_path is None or tls.server_key_path is None:
        return None
    return server_context(tls.server_cert_path, tls.server_key_path, password=tls.server_key_password,
                          trust=tls.server_trust_cert_path, need_client_auth=tls.server_need_client_auth)  # fmt: skip


def tls_client_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The context of the connections we open (``tls.enable``, ``tls.client.*``), None when TLS is off."""
    if not tls.client_enable:
        return None
    return client_context(trust=tls.client_trust_cert_path, verify_server=tls.client_auth_server,
                          cert=tls.client_cert_path, key=tls.client_key_path,
                          password=tls.client_key_password)  # fmt: skip
