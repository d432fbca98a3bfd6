"""One redaction for everything a run records about its config, environment and command line.

A name is secret when one of its `_`/`.`/`-` separated parts ends in SECRET, PASSWORD,
PASSWD or CREDENTIAL(S) (`AWS_SECRET_ACCESS_KEY`, `DB_PASSWORD_FILE`), when its last part
ends in KEY(S) or TOKEN (`MY_API_TOKEN`, `APIKEY`, `API_KEYS`), or when its last part is
PAT or AUTH (`GH_PAT`, `REGISTRY_AUTH`); `tokens_per_s`, `SSH_AUTH_SOCK`, and a model's
`num_key_value_heads` or `bos_token_id` are not. Values named so are replaced by REDACTED; in any other text, `NAME=value` and
`NAME: value` with a secret NAME lose their value, and a URL's password its password
(`https://u:pw@host` -> `https://u:***@host`). The value after a flag with such a name
(`--token VAL`, `--api-key VAL`, `--password VAL`) is redacted in argument lists and text
(a script's `script.args`; the script itself gets them as given). An environment keeps values only for an
allow-list of families that say how the job ran (`redact_env`: SLURM_, CUDA_, NCCL_, TORCH_,
OMP_, PYTHON..., the host and user names; ENV_VALUE_PREFIXES, ENV_VALUE_NAMES), the other
variables by name only.

What is not redacted, on purpose: RUN_DIR/config.yaml, which every rank reads back to run
the job (it must hold the values the job uses), and the setup lines of the sbatch script,
which Slurm executes. Both are readable by the job's user only (docs/slurm.md, "Secrets").
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"
_SECRET_PART = re.compile(r".*(SECRET|PASSWORD|PASSWD|CREDENTIALS?)", re.IGNORECASE)
_SECRET_LAST_PART = re.compile(r".*(KEYS?|TOKEN)|PAT|AUTH", re.IGNORECASE)
# scheme://user:password@ -> the password; user names and hosts stay readable.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]*):([^/\s@'\"]*)@")
# NAME=value or NAME: value (shell, env files, YAML, JSON, Hydra overrides like +x.MY_KEY=v).
_ASSIGNMENT = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>[\"']?\s*[:=]\s*)"
    r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s,'\"}\]]+)"
)

# A command-line flag with a secret name and its value as the next argument (`--token VAL`),
# in text: a shell line, a Hydra list (`script.args=[--api-key,VAL]`), YAML (`- --token`
# then `- VAL`), JSON or a Python list. (`--token=VAL` is an assignment, above.)
_FLAG = re.compile(r"--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)")
_FLAG_AND_VALUE = re.compile(
    r"(?<![\w-])(?P<flag>--?[A-Za-z][A-Za-z0-9_-]*)(?:"
    # YAML's block list: the value is the rest of the next item's line
    r"(?P<item>[\"']?[ \t]*\n[ \t]*-[ \t]+)(?P<line>[^\n]*[^\s])"
    # else a space or a comma, then one word or a quoted string
    r"|(?P<sep>[\"']?(?:[ \t]*,[ \t]*|[ \t]+))(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s,'\"\]}-][^\s,'\"\]}]*))"
)


def is_secret_flag(arg: str) -> bool:
    """`--token`, `--api-key`, `-password`: a flag whose value (the next argument) is secret."""
    m = _FLAG.fullmatch(arg.strip())
    return m is not None and is_secret_name(m["name"])


def is_secret_name(name: str) -> bool:
    parts = [p for p in re.split(r"[_.\-]", name) if p]
    if not parts:
        return False
    return any(_SECRET_PART.fullmatch(p) for p in parts) or bool(
        _SECRET_LAST_PART.fullmatch(parts[-1])
    )


def redact_text(text: str) -> str:
    """Free text (a command line, a shell line, YAML): secret assignments and URL passwords."""

    def assignment(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]) or m["value"] == REDACTED:
            return m[0]
        return f"{m['name']}{m['sep']}{REDACTED}"

    def flag(m: re.Match[str]) -> str:
        value = m["line"] if m["item"] is not None else m["value"]
        if not is_secret_flag(m["flag"]) or REDACTED in value or value.strip("'\"")[:1] == "-":
            return m[0]
        quote = value[0] if value[0] in "'\"" and value[-1] == value[0] else ""
        hidden = f"{quote}{REDACTED}{quote}"
        return f"{m['flag']}{m['item'] or m['sep']}{hidden}"

    text = _URL_PASSWORD.sub(r"\1:***@", text)
    return _FLAG_AND_VALUE.sub(flag, _ASSIGNMENT.sub(assignment, text))


def redact(value: Any) -> Any:
    """A copy of a config or environment structure (dicts, lists, strings) with every value
    under a secret name replaced by REDACTED and every string passed through `redact_text`."""
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and is_secret_name(k) and v else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):  # an argument list: `--token VAL` loses VAL
        out = []
        for i, v in enumerate(value):
            after_flag = i > 0 and isinstance(value[i - 1], str) and is_secret_flag(value[i - 1])
            hide = after_flag and v and not (isinstance(v, str) and v.startswith("-"))
            out.append(REDACTED if hide else redact(v))
        return out
    if isinstance(value, str):
        return redact_text(value)
    return value


# The environment variables whose values a record keeps (env.json): those that say how the
# job ran. Every other variable is recorded by name only (its value NOT_RECORDED), since a
# user's shell holds database passwords, API keys, cookies and webhook URLs under names no
# rule can tell from harmless ones. Kept values still go through `redact`.
ENV_VALUE_PREFIXES = (
    "SLURM_", "SLURMD_", "SBATCH_", "SRUN_",  # the scheduler
    "CUDA_", "NCCL_", "NVIDIA_", "UCX_", "FI_", "GLOO_", "TORCH_", "TORCHELASTIC_",
    "TORCHINDUCTOR_", "PYTORCH_", "TRITON_",  # devices, fabric, torch
    "OMP_", "MKL_", "KMP_",  # CPU threading
    "PYTHON", "HYDRA_", "TOOLKIT_", "LC_",
)  # fmt: skip
ENV_VALUE_NAMES = frozenset(
    {
        "HOSTNAME", "HOST", "USER", "LOGNAME", "HOME", "SHELL", "PWD", "TMPDIR", "PATH",
        "LD_LIBRARY_PATH", "LD_PRELOAD", "LANG", "LANGUAGE", "TZ", "VIRTUAL_ENV",
        "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
        "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "GROUP_RANK", "NODE_RANK",  # torch.distributed's rendezvous
    }
)  # fmt: skip
NOT_RECORDED = "<not recorded>"


def env_value_kept(name: str) -> bool:
    """Whether a record keeps this variable's value (see ENV_VALUE_PREFIXES)."""
    return name in ENV_VALUE_NAMES or name.startswith(ENV_VALUE_PREFIXES)


def redact_env(environ: dict[str, str]) -> dict[str, str]:
    """An environment for a record, sorted: every name; the values of the allow-listed
    families (env_value_kept) redacted as `redact` does, the others NOT_RECORDED (a secret
    name's REDACTED)."""
    return {
        name: redact({name: value})[name]
        if env_value_kept(name) or is_secret_name(name)
        else NOT_RECORDED
        for name, value in sorted(environ.items())
    }
