import sys

from toolkit.telemetry.cli import main

sys.exit(main())
