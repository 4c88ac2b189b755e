"""The warm-up's sizes (``api.warm_up``, `ordeal spark start --warm-up`): here, not in api.py, so that the command
line reads them without importing the checkers."""

# The warm-up's histories, one per plan shape (jobs.PLANS): a run's (a synthetic run with an offline window, a
# fault, one lost and one reordered message) and the big plan's, forced on a bulk P2P history of this many events.
# 1 M, measured (docs/report.md, session 16): a JVM's first 10 M check after it took 54.2-54.3 s, after 300 k
# 54.1-58.5 s, after neither 69.1-72.3 s.
WARM_UP_BIG_EVENTS = 1_000_000
# The smallest bulk history that still plants what the warm-up checks for (10 lost, 5 reordered messages).
WARM_UP_MIN_EVENTS = 10_000
# How many times the big history is checked.  Three, measured (docs/report.md, session 21): a fresh JVM's first
# 10 M check after the warm-up took a median 0.85x the time it took after one big check (4 alternating pairs,
# 3 faster), its JIT 13-16 CPU-s against 23-28 in every pair; the warm-up itself takes about 30 s longer.
WARM_UP_BIG_ROUNDS = 3
