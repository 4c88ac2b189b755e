"""When a Will is due once its connection ended ([MQTT-3.1.3-9]): after the Will Delay Interval, or when the
session ends if that comes first; at once for a clean session (it ends with the connection) and without a delay."""

import pytest

from reference_broker.server import due_in_s


@pytest.mark.parametrize("will_delay, persistent, session_expiry, due", [
    (0, True, None, 0),    # no delay: at once
    (5, False, 60, 0),     # a clean session ends with the connection: its Will with it
    (5, True, 0, 0),       # session expiry 0: the session ends now
    (5, True, None, 5),    # a session that never expires: the delay
    (5, True, 2, 2),       # the session ends first
    (3, True, 5, 3),       # the delay ends first
])
def test_a_will_is_due_after_its_delay_or_its_sessions_end_whichever_is_first(will_delay, persistent,
                                                                              session_expiry, due):
    assert due_in_s(will_delay, persistent, session_expiry) == due
