"""Hydra's own `--info`, `--shell-completion` and `--hydra-help`, over the toolkit's config
search path (toolkit.config.sources), so they see the same options the launcher does."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from toolkit.config import sources
from toolkit.config.store import register_configs

INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def show_info(info: str, overrides: list[str], config_dirs: Sequence[str | os.PathLike]) -> None:
    register_configs()
    with sources.hydra_search_path(sources.search_dirs(config_dirs)) as hydra:
        hydra.show_info(info, config_name="config", overrides=overrides)


def shell_completion(command: list[str], config_dirs: Sequence[str | os.PathLike]) -> None:
    """`install=bash`, `uninstall=bash` or `query=bash` (with $COMP_LINE), as in Hydra.

    The script installed completes the `toolkit` command: Hydra's names the program after
    sys.argv[0] and calls `toolkit -sc query=bash` back with the line typed so far, which is
    handed here with the words before the first override dropped (`toolkit launch`,
    `python -m toolkit.launch`), as Hydra drops an app's name."""
    register_configs()
    line = os.environ.get("COMP_LINE")
    if line is not None:
        os.environ["COMP_LINE"] = "toolkit " + " ".join(strip_command(line.split(" ")))
    argv0 = sys.argv[0]
    sys.argv[0] = "toolkit"
    try:
        with sources.hydra_search_path(sources.search_dirs(config_dirs)) as hydra:
            hydra.shell_completion(config_name="config", overrides=command)
    finally:
        sys.argv[0] = argv0


def strip_command(words: list[str]) -> list[str]:
    """The words of a command line after the program (`python -m toolkit.launch`, `toolkit
    launch`) and its flags."""
    prefixes = (["python", "-m", "toolkit.launch"], ["toolkit", "launch"], ["toolkit"])
    for prefix in prefixes:
        n = len(prefix)
        if [w.rsplit("/", 1)[-1] for w in words[:n]] == prefix or (
            prefix[0] == "python"
            and words[:1]
            and "python" in words[0]
            and words[1:3] == prefix[1:]
        ):
            return words[n:]
    return words[1:]


def hydra_help(parser: argparse.ArgumentParser, overrides: list[str]) -> None:
    register_configs()
    with sources.hydra_search_path(sources.search_dirs()) as hydra:
        hydra.hydra_help("config", parser, argparse.Namespace(overrides=overrides))
