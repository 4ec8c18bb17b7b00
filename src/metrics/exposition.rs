//! The exposition: OpenMetrics (what Prometheus asks for), and the Prometheus text format
//! (curl, `promtool check metrics`) made from it.

use prometheus_client::registry::Registry;

/// The text exposition of `registry` (OpenMetrics).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// The exposition of `registry` in the Prometheus text format (0.0.4), for scrapers that do not
/// ask for OpenMetrics: the same samples, with a counter's HELP and TYPE under its `_total`
/// sample name (OpenMetrics names the family without it), no `# UNIT` and no `# EOF`.
pub(crate) fn encode_text_format(registry: &Registry) -> String {
    let open_metrics = encode(registry);
    let mut out = String::with_capacity(open_metrics.len());
    let mut lines = open_metrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if lines.peek() == Some(&format!("# TYPE {name} counter").as_str()) {
                out.push_str(&format!("# HELP {name}_total{}\n", &rest[name.len()..]));
                continue;
            }
        } else if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::mutate::Untouched;

    #[test]
    fn the_text_format_declares_every_sample_under_its_own_name() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.denied(Untouched::NoCommonArchitecture);
        let text = encode_text_format(&registry);
        for expected in [
            "# HELP tolerable_admission_denials_total Pods denied, by reason",
            "# TYPE tolerable_admission_denials_total counter\n",
            "tolerable_admission_denials_total{reason=\"no_common_architecture\"} 1\n",
            "tolerable_admission_denials_total{reason=\"lookup_failed\"} 0\n",
            "# TYPE tolerable_admission_duration_seconds histogram\n",
            "tolerable_build_info{version=\"",
        ] {
            assert!(text.contains(expected), "{expected}:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let family = name.strip_suffix(suffix)?;
                    text.contains(&format!("# TYPE {family} histogram\n"))
                        .then_some(family)
                })
                .unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{sample} has no TYPE line:\n{text}"
            );
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{sample} has no HELP line"
            );
        }
    }
}
