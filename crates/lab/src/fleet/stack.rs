//! The fleet's settings, read from the CloudFormation templates that deploy it, so that the
//! balancer and the autoscaler on this machine are configured from the same figures as the
//! ALB and the ECS service (one owner: the templates). A property is a literal or a `!Ref` to a
//! parameter, which resolves to the parameter's default.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_norway::Value;

/// The target group's health check (edge.yaml, `TargetGroup`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HealthCheck {
    pub(crate) path: String,
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    /// Consecutive successes that make a target healthy.
    pub(crate) healthy: u32,
    /// Consecutive failures that make it unhealthy.
    pub(crate) unhealthy: u32,
    /// The check goes to the ops listener (`HealthCheckPort: OpsPort`), not the API's port.
    pub(crate) on_ops_port: bool,
}

/// The balancer (edge.yaml).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Balancer {
    /// `idle_timeout.timeout_seconds`.
    pub(crate) idle_timeout: Duration,
    /// `deregistration_delay.timeout_seconds`.
    pub(crate) deregistration_delay: Duration,
    /// `load_balancing.algorithm.type` is `least_outstanding_requests`.
    pub(crate) least_outstanding: bool,
    pub(crate) health: HealthCheck,
}

/// The API service's scaling (service.yaml).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Scaling {
    pub(crate) min_tasks: u32,
    pub(crate) max_tasks: u32,
    /// `TargetValue` of the CPU target tracking policy, percent of the task's CPU.
    pub(crate) cpu_target_percent: u32,
    pub(crate) scale_out_cooldown: Duration,
    pub(crate) scale_in_cooldown: Duration,
    /// The service's `HealthCheckGracePeriodSeconds`.
    pub(crate) health_check_grace: Duration,
}

/// Everything the fleet takes from the stack.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Stack {
    pub(crate) balancer: Balancer,
    pub(crate) scaling: Scaling,
}

impl Stack {
    /// From the repository's templates.
    pub(crate) fn load(repo: &std::path::Path) -> Result<Self> {
        let dir = repo.join("infra/cloudformation");
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).with_context(|| format!("reading infra/cloudformation/{name}"))
        };
        Self::parse(&read("edge.yaml")?, &read("service.yaml")?)
    }

    pub(crate) fn parse(edge: &str, service: &str) -> Result<Self> {
        let edge = Template::parse(edge, "edge.yaml")?;
        let service = Template::parse(service, "service.yaml")?;

        let tg = edge.properties("TargetGroup")?;
        let attribute = |key: &str| -> Result<Value> {
            let attrs =
                tg.get("TargetGroupAttributes").and_then(Value::as_sequence).context("TargetGroupAttributes")?;
            let found = attrs
                .iter()
                .find(|a| a.get("Key").and_then(Value::as_str) == Some(key))
                .with_context(|| format!("target group attribute {key}"))?;
            edge.resolve(found.get("Value").context("Value")?)
        };
        let alb = edge.properties("LoadBalancer")?;
        let idle = alb
            .get("LoadBalancerAttributes")
            .and_then(Value::as_sequence)
            .and_then(|attrs| {
                attrs.iter().find(|a| a.get("Key").and_then(Value::as_str) == Some("idle_timeout.timeout_seconds"))
            })
            .and_then(|a| a.get("Value"))
            .context("the load balancer's idle_timeout.timeout_seconds")?;
        let balancer = Balancer {
            idle_timeout: secs(&edge.resolve(idle)?)?,
            deregistration_delay: secs(&attribute("deregistration_delay.timeout_seconds")?)?,
            least_outstanding: text(&attribute("load_balancing.algorithm.type")?)? == "least_outstanding_requests",
            health: HealthCheck {
                path: text(&edge.resolve(field(tg, "HealthCheckPath")?)?)?,
                interval: secs(&edge.resolve(field(tg, "HealthCheckIntervalSeconds")?)?)?,
                timeout: secs(&edge.resolve(field(tg, "HealthCheckTimeoutSeconds")?)?)?,
                healthy: count(&edge.resolve(field(tg, "HealthyThresholdCount")?)?)?,
                unhealthy: count(&edge.resolve(field(tg, "UnhealthyThresholdCount")?)?)?,
                on_ops_port: matches!(tg.get("HealthCheckPort"), Some(Value::Tagged(t)) if t.value.as_str() == Some("OpsPort")),
            },
        };

        let target = service.properties("ApiScalableTarget")?;
        let policy = service.properties("ApiCpuScaling")?;
        let tracking = field(policy, "TargetTrackingScalingPolicyConfiguration")?;
        let api = service.properties("ApiService")?;
        let scaling = Scaling {
            min_tasks: count(&service.resolve(field(target, "MinCapacity")?)?)?,
            max_tasks: count(&service.resolve(field(target, "MaxCapacity")?)?)?,
            cpu_target_percent: count(&service.resolve(field(tracking, "TargetValue")?)?)?,
            scale_out_cooldown: secs(&service.resolve(field(tracking, "ScaleOutCooldown")?)?)?,
            scale_in_cooldown: secs(&service.resolve(field(tracking, "ScaleInCooldown")?)?)?,
            health_check_grace: secs(&service.resolve(field(api, "HealthCheckGracePeriodSeconds")?)?)?,
        };
        if scaling.min_tasks > scaling.max_tasks {
            bail!("service.yaml: ApiMinTasks {} is above ApiMaxTasks {}", scaling.min_tasks, scaling.max_tasks);
        }
        Ok(Self { balancer, scaling })
    }
}

struct Template {
    name: &'static str,
    doc: Value,
}

impl Template {
    fn parse(text: &str, name: &'static str) -> Result<Self> {
        Ok(Self { name, doc: serde_norway::from_str(text).with_context(|| format!("parsing {name}"))? })
    }

    fn properties(&self, resource: &str) -> Result<&Value> {
        self.doc
            .get("Resources")
            .and_then(|r| r.get(resource))
            .and_then(|r| r.get("Properties"))
            .with_context(|| format!("{}: no resource {resource} with properties", self.name))
    }

    /// A literal, or a `!Ref` to a parameter: its default.
    fn resolve(&self, v: &Value) -> Result<Value> {
        let Value::Tagged(tagged) = v else { return Ok(v.clone()) };
        if tagged.tag != "Ref" {
            bail!("{}: cannot resolve !{} here", self.name, tagged.tag);
        }
        let name = tagged.value.as_str().context("!Ref to a name")?;
        self.doc
            .get("Parameters")
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("Default"))
            .cloned()
            .with_context(|| format!("{}: parameter {name} has no default", self.name))
    }
}

fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value> {
    v.get(key).with_context(|| format!("no {key}"))
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => bail!("expected text, found {other:?}"),
    }
}

fn count(v: &Value) -> Result<u32> {
    let n = match v {
        Value::Number(n) => n.as_u64().context("a whole number")?,
        Value::String(s) => s.trim().parse().with_context(|| format!("a whole number, found {s:?}"))?,
        other => bail!("expected a number, found {other:?}"),
    };
    u32::try_from(n).context("a number that fits")
}

fn secs(v: &Value) -> Result<Duration> {
    Ok(Duration::from_secs(u64::from(count(v)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> std::path::PathBuf {
        crate::rig::services::root()
    }

    #[test]
    fn the_fleet_takes_the_stacks_own_figures() {
        let s = Stack::load(&repo()).expect("the templates parse");
        let b = &s.balancer;
        assert_eq!(b.idle_timeout, Duration::from_secs(60));
        assert_eq!(b.deregistration_delay, Duration::from_secs(30));
        assert!(b.least_outstanding);
        assert_eq!(b.health.path, "/ready");
        assert_eq!((b.health.interval, b.health.timeout), (Duration::from_secs(10), Duration::from_secs(5)));
        assert_eq!((b.health.healthy, b.health.unhealthy), (2, 3));
        assert!(b.health.on_ops_port);
        let sc = &s.scaling;
        assert_eq!((sc.min_tasks, sc.max_tasks, sc.cpu_target_percent), (2, 6, 60));
        assert_eq!((sc.scale_out_cooldown, sc.scale_in_cooldown), (Duration::from_secs(60), Duration::from_secs(180)));
        assert_eq!(sc.health_check_grace, Duration::from_secs(60));
    }

    #[test]
    fn a_changed_default_reaches_the_fleet_and_an_unresolvable_one_is_an_error() {
        let root = repo().join("infra/cloudformation");
        let edge = std::fs::read_to_string(root.join("edge.yaml")).expect("edge.yaml");
        let service = std::fs::read_to_string(root.join("service.yaml")).expect("service.yaml");
        let changed = service.replacen("Default: 60\n    MinValue: 20", "Default: 70\n    MinValue: 20", 1);
        assert_ne!(changed, service, "the CPU target's default is where this test expects it");
        let s = Stack::parse(&edge, &changed).expect("parses");
        assert_eq!(s.scaling.cpu_target_percent, 70);
        let broken = edge.replace("Value: !Ref DeregistrationDelaySeconds", "Value: !Ref NoSuchParameter");
        let err = Stack::parse(&broken, &service).expect_err("an unknown parameter");
        assert!(format!("{err:#}").contains("NoSuchParameter"), "{err:#}");
    }
}
