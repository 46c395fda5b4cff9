"""One TLS context for every HTTP client of the process.

httpx's default context (certifi's CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
when set), built once: an ``httpx.Client()`` without ``verify=`` builds its own, which
loads the bundle again (about 0.13 s of CPU each; a 4-trial run made six of them for its
health waits alone). The context is immutable once built, so sharing it is safe; the
aiohttp batch client verifies against the same CAs. Pass it as ``verify=`` to httpx
clients, ``ssl=`` to aiohttp connectors.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()
