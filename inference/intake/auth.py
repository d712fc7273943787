"""`Authorization: Bearer <api key>` for the REST API.

Keys are stored as SHA-256 digests (a unique index makes every request one lookup), compared
in constant time, revocable and expiring. Failed attempts are counted per client address in
Redis: past `MAX_FAILED_AUTH_PER_MINUTE` the address gets 429 until the minute ends, so keys
cannot be guessed at speed.
"""

from __future__ import annotations

import hmac
import time

from rest_framework import authentication, exceptions

from inference.intake import lookups
from inference.models import ApiKey
from renq_site.shared_redis import shared_redis

MAX_FAILED_AUTH_PER_MINUTE = 30


def _client_address(request) -> str:
    return request.META.get("REMOTE_ADDR", "") or "unknown"


def _failures_key(request) -> str:
    return f"renq:authfail:{_client_address(request)}:{int(time.time() // 60)}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme != self.keyword or not key.strip():
            raise exceptions.AuthenticationFailed(
                "Authorization header must be 'Bearer <api key>'."
            )
        plaintext = key.strip()
        api_key = lookups.api_key(plaintext)
        if (
            api_key is None
            or not hmac.compare_digest(api_key.hashed_key, ApiKey.hash(plaintext))
            or api_key.expired
        ):
            # Counted only when wrong: a valid key costs no Redis round trip.
            failures_key = _failures_key(request)
            pipe = shared_redis().pipeline()
            pipe.incr(failures_key)
            pipe.expire(failures_key, 120)
            failures, _ = pipe.execute()
            if int(failures) > MAX_FAILED_AUTH_PER_MINUTE:
                raise exceptions.Throttled(
                    wait=60 - time.time() % 60, detail="Too many failed authentications."
                )
            raise exceptions.AuthenticationFailed("Invalid, revoked or expired API key.")
        return api_key.tenant, api_key

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate) rather than 403 when no key is given.
        return self.keyword
