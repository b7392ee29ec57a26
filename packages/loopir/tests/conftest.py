import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# every schedule a loopir test makes is verified in full, body-tracing rules included
# (kiln_loopir.ir.verify)
os.environ.setdefault("KILN_VERIFY_IR", "1")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("KILN_LOOPIR_SHOW_FALLBACKS"):
        from kiln_loopir import counters

        print("\nloopir counters:", counters.snapshot())
