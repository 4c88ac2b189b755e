"""Ordeal's exit codes: the one place they are defined (README "Exit codes", ``ordeal --help``).

0 every invariant holds; 1 a violation; 2 unknown (nothing failed, but something could not be decided);
3 a usage or load error: a scenario, plan, matrix or run directory that cannot be used, or a bad option.
Nothing ran or was checked, so it is neither a verdict (1) nor an undecided run (2).
"""

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2
EXIT_USAGE = 3

HELP = ("Exit codes: 0 pass, 1 violation, 2 unknown (could not decide), 3 usage or load error "
        "(a scenario, plan, matrix or run directory that cannot be used, or a bad option).")
