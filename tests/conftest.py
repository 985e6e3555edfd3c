"""Shared pytest plumbing: figures that tests report at the end of a run.

A test takes the ``report_lines`` fixture and appends lines to it; they are
printed in a "tirbyoc reliability figures" section of the terminal summary
(also with ``-q``), so long fuzz or sanitizer runs leave their numbers
(cases per kernel and instruction set, checks, times) in the log.
"""

import pytest

_REPORT_KEY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def report_lines(request):
    """A list of lines for the terminal summary of this run."""
    return request.config.stash.setdefault(_REPORT_KEY, [])


def pytest_terminal_summary(terminalreporter, config):
    lines = config.stash.get(_REPORT_KEY, [])
    if lines:
        terminalreporter.section("tirbyoc reliability figures")
        for line in lines:
            terminalreporter.write_line(line)
