"""Where config YAML comes from: the directories searched, in order, and which file each
chosen option came from.

Searched first to last (the first file found wins, as on a compiler's include path):

1. `--config-dir DIR` / `-cd DIR` of the command line, in the order given;
2. `$TOOLKIT_CONFIG_PATH`, colon-separated, in order;
3. the user's directory, `~/.config/toolkit/conf` ($TOOLKIT_USER_CONF moves it);
4. the site's directory, `/etc/toolkit/conf` ($TOOLKIT_SITE_CONF moves it);
5. the package's own `conf/` ($TOOLKIT_CONF_DIR moves it).

So a file in any of them adds an option to a group (`model/my_tcn.yaml`) or replaces one of
the package's (`cluster/slurm.yaml`); the command line's overrides still apply last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SITE_CONF = Path("/etc/toolkit/conf")


@dataclass(frozen=True)
class ConfigDir:
    """One searched directory and why it is searched."""

    path: Path
    origin: str  # command-line | TOOLKIT_CONFIG_PATH | user | site | package


def package_conf_dir() -> Path:
    """The YAML tree shipped with the package: $TOOLKIT_CONF_DIR, else conf/ beside it."""
    override = os.environ.get("TOOLKIT_CONF_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "conf"


def user_conf_dir() -> Path:
    if "TOOLKIT_USER_CONF" in os.environ:
        return Path(os.environ["TOOLKIT_USER_CONF"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "toolkit" / "conf"


def site_conf_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_SITE_CONF", str(SITE_CONF)))


def add_config_dir_option(parser: argparse.ArgumentParser) -> None:
    """`-cd DIR` / `--config-dir DIR` (repeatable, searched first, in the order given): the
    same option in every command that composes the job config (launch, perfmodel, plan)."""
    parser.add_argument(
        "-cd", "--config-dir", action="append", default=[], metavar="DIR", help="own configs"
    )


def search_dirs(config_dirs: Sequence[str | os.PathLike] = ()) -> list[ConfigDir]:
    """Every directory searched, highest priority first. Missing site and user directories
    are skipped; a missing `--config-dir` or $TOOLKIT_CONFIG_PATH entry is an error."""
    dirs = [ConfigDir(Path(d).resolve(), "command-line") for d in config_dirs]
    env_path = os.environ.get("TOOLKIT_CONFIG_PATH", "")
    dirs += [ConfigDir(Path(d).resolve(), "TOOLKIT_CONFIG_PATH") for d in env_path.split(":") if d]
    for d in dirs:
        if not d.path.is_dir():
            raise FileNotFoundError(f"config dir {d.path} ({d.origin}): no such directory")
    for path, origin in ((user_conf_dir(), "user"), (site_conf_dir(), "site")):
        if path.is_dir():
            dirs.append(ConfigDir(path.resolve(), origin))
    dirs.append(ConfigDir(package_conf_dir().resolve(), "package"))
    return dirs


def option_file(group: str, option: str, dirs: Sequence[ConfigDir]) -> ConfigDir | None:
    """The directory whose `<group>/<option>.yaml` is used (the first that has one)."""
    for d in dirs:
        if (d.path / group / f"{option}.yaml").is_file():
            return d
    return None


def group_options(group: str, dirs: Sequence[ConfigDir]) -> dict[str, ConfigDir]:
    """option -> the directory it comes from, over every searched directory, sorted."""
    found: dict[str, ConfigDir] = {}
    for d in dirs:
        folder = d.path / group
        if folder.is_dir():
            for p in folder.glob("*.yaml"):
                found.setdefault(p.stem, d)
    return dict(sorted(found.items()))


def sources_of(choices: dict[str, str | None], dirs: Sequence[ConfigDir]) -> dict[str, str]:
    """group -> the file each chosen option was read from (Hydra's own groups left out)."""
    out: dict[str, str] = {}
    for group, option in choices.items():
        if option is None or group.startswith("hydra"):
            continue
        d = option_file(group, str(option), dirs)
        if d is not None:
            out[group] = f"{d.path / group / option}.yaml ({d.origin})"
    return out


@contextlib.contextmanager
def hydra_search_path(dirs: Sequence[ConfigDir]) -> Iterator[Any]:
    """Initialise Hydra (as `initialize_config_dir` does) with every directory searched, the
    package's conf/ as Hydra's primary one and the others before it; yields Hydra's object
    (for --info, --shell-completion and --hydra-help)."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    version.setbase("1.3")

    *extra, package = dirs
    search_path = create_config_search_path(str(package.path))
    for d in extra:  # highest first: each goes just before the package's, after the previous
        search_path.prepend(f"toolkit-{d.origin}", str(d.path), SearchPathQuery(provider="main"))
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
    try:
        yield hydra
    finally:
        GlobalHydra.instance().clear()
