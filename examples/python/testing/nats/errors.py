"""The nats-py errors the examples catch."""


class Error(Exception):
    pass


class TimeoutError(Error):  # noqa: A001 - nats-py's name
    pass


class NoRespondersError(Error):
    pass


class ObjectNotFoundError(Error):
    pass
