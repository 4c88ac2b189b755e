"""A Redis node killed mid-request: redis-py's asyncio client lets the transport's own error out instead of its
ConnectionError (redis-py #4287); the broker treats exactly those as Redis unavailable (a WARNING, the client
reconnects), and every other error of the same types as its own (an ERROR with the traceback)."""

from __future__ import annotations

import pytest

from reference_broker.connection import leaked_redis_transport_error


def _raised_in(filename: str, error: BaseException) -> BaseException:
    code = compile("def write(error):\n    raise error\n", filename, "exec")
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - a frame with that file name, as the library's would be
    try:
        scope["write"](error)
    except BaseException as raised:  # noqa: BLE001
        return raised
    raise AssertionError("not raised")


@pytest.mark.parametrize("error", [AttributeError("'NoneType' object has no attribute 'writelines'"),
                                   RuntimeError("unable to perform operation on <TCPTransport closed=True>"),
                                   TypeError("'NoneType' object is not callable")])
def test_a_transport_error_out_of_redis_asyncio_is_redis_unavailable(error):
    assert leaked_redis_transport_error(_raised_in("/venv/site-packages/redis/asyncio/connection.py", error))


@pytest.mark.parametrize("error", [AttributeError("'NoneType' object has no attribute 'writelines'"),
                                   KeyError("conn")])
def test_the_same_error_elsewhere_or_another_type_is_the_brokers_own(error):
    assert not leaked_redis_transport_error(_raised_in("/work/reference_broker/store.py", error))
    assert not leaked_redis_transport_error(_raised_in("/venv/site-packages/redis/asyncio/connection.py", KeyError("x")))
