"""Validation of NCCL settings: values and contradictions (launcher) and against the node
(entrypoint, before the process group exists). Every problem is one line."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping

from toolkit.config.job import JobConfig
from toolkit.config.nccl import NcclConfig
from toolkit.nccl.known import is_nccl_family, unknown_names
from toolkit.nccl.sysfs import NodeTopology

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "NODE")
ALGOS = (
    "Tree",
    "Ring",
    "CollNet",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
)
PROTOS = ("LL", "LL128", "Simple")
RDMA_PROFILES = ("infiniband", "roce")


def _int_range(lo: int, hi: int | None) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            number = int(value, 0)
        except ValueError:
            return f"must be an integer{_span(lo, hi)}"
        if number < lo or (hi is not None and number > hi):
            return f"must be{_span(lo, hi)}"
        return None

    return check


def _span(lo: int, hi: int | None) -> str:
    return f" >= {lo}" if hi is None else f" in {lo}..{hi}"


def _choice(
    allowed: tuple[str, ...], numeric_max: int | None = None
) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if value.upper() in (a.upper() for a in allowed):
            return None
        if numeric_max is not None and value.isdigit() and int(value) <= numeric_max:
            return None
        extra = f" or 0..{numeric_max}" if numeric_max is not None else ""
        return f"allowed: {', '.join(allowed)}{extra}"

    return check


def _token_list(allowed: tuple[str, ...]) -> Callable[[str], str | None]:
    """NCCL_ALGO/NCCL_PROTO: comma list, optional leading ^ (exclude)."""

    def check(value: str) -> str | None:
        tokens = [t.strip() for t in value.lstrip("^").split(",") if t.strip()]
        bad = [t for t in tokens if t.lower() not in (a.lower() for a in allowed)]
        return (
            f"unknown {', '.join(bad)}; allowed: {', '.join(allowed)}"
            if bad or not tokens
            else None
        )

    return check


VALUE_CHECKS: dict[str, Callable[[str], str | None]] = {
    "NCCL_DEBUG": _choice(NcclConfig.DEBUG_LEVELS),
    "NCCL_IB_DISABLE": _int_range(0, 1),
    "NCCL_P2P_DISABLE": _int_range(0, 1),
    "NCCL_SHM_DISABLE": _int_range(0, 1),
    "NCCL_NVLS_ENABLE": _int_range(0, 2),
    "NCCL_CROSS_NIC": _int_range(0, 2),
    "NCCL_IB_GID_INDEX": _int_range(-1, 255),
    "NCCL_IB_TIMEOUT": _int_range(1, 31),
    "NCCL_IB_RETRY_CNT": _int_range(0, 7),
    "NCCL_BUFFSIZE": _int_range(1, None),
    "NCCL_MIN_CTAS": _int_range(1, 32),
    "NCCL_MAX_CTAS": _int_range(1, 32),
    "NCCL_SOCKET_NTHREADS": _int_range(1, 16),
    "NCCL_NSOCKS_PERTHREAD": _int_range(1, 64),
    "NCCL_NET_GDR_LEVEL": _choice(GDR_LEVELS, numeric_max=5),
    "NCCL_P2P_LEVEL": _choice((*GDR_LEVELS, "NVL"), numeric_max=5),
    "NCCL_ALGO": _token_list(ALGOS),
    "NCCL_PROTO": _token_list(PROTOS),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": _int_range(0, 3),
    "TORCH_FR_BUFFER_SIZE": _int_range(0, None),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": _int_range(0, None),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": _int_range(0, 1),
}


def value_problems(env: Mapping[str, str], where: str) -> list[str]:
    """`where` names the field the values came from (nccl.env, nccl.profile_env, environment)."""
    problems = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            problems.append(f"{where}.{name}: not a valid environment variable name")
            continue
        check = VALUE_CHECKS.get(name)
        error = check(str(value)) if check else None
        if error:
            problems.append(f"{where}.{name}={value}: {error}")
    return problems


def contradictions(
    profile: str, merged: Mapping[str, str], sources: Mapping[str, str]
) -> list[str]:
    """Settings that cannot all hold. `sources` names where each variable was set."""
    problems = []

    def named(var: str) -> str:
        return f"{sources.get(var, 'nccl.env')}.{var}={merged[var]}"

    ib_off = merged.get("NCCL_IB_DISABLE") == "1"
    if profile in RDMA_PROFILES and ib_off:
        problems.append(
            f"{named('NCCL_IB_DISABLE')}: contradicts nccl={profile}, which needs the IB verbs "
            "transport; remove it or use nccl=ethernet"
        )
    for var in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"):
        if ib_off and var in merged and profile not in RDMA_PROFILES:
            problems.append(
                f"{named(var)}: has no effect with NCCL_IB_DISABLE=1 (nccl={profile}); "
                "use nccl=infiniband/roce/auto or drop it"
            )
    lo, hi = merged.get("NCCL_MIN_CTAS"), merged.get("NCCL_MAX_CTAS")
    if lo and hi and lo.isdigit() and hi.isdigit() and int(lo) > int(hi):
        problems.append(
            f"NCCL_MIN_CTAS={lo} > NCCL_MAX_CTAS={hi}: the minimum must not exceed the maximum"
        )
    threads, socks = merged.get("NCCL_SOCKET_NTHREADS"), merged.get("NCCL_NSOCKS_PERTHREAD")
    if (
        threads
        and socks
        and threads.isdigit()
        and socks.isdigit()
        and int(threads) * int(socks) > 64
    ):
        problems.append(
            f"NCCL_SOCKET_NTHREADS={threads} x NCCL_NSOCKS_PERTHREAD={socks} = "
            f"{int(threads) * int(socks)}: NCCL allows at most 64 sockets per connection"
        )
    return problems


def config_problems(cfg: NcclConfig, num_nodes: int, environ: Mapping[str, str]) -> list[str]:
    """Launcher-level checks of the variables against what NCCL knows, and their
    contradictions (the plain fields are checked by toolkit.config.nccl.problems)."""
    problems = []
    inherited = {k: v for k, v in environ.items() if is_nccl_family(k)}
    problems += value_problems(cfg.profile_env, "nccl.profile_env")
    problems += value_problems(cfg.env, "nccl.env")
    problems += value_problems(inherited, "environment")
    merged = {**cfg.profile_env, **inherited, **cfg.env}
    sources = {
        **dict.fromkeys(cfg.profile_env, "nccl.profile_env"),
        **dict.fromkeys(inherited, "environment"),
        **dict.fromkeys(cfg.env, "nccl.env"),
    }
    if cfg.profile in NcclConfig.PROFILES:
        problems += contradictions(cfg.profile, merged, sources)
    return problems


def _entries(spec: str) -> tuple[bool, list[tuple[str, bool, int | None]]]:
    """NCCL list syntax: optional ^ (exclude), optional = (exact names, for the whole list),
    then comma entries, each with an optional :port. -> (exclude, [(name, exact, port)])"""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    out = []
    for raw in body.lstrip("=").split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, _, port = raw.partition(":")
        out.append((name, exact, int(port) if port.isdigit() else None))
    return exclude, out


def _matches(name: str, exact: bool, candidates: list[str]) -> list[str]:
    return [c for c in candidates if (c == name if exact else c.startswith(name))]


def node_problems(
    profile: str, fabric: str, merged: Mapping[str, str], topo: NodeTopology
) -> list[str]:
    """Checks against this node's devices; `merged` is the effective variable set."""
    problems = []
    if profile in RDMA_PROFILES:
        layer = "InfiniBand" if profile == "infiniband" else "Ethernet"
        if not topo.active_ports(layer):
            seen = ", ".join(f"{p.name} {p.state} {p.link_layer}" for p in topo.ib_ports) or "none"
            problems.append(
                f"nccl={profile}: no ACTIVE {layer}-link-layer RDMA port on this node "
                f"(ports: {seen}); use nccl=auto"
            )
    ib_off = merged.get("NCCL_IB_DISABLE") == "1"
    if profile in RDMA_PROFILES and ib_off:
        problems.append(f"NCCL_IB_DISABLE=1 contradicts nccl={profile}")
    hca = merged.get("NCCL_IB_HCA")
    if hca:
        exclude, entries = _entries(hca)
        devices = topo.ib_devices
        for name, exact, port in entries:
            found = _matches(name, exact, devices)
            if not found and not exclude:
                problems.append(
                    f"NCCL_IB_HCA={hca}: no HCA {'named' if exact else 'starting with'} '{name}' "
                    f"on this node; present: {', '.join(devices) or 'none'}"
                )
            elif port is not None and not exclude:
                ports = {p.port for p in topo.ib_ports if p.device in found}
                if port not in ports:
                    problems.append(
                        f"NCCL_IB_HCA={hca}: {name} has no port {port}; ports: "
                        f"{', '.join(map(str, sorted(ports))) or 'none'}"
                    )
    ifname = merged.get("NCCL_SOCKET_IFNAME")
    if ifname:
        exclude, entries = _entries(ifname)
        names = [i.name for i in topo.interfaces]
        if not exclude and names:
            missing = [n for n, exact, _ in entries if not _matches(n, exact, names)]
            if missing:
                problems.append(
                    f"NCCL_SOCKET_IFNAME={ifname}: no interface matching "
                    f"{', '.join(missing)} on this node; present: {', '.join(names)}"
                )
    gid = merged.get("NCCL_IB_GID_INDEX")
    if gid and fabric == "roce" and gid.lstrip("-").isdigit() and int(gid) >= 0:
        index = int(gid)
        for port in topo.active_ports("Ethernet"):
            indices = [g.index for g in port.gids]
            if port.gids and index not in indices:
                v2 = [str(g.index) for g in port.gids if g.is_roce_v2]
                problems.append(
                    f"NCCL_IB_GID_INDEX={gid}: {port.name} has no GID {index}; RoCE v2 GIDs: "
                    f"{', '.join(v2) or 'none'}"
                )
    return problems


def check_job(job: JobConfig, world_size: int) -> list[str]:
    """Launcher-level NCCL checks (registered in VALIDATORS); typos in variable names only
    warn, since NCCL ignores them."""
    cfg = job.nccl
    names = [*cfg.profile_env, *cfg.env, *(k for k in os.environ if is_nccl_family(k))]
    for line in unknown_names(names):
        warnings.warn(f"nccl: {line}", stacklevel=2)
    return config_problems(cfg, job.cluster.nodes, os.environ)
