"""The warm-up's sizes (``api.warm_up``, `ordeal spark start --warm-up`): here, not in api.py, so that the command
line reads them without importing the checkers."""

# The warm-up's histories, one per plan shape (job/sizing.py: PLANS): a run's (a synthetic run with an offline
# window, a fault, one lost and one reordered message) and the big plan's, forced on a bulk P2P history of this
# many events: enough that a JVM's first big check after it runs compiled code, little enough to take seconds
# (docs/measurements.md compares sizes).
WARM_UP_BIG_EVENTS = 1_000_000
# The smallest bulk history that still plants what the warm-up checks for (10 lost, 5 reordered messages).
WARM_UP_MIN_EVENTS = 10_000
# How many times the big history is checked.  Three: a fresh JVM's first big check after them is faster than
# after one, with less JIT work left, for a warm-up some seconds longer (docs/measurements.md).
WARM_UP_BIG_ROUNDS = 3
