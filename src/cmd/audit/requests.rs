//! CPU and memory requests, summed: what the movable workloads could take to the arm64 pools.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Requests {
    pub(super) cpu_millis: u64,
    pub(super) memory_bytes: u64,
}

impl Requests {
    /// What one Pod of `pod` requests: its containers' requests (init containers run before
    /// them, one at a time, and are left out).
    pub(super) fn of_template(pod: &Value) -> Self {
        let containers = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        containers.iter().fold(Self::default(), |sum, c| {
            let request = |name: &str| {
                c.pointer(&format!("/resources/requests/{name}"))
                    .and_then(quantity_text)
            };
            Self {
                cpu_millis: sum.cpu_millis + request("cpu").and_then(millicores).unwrap_or(0),
                memory_bytes: sum.memory_bytes + request("memory").and_then(bytes).unwrap_or(0),
            }
        })
    }

    pub(super) fn times(self, n: u32) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_mul(u64::from(n)),
            memory_bytes: self.memory_bytes.saturating_mul(u64::from(n)),
        }
    }

    pub(super) fn plus(self, other: &Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }
}

impl fmt::Display for Requests {
    /// `cpu 1250m, memory 640Mi`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = self.memory_bytes / (1 << 20);
        write!(f, "cpu {}m, memory {mib}Mi", self.cpu_millis)
    }
}

/// A quantity is a string (`250m`) or, written by hand, a number (`2`).
fn quantity_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `250m` → 250, `2` → 2000, `0.5` → 500.
fn millicores(text: String) -> Option<u64> {
    if let Some(millis) = text.strip_suffix('m') {
        return millis.parse().ok();
    }
    let cores: f64 = text.parse().ok()?;
    (cores >= 0.0).then(|| (cores * 1000.0).round() as u64)
}

/// `128Mi`, `1Gi`, `500M`, `1e3`, `1048576`: Kubernetes' binary and decimal suffixes.
fn bytes(text: String) -> Option<u64> {
    const SUFFIXES: [(&str, u64); 10] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(number) = text.strip_suffix(suffix) {
            let n: f64 = number.parse().ok()?;
            return (n >= 0.0).then_some((n * factor as f64) as u64);
        }
    }
    let n: f64 = text.parse().ok()?;
    (n >= 0.0).then_some(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_as_kubernetes_writes_them() {
        let pod = json!({"spec": {"containers": [
            {"resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
            {"resources": {"requests": {"cpu": "1.5", "memory": "1G"}}},
            {"resources": {"requests": {"cpu": 2}}},
            {"name": "no requests"},
        ]}});
        let one = Requests::of_template(&pod);
        assert_eq!(
            one,
            Requests {
                cpu_millis: 3750,
                memory_bytes: 128 * (1 << 20) + 1_000_000_000
            }
        );
        assert_eq!(one.times(2).cpu_millis, 7500);
        assert_eq!(
            Requests::of_template(&json!({})).plus(&one).to_string(),
            "cpu 3750m, memory 1081Mi"
        );
        assert_eq!(millicores("nonsense".into()), None);
        assert_eq!(bytes("-1Mi".into()), None);
    }
}
