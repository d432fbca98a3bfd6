import sys

from toolkit.readonly import drop_working_dir

drop_working_dir()  # report, compare, watch read run dirs: none of their code is imported

from toolkit.telemetry.cli import main  # noqa: E402

sys.exit(main())
