"""Run ``anyfp4 quantize`` that stops at one step of writing its checkpoint, so that a test can signal it there.

    python paused_quantize.py STEP NTH CONTROL_DIR QUANTIZE_ARGS...

See ``helpers.pause_at`` for CONTROL_DIR.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from anyfp4 import cli  # noqa: E402
from anyfp4.checkpoint import replace  # noqa: E402
from helpers import pause_at  # noqa: E402

if __name__ == "__main__":
    step, nth, control = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    replace.reached = pause_at(step, nth, control)
    sys.exit(cli.main(["quantize", *sys.argv[4:]]))
