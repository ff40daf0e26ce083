"""The nats-py JetStream errors the examples catch (nats/js/errors.py)."""

from .. import errors


class Error(errors.Error):
    pass


class NoStreamResponseError(Error):
    """A JetStream publish no stream took (the server answered 503: no
    responders), as nats-py's js.publish raises it."""

    def __str__(self):
        return "nats: no response from stream"


class APIError(Error):
    """An error the JetStream API answered with."""


class ServiceUnavailableError(APIError):
    """The JetStream API answered 503 (JetStream not there)."""


class NotFoundError(APIError):
    """The JetStream API answered 404."""


class BucketNotFoundError(NotFoundError):
    """js.object_store() of a bucket whose stream is not there, as nats-py
    raises it."""
