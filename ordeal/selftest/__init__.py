"""The self-test: the defect detection matrix, the false-alarm budget and black-box findings.

The matrix (selftest/matrix.toml) names, for every defect of the reference broker's catalog, a fixed
scenario and seeds and the invariant(s) that must fail when the defect is switched on.  A tier's runs (the
defect runs, the same scenarios with the correct broker, the repeated correct runs of the false-alarm
budget, the black-box runs) are played one after the other and then checked together in one Spark job, so
the checker's start-up is paid once; each run is judged against its expectation and the outputs are
written: selftest.json, selftest.html, selftest-junit.xml and selftest.md.

Exit code: 1 when a covered defect was missed or a correct run had a violation; else 2 when anything is
unknown (a run or invariant undecided, a catalog defect without an entry in the full tier); else 0.

Rooms: ``matrix`` (the matrix file, parsed and validated), ``tier`` (the runs a tier asks for), ``judging``
(one run's outcome, the per-defect summaries, the exit code), ``runner`` (playing, checking, re-judging),
``outputs`` (selftest.json, the text and Markdown tables, JUnit) and ``page`` (selftest.html, from
page.html.j2).
"""
