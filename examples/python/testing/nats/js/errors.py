"""The nats-py JetStream errors the examples catch (nats/js/errors.py)."""

from .. import errors


class Error(errors.Error):
    pass


class NoStreamResponseError(Error):
    """A JetStream publish no stream took (the server answered 503: no
    responders), as nats-py's js.publish raises it."""

    def __str__(self):
        return "nats: no response from stream"
