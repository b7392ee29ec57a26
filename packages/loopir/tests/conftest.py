import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("KILN_LOOPIR_SHOW_FALLBACKS"):
        from kiln_loopir import counters

        print("\nloopir counters:", counters.snapshot())
