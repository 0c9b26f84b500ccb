#!/usr/bin/env python3
"""Invariants of the CloudFormation templates that cfn-lint and checkov do not know.

- Timeouts nest: the API's keep-alive idle timeout (75 s) > the ALB idle timeout (60 s) > the
  longest handler timeout (REQUEST_TIMEOUT_SECS, 30 s), for every value the parameters allow.
- Draining fits: deregistration delay < container stop timeout <= 120 s, and the API's
  SHUTDOWN_GRACE_SECS < the stop timeout.
- The API task is 256 CPU / 512 MiB by default; autoscaling tracks 60% CPU from 2 to 6 tasks,
  scale-out cooldown 60 s, scale-in 120-300 s.
- The target group checks a route the API serves (`/ready`, read from the API's source), on the
  API's ops listener (`OPS_ADDR`), while traffic goes to the public port; nothing opens the ops
  port to the internet, so `/ready`, `/metrics` and `/v1/ops/status` are not reachable from it.
- Each connection profile, at each task size: both pace accepts at the tier's rate; `requests` in
  the API's short bursts over a short backlog; `streams` in a burst as deep as the connection cap,
  with the unanswered cap, over a backlog as deep as the connection cap, with
  `net.core.somaxconn` raised so the kernel keeps it.
- The API and the worker run with APP_ENV=production and JSON logs; the worker's health check
  asks the port it serves `/health` on.
- Secrets reach containers as secrets, never as plain environment; services run in private
  subnets without public IPs, with the circuit breaker and rollback; every imported value is
  exported by a stack deployed earlier.
- The alarms: the API and the worker write their CloudWatch lines (at least once a minute) in
  the namespace and environment the alarms watch; every alarm notifies one of the stack's topics,
  which the environment's key encrypts and lets CloudWatch publish to; every alarm on the app's
  metrics watches the API's or the worker's line of its own environment.
- Every checkov skip carries a reason and suppresses a check that ran (with `--checkov-json`).

Usage: invariants.py [--checkov-json FILE]  (from the repository root; prints `N passed, M failed`).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import yaml

from tally import Checks, failures

ROOT = Path("infra/cloudformation")
# Deploy order: a stack may import only what an earlier one exports.
ORDER = ["security", "network", "data", "edge", "service", "alarms"]
HEALTH_ROUTES = Path("crates/api/src/routes/health.rs")
API_CONFIG = Path("crates/api/src/config.rs")
SECRET_NAMES = re.compile(r"SECRET|PASSWORD|TOKEN|REDIS_URL", re.I)


class CfnLoader(yaml.SafeLoader):
    """Reads the short-form intrinsic functions (!Ref, !Sub, ...) as their long forms."""


def _intrinsic(loader: CfnLoader, suffix: str, node: yaml.Node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _intrinsic)


def load_templates() -> dict[str, dict]:
    return {name: yaml.load((ROOT / f"{name}.yaml").read_text(), Loader=CfnLoader) for name in ORDER}


def param(t: dict, name: str) -> dict:
    return t.get("Parameters", {}).get(name, {})


def resolve(t: dict, node, given: dict | None = None):
    """A value with parameter Refs (the values `given`, else the defaults), FindInMap and If
    replaced; other intrinsics stay. `AWS::NoValue` is None."""
    given = given or {}
    if isinstance(node, dict) and list(node) == ["Ref"] and node["Ref"] in t.get("Parameters", {}):
        return given.get(node["Ref"], param(t, node["Ref"]).get("Default"))
    if isinstance(node, dict) and node == {"Ref": "AWS::NoValue"}:
        return None
    if isinstance(node, dict) and list(node) == ["Fn::FindInMap"]:
        m, k1, k2 = (resolve(t, x, given) for x in node["Fn::FindInMap"])
        return t["Mappings"][m][k1][k2]
    if isinstance(node, dict) and list(node) == ["Fn::If"]:
        name, then, otherwise = node["Fn::If"]
        return resolve(t, then if condition(t, t["Conditions"][name], given) else otherwise, given)
    return node


def condition(t: dict, node, given: dict) -> bool:
    """A condition of the template (Equals, Not, And, Or, Condition), for these parameters."""
    (fn, args), = node.items()
    if fn == "Fn::Equals":
        a, b = (resolve(t, x, given) for x in args)
        return str(a) == str(b)
    if fn == "Fn::Not":
        return not condition(t, args[0], given)
    if fn == "Fn::And":
        return all(condition(t, x, given) for x in args)
    if fn == "Fn::Or":
        return any(condition(t, x, given) for x in args)
    if fn == "Condition":
        return condition(t, t["Conditions"][args], given)
    raise AssertionError(f"condition {fn} is not understood")


def num(t: dict, node) -> float:
    value = resolve(t, node)
    return float(value)


def bounds(t: dict, node) -> tuple[float, float]:
    """The range a value may take: a parameter's MinValue..MaxValue (or its AllowedValues)."""
    if isinstance(node, dict) and list(node) == ["Ref"]:
        p = param(t, node["Ref"])
        if "AllowedValues" in p:
            values = [float(v) for v in p["AllowedValues"]]
            return min(values), max(values)
        default = float(p["Default"])
        return float(p.get("MinValue", default)), float(p.get("MaxValue", default))
    value = num(t, node)
    return value, value


def of_type(t: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in t.get("Resources", {}).items() if r.get("Type") == kind}


def only(t: dict, kind: str) -> dict:
    found = of_type(t, kind)
    if len(found) != 1:
        raise AssertionError(f"expected one {kind}, found {len(found)}")
    return next(iter(found.values()))["Properties"]


def attributes(props: dict, key: str) -> dict:
    return {a["Key"]: a["Value"] for a in props.get(key, [])}


def container(t: dict, family_suffix: str) -> dict:
    for r in of_type(t, "AWS::ECS::TaskDefinition").values():
        family = r["Properties"]["Family"]
        text = family.get("Fn::Sub", "") if isinstance(family, dict) else family
        if text.endswith(f"-{family_suffix}"):
            return r["Properties"]
    raise AssertionError(f"no {family_suffix} task definition")


def env_of(t: dict, c: dict, given: dict | None = None) -> dict:
    """A container's environment for these parameters (an entry under an `If` may be absent)."""
    entries = (resolve(t, e, given) for e in c.get("Environment", []))
    return {e["Name"]: resolve(t, e["Value"], given) for e in entries if e is not None}


def environment_entries(c: dict) -> list[dict]:
    """Every entry a container's environment can hold, those under an `If` in either branch."""
    out = []
    for e in c.get("Environment", []):
        branches = e["Fn::If"][1:] if isinstance(e, dict) and list(e) == ["Fn::If"] else [e]
        out += [b for b in branches if isinstance(b, dict) and "Name" in b]
    return out


def api_default(env: str) -> str:
    """The API's own default for the setting `env` (its clap `default_value_t`)."""
    found = re.search(rf'env = "{env}", default_value_t = ([^)\]]+)\)', API_CONFIG.read_text())
    if not found:
        raise AssertionError(f"{env} has no default in {API_CONFIG}")
    return found.group(1).strip()


def export_name(node) -> str | None:
    """`${EnvironmentName}-X` from an Export's or ImportValue's Fn::Sub."""
    if isinstance(node, dict) and "Fn::Sub" in node and isinstance(node["Fn::Sub"], str):
        return node["Fn::Sub"]
    return None


def imports(node, found: list) -> list:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "Fn::ImportValue":
                found.append(export_name(v))
            imports(v, found)
    elif isinstance(node, list):
        for v in node:
            imports(v, found)
    return found


def run(ts: dict[str, dict], c: Checks) -> None:
    edge, svc, data, net = ts["edge"], ts["service"], ts["data"], ts["network"]
    api = container(svc, "api")
    api_c = api["ContainerDefinitions"][0]
    api_env = env_of(svc, api_c)

    # Timeouts nest, for every allowed ALB idle timeout.
    alb = only(edge, "AWS::ElasticLoadBalancingV2::LoadBalancer")
    idle_node = attributes(alb, "LoadBalancerAttributes")["idle_timeout.timeout_seconds"]
    idle_lo, idle_hi = bounds(edge, idle_node)
    keep_alive = float(api_env["KEEP_ALIVE_TIMEOUT_SECS"])
    request = float(api_env["REQUEST_TIMEOUT_SECS"])
    c.check(num(edge, idle_node) == 60, f"ALB idle timeout is 60 s (got {num(edge, idle_node):g})")
    c.check(keep_alive == 75, f"API keep-alive idle timeout is 75 s (got {keep_alive:g})")
    c.check(keep_alive > idle_hi, f"keep-alive {keep_alive:g} s > ALB idle timeout (at most {idle_hi:g} s)")
    c.check(idle_lo > request, f"ALB idle timeout (at least {idle_lo:g} s) > handler timeout {request:g} s")
    c.check(
        attributes(alb, "LoadBalancerAttributes").get("routing.http.drop_invalid_header_fields.enabled") == "true",
        "the ALB drops invalid header fields",
    )

    # Draining fits inside the stop timeout.
    tg = only(edge, "AWS::ElasticLoadBalancingV2::TargetGroup")
    dereg = num(edge, attributes(tg, "TargetGroupAttributes")["deregistration_delay.timeout_seconds"])
    stop_node = api_c["StopTimeout"]
    stop, (stop_lo, stop_hi) = num(svc, stop_node), bounds(svc, stop_node)
    c.check(dereg == 30, f"deregistration delay is 30 s (got {dereg:g})")
    c.check(dereg < stop <= 120, f"deregistration delay {dereg:g} s < API stop timeout {stop:g} s <= 120 s")
    c.check(stop_hi <= 120, f"the stop timeout parameter allows at most 120 s (max {stop_hi:g})")
    grace = float(api_env["SHUTDOWN_GRACE_SECS"])
    c.check(grace < stop_lo, f"SHUTDOWN_GRACE_SECS {grace:g} s < stop timeout (at least {stop_lo:g} s)")
    for name in ("worker",):
        w = container(svc, name)["ContainerDefinitions"][0]
        c.check(0 < num(svc, w["StopTimeout"]) <= 120, f"{name} stop timeout is at most 120 s")

    # Both long-running containers run as production (the worker's webhook policy: https to
    # public addresses only) and log JSON lines; the worker's health check asks the port it serves.
    worker_c = container(svc, "worker")["ContainerDefinitions"][0]
    worker_env = env_of(svc, worker_c)
    for name, env in (("api", api_env), ("worker", worker_env)):
        got = (env.get("APP_ENV"), env.get("LOG_FORMAT"))
        c.check(got == ("production", "json"), f"{name}: APP_ENV=production, LOG_FORMAT=json (got {got})")
    port = str(worker_env.get("WORKER_METRICS_ADDR", "")).rpartition(":")[2]
    probe = " ".join(worker_c.get("HealthCheck", {}).get("Command", []))
    c.check(
        bool(port) and f"/dev/tcp/127.0.0.1/{port}" in probe and "GET /health" in probe,
        f"worker: its health check asks /health on WORKER_METRICS_ADDR's port ({port or 'unset'})",
    )

    # The task shape the benchmarks pin.
    c.check(
        (str(resolve(svc, api["Cpu"])), str(resolve(svc, api["Memory"]))) == ("256", "512"),
        f"API task is 256 CPU / 512 MiB by default (got {resolve(svc, api['Cpu'])}/{resolve(svc, api['Memory'])})",
    )
    tier_env = {
        k: api_env.get(k) for k in ("DB_POOL_SIZE", "TOKIO_WORKER_THREADS", "MAX_CONNECTIONS", "MAX_ACCEPT_RATE")
    }
    c.check(
        all(tier_env.values()),
        f"the tier sets the pool, runtime threads, connection cap and accept rate ({tier_env})",
    )
    # The connection profiles: the accept rate over a short backlog (the default), or the accept
    # rate with a burst, the unanswered cap and a backlog as deep as the connection cap, which the
    # kernel's somaxconn (the task's system control) must not cut short.
    c.check(
        param(svc, "ConnectionProfile").get("Default") == "requests", "the connection profile is requests by default"
    )
    for size in param(svc, "TaskSize").get("AllowedValues", []):
        for profile in param(svc, "ConnectionProfile").get("AllowedValues", []):
            given = {"TaskSize": size, "ConnectionProfile": profile}
            env = env_of(svc, api_c, given)
            rate = float(env["MAX_ACCEPT_RATE"])
            cap = float(env.get("MAX_UNANSWERED_CONNECTIONS", api_default("MAX_UNANSWERED_CONNECTIONS")))
            burst = float(env.get("MAX_ACCEPT_BURST", api_default("MAX_ACCEPT_BURST")))
            backlog = float(env.get("LISTEN_BACKLOG", api_default("LISTEN_BACKLOG")))
            conns = float(env["MAX_CONNECTIONS"])
            controls = resolve(svc, api_c.get("SystemControls"), given) or []
            sysctl = {x["Namespace"]: float(resolve(svc, x["Value"], given)) for x in controls}
            somaxconn = sysctl.get("net.core.somaxconn", 4096)  # the kernel's default
            if profile == "requests":
                ok = rate > 0 and burst == 0 and cap == 0 and backlog <= somaxconn and backlog < conns
            else:
                ok = rate > 0 and burst == conns and 0 < cap < conns and backlog == conns and backlog <= somaxconn
            c.check(
                ok,
                f"{size}, {profile}: accept rate {rate:g} (burst {f'{burst:g}' if burst else 'the API default'}),"
                f" unanswered cap {cap:g}, backlog {backlog:g}"
                f" (somaxconn {somaxconn:g}, connections {conns:g})",
            )
    c.check(
        api_env.get("ADMISSION") == "adaptive" and float(api_env.get("ADMISSION_LATENCY_TARGET_MS", 0)) == 200,
        "admission is adaptive with a 200 ms latency target by default",
    )
    # Autoscaling.
    target = only(svc, "AWS::ApplicationAutoScaling::ScalableTarget")
    policy = only(svc, "AWS::ApplicationAutoScaling::ScalingPolicy")["TargetTrackingScalingPolicyConfiguration"]
    lo, hi = num(svc, target["MinCapacity"]), num(svc, target["MaxCapacity"])
    c.check((lo, hi) == (2, 6), f"the API scales between 2 and 6 tasks (got {lo:g}..{hi:g})")
    c.check(
        policy["PredefinedMetricSpecification"]["PredefinedMetricType"] == "ECSServiceAverageCPUUtilization"
        and num(svc, policy["TargetValue"]) == 60,
        "target tracking holds average CPU at 60%",
    )
    c.check(num(svc, policy["ScaleOutCooldown"]) == 60, "scale-out cooldown is 60 s")
    in_lo, in_hi = bounds(svc, policy["ScaleInCooldown"])
    c.check(120 <= in_lo and in_hi <= 300, f"scale-in cooldown stays within 120-300 s ({in_lo:g}-{in_hi:g})")
    c.check(
        float(api_env["THROTTLE_API_TASKS"]) == hi,
        "THROTTLE_API_TASKS is the most tasks that can run (the in-process fallback never exceeds the ceiling)",
    )

    # The health check path is a route the API serves.
    path = tg["HealthCheckPath"]
    routes = re.findall(r'\.route\(\s*"([^"]+)"', HEALTH_ROUTES.read_text())
    c.check(path == "/ready" and path in routes, f"target group checks {path}, served by the API ({routes})")

    # The internal paths (/ready, /metrics, /v1/ops/status) are on the ops listener (OPS_ADDR),
    # which the target group only health-checks: traffic goes to the public port, which serves
    # none of them, and no listener or security group opens the ops port to the internet.
    port_of = lambda addr: float(addr.rsplit(":", 1)[1])  # noqa: E731
    public_port, ops_port = port_of(api_env["BIND_ADDR"]), port_of(api_env["OPS_ADDR"])
    mapped = sorted(float(m["ContainerPort"]) for m in api_c["PortMappings"])
    c.check(public_port != ops_port, f"the API's ops listener ({ops_port:g}) is not its public port ({public_port:g})")
    c.check(mapped == sorted([public_port, ops_port]), f"the API container maps its public and ops ports ({mapped})")
    c.check(num(edge, tg["Port"]) == public_port, f"the target group sends traffic to the public port {public_port:g}")
    c.check(
        num(edge, tg.get("HealthCheckPort", tg["Port"])) == ops_port,
        f"the target group health-checks /ready on the ops port {ops_port:g}",
    )
    lb_targets = [lb["ContainerPort"] for s_ in of_type(svc, "AWS::ECS::Service").values()
                  for lb in s_["Properties"].get("LoadBalancers", [])]
    c.check(
        all(num(svc, p_) == public_port for p_ in lb_targets) and lb_targets,
        f"the service registers only the public port with the target group ({lb_targets})",
    )
    alb_sg = net["Resources"]["AlbSecurityGroup"]["Properties"]
    internet = [(r["FromPort"], r["ToPort"]) for r in alb_sg["SecurityGroupIngress"] if r.get("CidrIp") == "0.0.0.0/0"]
    c.check(sorted(internet) == [(80, 80), (443, 443)], f"the ALB takes only 80 and 443 from the internet ({internet})")
    api_ingress = [r["Properties"] for r in of_type(net, "AWS::EC2::SecurityGroupIngress").values()
                   if r["Properties"].get("GroupId") == {"Ref": "ApiSecurityGroup"}]
    c.check(
        all(r.get("SourceSecurityGroupId") == {"Ref": "AlbSecurityGroup"} and "CidrIp" not in r for r in api_ingress),
        "the API tasks take connections from the ALB's security group only",
    )
    c.check(
        num(net, {"Ref": "OpsPort"}) == ops_port and num(edge, {"Ref": "OpsPort"}) == ops_port,
        "the network and edge stacks' OpsPort is the API's OPS_ADDR port",
    )
    c.check(tg["TargetType"] == "ip" and num(edge, tg["HealthCheckIntervalSeconds"]) == 10, "ip targets checked every 10 s")

    # TLS at the edge.
    listeners = [r["Properties"] for r in of_type(edge, "AWS::ElasticLoadBalancingV2::Listener").values()]
    https = [l for l in listeners if l["Protocol"] == "HTTPS"]
    http = [l for l in listeners if l["Protocol"] == "HTTP"]
    c.check(
        len(https) == 1 and str(https[0].get("SslPolicy", "")).startswith("ELBSecurityPolicy-TLS13-"),
        "HTTPS listener with a TLS 1.3 policy",
    )
    c.check(
        len(http) == 1 and http[0]["DefaultActions"][0]["RedirectConfig"]["Protocol"] == "HTTPS",
        "HTTP listener only redirects to HTTPS",
    )
    acl = only(edge, "AWS::WAFv2::WebACL")
    c.check(any("RateBasedStatement" in r["Statement"] for r in acl["Rules"]), "the web ACL has a rate-based rule")
    c.check(
        only(edge, "AWS::WAFv2::WebACLAssociation")["ResourceArn"] == {"Ref": "LoadBalancer"},
        "the web ACL is attached to the ALB",
    )

    # Services: private, no public IP, circuit breaker with rollback.
    for name, s in of_type(svc, "AWS::ECS::Service").items():
        p = s["Properties"]
        net_cfg = p["NetworkConfiguration"]["AwsvpcConfiguration"]
        c.check(net_cfg["AssignPublicIp"] == "DISABLED", f"{name}: no public IP")
        c.check("PrivateSubnets" in json.dumps(net_cfg["Subnets"]), f"{name}: private subnets")
        breaker = p["DeploymentConfiguration"]["DeploymentCircuitBreaker"]
        c.check(breaker == {"Enable": True, "Rollback": True}, f"{name}: deployment circuit breaker with rollback")
        if p.get("LoadBalancers"):
            c.check(num(svc, p.get("HealthCheckGracePeriodSeconds", 0)) > 0, f"{name}: health-check grace period")

    # Secrets as secrets; separate roles.
    for name, td in of_type(svc, "AWS::ECS::TaskDefinition").items():
        p = td["Properties"]
        c.check(p["ExecutionRoleArn"] != p["TaskRoleArn"], f"{name}: separate execution and task roles")
        for cd in p["ContainerDefinitions"]:
            plain = [e["Name"] for e in environment_entries(cd) if SECRET_NAMES.search(e["Name"])]
            c.check(not plain, f"{name}/{cd['Name']}: no secret in plain environment {plain or ''}")
            c.check(cd.get("ReadonlyRootFilesystem") is True, f"{name}/{cd['Name']}: read-only root filesystem")
    secrets = {s["Name"] for s in api_c.get("Secrets", [])}
    c.check({"JWT_SECRET", "PGPASSWORD", "REDIS_URL"} <= secrets, f"the API gets its secrets from Secrets Manager {sorted(secrets)}")

    # Data at rest and in transit.
    db = only(data, "AWS::RDS::DBInstance")
    c.check(
        db["StorageEncrypted"] is True and db["PubliclyAccessible"] is False and db["DeletionProtection"] is True,
        "RDS encrypted, private, with deletion protection",
    )
    redis = only(data, "AWS::ElastiCache::ReplicationGroup")
    c.check(
        redis["TransitEncryptionEnabled"] is True and redis["AtRestEncryptionEnabled"] is True and "AuthToken" in redis,
        "ElastiCache encrypted in transit and at rest, with an AUTH token",
    )
    for tname, t in ts.items():
        for name, lg in of_type(t, "AWS::Logs::LogGroup").items():
            c.check("RetentionInDays" in lg["Properties"], f"{tname}/{name}: log retention set")

    # Cross-stack references resolve, in deploy order.
    exported: dict[str, str] = {}
    for tname in ORDER:
        t = ts[tname]
        wanted = [n for n in imports(t.get("Resources", {}), []) if n]
        missing = sorted({n for n in wanted if n not in exported})
        c.check(not missing, f"{tname}: every import is exported by an earlier stack {missing or ''}")
        for out in t.get("Outputs", {}).values():
            n = export_name(out.get("Export", {}).get("Name"))
            if n:
                exported[n] = tname
    alarms_checks(ts, c)
    ingress_ok = any(
        "SourceSecurityGroupId" in r["Properties"] and r["Properties"]["GroupId"] == {"Ref": "ApiSecurityGroup"}
        for r in of_type(net, "AWS::EC2::SecurityGroupIngress").values()
    )
    c.check(ingress_ok, "API tasks accept traffic from the ALB's security group only")


def alarms_checks(ts: dict[str, dict], c: Checks) -> None:
    """The API and the worker publish the metrics the alarms watch; every alarm reaches someone."""
    svc, alarms, security = ts["service"], ts["alarms"], ts["security"]
    c.check(
        param(svc, "MetricsNamespace").get("AllowedPattern") == param(alarms, "MetricsNamespace").get("AllowedPattern"),
        "the two stacks' MetricsNamespace parameters allow the same values",
    )
    for who in ("api", "worker"):
        cd = container(svc, who)["ContainerDefinitions"][0]
        raw = {e["Name"]: e["Value"] for e in environment_entries(cd)}
        interval = raw.get("METRICS_EMF_INTERVAL_SECS")
        lo, hi = bounds(svc, interval) if interval is not None else (0.0, 0.0)
        c.check(
            interval is not None and lo > 0 and hi <= 60,
            f"{who}: writes its CloudWatch lines, at least once a minute ({lo:g}-{hi:g} s)",
        )
        log = cd.get("LogConfiguration", {})
        c.check(
            log.get("LogDriver") == "awslogs" and log.get("Options", {}).get("mode") == "non-blocking",
            f"{who}: its lines go to CloudWatch Logs (awslogs), never stalling the process (non-blocking)",
        )
        c.check(
            resolve(svc, raw.get("METRICS_EMF_NAMESPACE")) == param(alarms, "MetricsNamespace").get("Default")
            and raw.get("METRICS_EMF_ENVIRONMENT") == {"Ref": "EnvironmentName"},
            f"{who}: its metrics namespace and environment are the ones the alarms watch",
        )
    topics = set(of_type(alarms, "AWS::SNS::Topic"))
    key = {"Fn::ImportValue": {"Fn::Sub": "${EnvironmentName}-KeyArn"}}
    c.check(
        topics and all(alarms["Resources"][t]["Properties"].get("KmsMasterKeyId") == key for t in topics),
        "the alarm topics are encrypted with the environment's key",
    )
    statements = only(security, "AWS::KMS::Key")["KeyPolicy"]["Statement"]
    c.check(
        any("cloudwatch." in json.dumps(st.get("Principal", {})) and "kms:GenerateDataKey*" in st["Action"]
            for st in statements),
        "the key lets CloudWatch publish alarms to those topics",
    )
    found = of_type(alarms, "AWS::CloudWatch::Alarm")
    c.check(len(found) >= 8, f"{len(found)} alarms")
    for name, a in found.items():
        p = a["Properties"]
        actions = p.get("AlarmActions", [])
        c.check(
            bool(actions) and all(isinstance(x, dict) and x.get("Ref") in topics for x in actions),
            f"{name}: notifies a topic of the stack",
        )
        metrics = [q["MetricStat"]["Metric"] for q in p.get("Metrics", []) if "MetricStat" in q]
        if "MetricName" in p:
            metrics.append(p)
        c.check(bool(metrics), f"{name}: watches a metric")
        for m in metrics:
            if m["Namespace"] == {"Ref": "MetricsNamespace"}:
                dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
                c.check(
                    dims.get("Service") in ("api", "worker")
                    and dims == {"Environment": {"Ref": "EnvironmentName"}, "Service": dims["Service"]},
                    f"{name}/{m['MetricName']}: the {dims.get('Service')} tasks' line of this environment",
                )
            else:
                c.check(m["Namespace"] == "AWS/ApplicationELB", f"{name}: the app's or the load balancer's metric")


SKIP = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+)(?::\s*(.*))?$")


def checkov_skips(c: Checks, checkov_json: Path | None) -> None:
    files = sorted(ROOT.glob("*.yaml")) + [Path("Dockerfile")]
    declared = []
    for f in files:
        for line in f.read_text().splitlines():
            m = SKIP.search(line.strip())
            if m:
                declared.append((f, m.group(1), (m.group(2) or "").strip()))
    for f, check_id, reason in declared:
        c.check(len(reason) >= 15, f"checkov skip {check_id} in {f} carries its reason inline")
    if checkov_json is None:
        return
    reports = json.loads(checkov_json.read_text())
    reports = reports if isinstance(reports, list) else [reports]
    for r in reports:
        s = r.get("summary", {})
        print(f"  checkov {r.get('check_type')}: {s.get('passed')} passed, {s.get('failed')} failed,"
              f" {s.get('skipped')} skipped, {s.get('parsing_errors')} parsing errors")
        for f in r.get("results", {}).get("failed_checks", []):
            c.check(False, f"checkov {f['check_id']} {f['check_name']}: {f['file_path']} {f['resource']}")
        c.check(s.get("parsing_errors", 1) == 0, f"checkov parsed every {r.get('check_type')} file")
    applied = {s["check_id"] for r in reports for s in r.get("results", {}).get("skipped_checks", [])}
    for f, check_id, _ in declared:
        c.check(check_id in applied, f"checkov skip {check_id} in {f} suppresses a check that ran")


def self_test(ts: dict[str, dict]) -> None:
    """Each mutation breaks one invariant; the checks must notice."""

    def lb(t):
        return next(iter(of_type(t["edge"], "AWS::ElasticLoadBalancingV2::LoadBalancer").values()))["Properties"]

    def set_attr(props, key, attr, value):
        for a in props[key]:
            if a["Key"] == attr:
                a["Value"] = value

    def api_c(t):
        return container(t["service"], "api")["ContainerDefinitions"][0]

    def api_env(t, name, value):
        for e in environment_entries(api_c(t)):
            if e["Name"] == name:
                e["Value"] = value

    def first_service(t):
        return next(iter(of_type(t["service"], "AWS::ECS::Service").values()))["Properties"]

    mutations = {
        "ALB idle above keep-alive": lambda t: set_attr(lb(t), "LoadBalancerAttributes", "idle_timeout.timeout_seconds", "80"),
        "handler timeout above ALB idle": lambda t: api_env(t, "REQUEST_TIMEOUT_SECS", "90"),
        "stop timeout above 120": lambda t: api_c(t).update(StopTimeout=150),
        "stop timeout below deregistration": lambda t: api_c(t).update(StopTimeout=20),
        "bigger task": lambda t: container(t["service"], "api").update(Cpu="512"),
        "health path not served": lambda t: only(t["edge"], "AWS::ElasticLoadBalancingV2::TargetGroup").update(
            HealthCheckPath="/healthz"),
        "health check on the public port": lambda t: only(t["edge"], "AWS::ElasticLoadBalancingV2::TargetGroup").pop(
            "HealthCheckPort"),
        "ops listener on the public port": lambda t: api_env(t, "OPS_ADDR", "0.0.0.0:8080"),
        "ops port open to the internet": lambda t: t["network"]["Resources"]["AlbSecurityGroup"]["Properties"][
            "SecurityGroupIngress"].append({"IpProtocol": "tcp", "FromPort": 9090, "ToPort": 9090, "CidrIp": "0.0.0.0/0"}),
        "service registers the ops port": lambda t: first_service(t)["LoadBalancers"][0].update(ContainerPort=9090),
        "secret in plain env": lambda t: api_c(t)["Environment"].append({"Name": "JWT_SECRET", "Value": "x"}),
        "secret in a profile's env": lambda t: api_c(t)["Environment"].append(
            {"Fn::If": ["StreamsProfile", {"Name": "JWT_SECRET", "Value": "x"}, {"Ref": "AWS::NoValue"}]}),
        "worker in development": lambda t: container(t["service"], "worker")["ContainerDefinitions"][0].update(
            Environment=[e for e in container(t["service"], "worker")["ContainerDefinitions"][0]["Environment"]
                         if e["Name"] != "APP_ENV"]),
        "worker without a health check": lambda t: container(t["service"], "worker")["ContainerDefinitions"][0]
            .pop("HealthCheck"),
        "public IP": lambda t: first_service(t)["NetworkConfiguration"]["AwsvpcConfiguration"].update(
            AssignPublicIp="ENABLED"),
        "no rollback": lambda t: first_service(t)["DeploymentConfiguration"]["DeploymentCircuitBreaker"].update(
            Rollback=False),
        "CloudWatch lines may be off": lambda t: param(t["service"], "MetricsIntervalSeconds").update(MinValue=0),
        "alarm without action": lambda t: next(iter(of_type(t["alarms"], "AWS::CloudWatch::Alarm").values()))[
            "Properties"].pop("AlarmActions"),
        "worker logs blocking": lambda t: container(t["service"], "worker")["ContainerDefinitions"][0][
            "LogConfiguration"]["Options"].pop("mode"),
        "worker without CloudWatch lines": lambda t: container(t["service"], "worker")["ContainerDefinitions"][0].update(
            Environment=[e for e in container(t["service"], "worker")["ContainerDefinitions"][0]["Environment"]
                         if e["Name"] != "METRICS_EMF_INTERVAL_SECS"]),
        "streams backlog past somaxconn": lambda t: api_c(t).pop("SystemControls"),
        "streams profile without its burst": lambda t: api_env(t, "MAX_ACCEPT_BURST", "0"),
        "a profile without an accept rate": lambda t: api_env(t, "MAX_ACCEPT_RATE", "0"),
        "alarm on another environment": lambda t: of_type(t["alarms"], "AWS::CloudWatch::Alarm")["ThrottleDegradedAlarm"][
            "Properties"]["Dimensions"][0].update(Value="other"),
    }
    for what, mutate in mutations.items():
        bad = copy.deepcopy(ts)
        mutate(bad)
        assert failures(run, bad) > 0, f"self-test: '{what}' went unnoticed"


def main() -> int:
    checkov_json = None
    if len(sys.argv) == 3 and sys.argv[1] == "--checkov-json":
        checkov_json = Path(sys.argv[2])
    ts = load_templates()
    self_test(ts)
    c = Checks()
    print("invariants: infra/cloudformation")
    run(ts, c)
    checkov_skips(c, checkov_json)
    print(f"invariants: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
