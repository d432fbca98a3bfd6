import sys

from toolkit.readonly import READ_ONLY_COMMANDS, drop_working_dir

# A command that reads run dirs imports none of their code (perfmodel only with --run).
if sys.argv[1:2] and (
    sys.argv[1] in READ_ONLY_COMMANDS
    or (sys.argv[1] == "perfmodel" and any(a.split("=")[0] == "--run" for a in sys.argv[2:]))
):
    drop_working_dir()

from toolkit.cli.main import main  # noqa: E402

sys.exit(main())
