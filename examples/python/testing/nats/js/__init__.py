"""nats.js of nats-py: only its errors, which the examples catch."""

from . import errors  # noqa: F401
