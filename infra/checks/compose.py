#!/usr/bin/env python3
"""Checks docker-compose.yml and the compose.fargate.yml overlay without Docker.

Merges the overlay into the base the way `docker compose -f a -f b` does for the keys used here
(mappings merged key by key, sequences such as ports appended, command/entrypoint/healthcheck.test
replaced, environment lists read as mappings), writes the merged file for the schema check, and
asserts what the docs claim: the merged API is limited to 0.25 CPU and 512M with no swap, in one
place, at the same shape as the ECS task and `cargo xtask pinned`.

Usage: compose.py MERGED_OUT  (run from the repository root; prints `N passed, M failed`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import yaml

from tally import Checks, failures

BASE = Path("docker-compose.yml")
OVERLAY = Path("compose.fargate.yml")
# Sequences that compose replaces instead of appending.
REPLACED = {"command", "entrypoint", "test"}
UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}


def interpolate(value, env=os.environ):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $$ in strings."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1) or m.group(4), m.group(2), m.group(3)
        got = env.get(name)
        if op == ":-":
            return got if got else default
        if op == "-":
            return got if got is not None else default
        return got or ""

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, value)


def env_mapping(env):
    if isinstance(env, list):
        out = {}
        for item in env:
            key, _, val = str(item).partition("=")
            out[key] = val if "=" in str(item) else None
        return out
    return dict(env or {})


def merge(base, over, key=None):
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if k == "environment":
                out[k] = {**env_mapping(base.get(k)), **env_mapping(v)}
            elif k in out:
                out[k] = merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(over, list) and key not in REPLACED:
        return base + [v for v in over if v not in base]
    return copy.deepcopy(over)


def load(path: Path):
    with path.open() as f:
        return interpolate(yaml.safe_load(f))


def parse_bytes(value) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"not a byte size: {value!r}")
    return int(m.group(1)) * UNITS[m.group(2).lower()]


def parse_secs(value) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)?", str(value))
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


def run(base, overlay, c: Checks) -> dict:
    merged = merge(base, overlay)
    services = merged.get("services", {})
    api = services.get("api", {})
    limits = api.get("deploy", {}).get("resources", {}).get("limits", {})

    c.check(float(limits.get("cpus", "nan")) == 0.25, f"merged api cpus limit is 0.25 (got {limits.get('cpus')!r})")
    memory = parse_bytes(limits.get("memory", 0))
    c.check(memory == 512 << 20, f"merged api memory limit is 512M (got {limits.get('memory')!r})")
    swap = api.get("memswap_limit")
    c.check(swap is not None and parse_bytes(swap) == memory, f"memswap_limit equals the memory limit: no swap (got {swap!r})")
    c.check(
        "cpus" not in api and "mem_limit" not in api,
        "the limits are stated once (deploy.resources.limits), not also as cpus/mem_limit",
    )
    base_api = base["services"]["api"]
    c.check(
        "deploy" not in base_api and "memswap_limit" not in base_api,
        "the base file leaves the API unpinned (the overlay alone sets the shape)",
    )

    pg, redis = services.get("postgres", {}), services.get("redis", {})
    c.check(str(pg.get("image", "")).startswith("postgres:16"), f"PostgreSQL 16 ({pg.get('image')})")
    c.check(str(redis.get("image", "")).startswith("redis:7"), f"Redis 7 ({redis.get('image')})")
    c.check("healthcheck" in pg and "healthcheck" in redis, "PostgreSQL and Redis are health-checked")

    def needs(service: str, dep: str, condition: str) -> bool:
        return services.get(service, {}).get("depends_on", {}).get(dep, {}).get("condition") == condition

    c.check(needs("migrate", "postgres", "service_healthy"), "migrate waits for a healthy PostgreSQL")
    c.check(needs("seed", "migrate", "service_completed_successfully"), "seed runs after the migrations")
    c.check(needs("api", "seed", "service_completed_successfully"), "the API starts on a seeded database")
    c.check(needs("worker", "migrate", "service_completed_successfully"), "the worker starts after the migrations")
    for one_shot in ("migrate", "seed"):
        c.check(services.get(one_shot, {}).get("restart") == "no", f"{one_shot} is one-shot (restart: no)")

    env = env_mapping(api.get("environment"))
    keep_alive, request, grace = (int(env.get(k, d)) for k, d in
                                  (("KEEP_ALIVE_TIMEOUT_SECS", 75), ("REQUEST_TIMEOUT_SECS", 30), ("SHUTDOWN_GRACE_SECS", 25)))
    c.check(keep_alive > request, f"api keep-alive ({keep_alive} s) outlives the handler timeout ({request} s)")
    stop = parse_secs(api.get("stop_grace_period", "10s"))
    c.check(stop > grace, f"api stop_grace_period ({stop:g} s) exceeds SHUTDOWN_GRACE_SECS ({grace} s)")
    c.check("healthcheck" in api, "the API is health-checked")
    return merged


def same_shape_everywhere(c: Checks) -> None:
    """The overlay, the ECS task's default tier and the pinned runner's defaults agree."""
    text = Path("infra/cloudformation/service.yaml").read_text()
    tier = re.search(r"TaskSize:\s*\n\s*Type: String\s*\n\s*Default: (\S+)", text)
    c.check(tier is not None and tier.group(1) == "256-512", "the ECS API task defaults to 256 CPU / 512 MiB (0.25 vCPU)")
    pinned = Path("crates/lab/src/rig/pinned/command.rs").read_text()
    c.check(
        'default_value = "0.25"' in pinned and 'default_value = "512M"' in pinned,
        "cargo xtask pinned defaults to 0.25 core and 512M",
    )


def self_test() -> None:
    """The checker must catch what it claims to: a wrong overlay fails."""
    base, overlay = load(BASE), load(OVERLAY)
    assert merge({"a": [1], "command": ["x"]}, {"a": [2], "command": ["y"]}) == {"a": [1, 2], "command": ["y"]}
    assert merge({"environment": ["A=1"]}, {"environment": {"B": "2"}}) == {"environment": {"A": "1", "B": "2"}}
    assert parse_bytes("512M") == 512 << 20 and parse_bytes("1g") == 1 << 30
    assert interpolate("${X:-d}$$", {}) == "d$" and interpolate("${X:-d}", {"X": "v"}) == "v"
    for mutate in (
        lambda o: o["services"]["api"]["deploy"]["resources"]["limits"].update(cpus="0.5"),
        lambda o: o["services"]["api"]["deploy"]["resources"]["limits"].update(memory="1G"),
        lambda o: o["services"]["api"].pop("memswap_limit"),
        lambda o: o["services"]["api"].update(mem_limit="512M"),
    ):
        bad = copy.deepcopy(overlay)
        mutate(bad)
        assert failures(run, base, bad) > 0, "a broken overlay passed the checks"


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("target/infra-check/compose.merged.json")
    self_test()
    c = Checks()
    print("compose: docker-compose.yml + compose.fargate.yml")
    merged = run(load(BASE), load(OVERLAY), c)
    same_shape_everywhere(c)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2))
    print(f"compose: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
