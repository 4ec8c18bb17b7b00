//! The one duration parser, for the two ways durations reach tolerable: the config's
//! (`500ms`, `4s`, `5m`, `24h`, or a bare number of seconds — one whole number, one unit) and
//! Go's `time.Duration` as Kubernetes writes it (the API server's `?timeout=`, a credential
//! provider's `defaultCacheDuration` and `cacheDuration`: `10m0s`, `1.5h`, `300ms`, `0`).
//!
//! A leaf: it imports nothing from the crate, so the config, the time budget and the registry's
//! credential plugins can all use it without importing each other.

use std::time::Duration;

/// Which spelling of durations a text is read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// tolerable's config: one whole number and one unit of `ms`, `s`, `m`, `h`, or none
    /// (seconds).
    Config,
    /// Go's `time.Duration` text: one or more decimal numbers each with a unit of `ns`, `us`
    /// (`µs`), `ms`, `s`, `m`, `h`; a bare `0`; never negative.
    Go,
}

/// The seconds in one of `unit` in `dialect`, or `None` when the dialect has no such unit.
fn unit_seconds(dialect: Dialect, unit: &str) -> Option<f64> {
    Some(match (dialect, unit) {
        (Dialect::Config, "") => 1.0,
        (Dialect::Go, "ns") => 1e-9,
        (Dialect::Go, "us" | "µs" | "μs") => 1e-6,
        (_, "ms") => 1e-3,
        (_, "s") => 1.0,
        (_, "m") => 60.0,
        (_, "h") => 3600.0,
        _ => return None,
    })
}

/// `text` read in `dialect`; the error says what the text is not, with examples of the
/// dialect.
pub(crate) fn parse(dialect: Dialect, text: &str) -> Result<Duration, String> {
    let bad = || match dialect {
        Dialect::Config => format!("{text:?} is not a duration (e.g. 500ms, 4s, 5m, 24h)"),
        Dialect::Go => format!("{text:?} is not a duration such as 10m0s, 12h or 500ms"),
    };
    let mut rest = text.trim();
    if dialect == Dialect::Go {
        if rest == "0" {
            return Ok(Duration::ZERO);
        }
        if rest.starts_with('-') {
            return Err(format!("{text:?} is negative"));
        }
        rest = rest.strip_prefix('+').unwrap_or(rest);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let seconds = unit_seconds(dialect, unit).ok_or_else(bad)?;
        let part = match dialect {
            // Whole numbers only, counted exactly (no float rounding of `24h`).
            Dialect::Config => {
                let n: u64 = number.parse().map_err(|_| bad())?;
                let millis = (seconds * 1000.0) as u64;
                Duration::from_millis(n.checked_mul(millis).ok_or_else(bad)?)
            }
            Dialect::Go => {
                let n: f64 = number.parse().map_err(|_| bad())?;
                Duration::try_from_secs_f64(n * seconds).map_err(|_| bad())?
            }
        };
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = after;
        // The config's durations are one number and one unit.
        if dialect == Dialect::Config && !rest.is_empty() {
            return Err(bad());
        }
    }
    Ok(total)
}

/// A config duration: `500ms`, `4s`, `5m`, `24h`, or a bare number of seconds.
pub(crate) fn parse_config(text: &str) -> Result<Duration, String> {
    parse(Dialect::Config, text)
}

/// A Go `time.Duration` as Kubernetes writes one (`12h`, `10m0s`, `1.5h`, `300ms`, `0`); not
/// negative.
pub(crate) fn parse_go(text: &str) -> Result<Duration, String> {
    parse(Dialect::Go, text)
}

/// `duration` as the config writes it, in the largest unit that keeps it exact (`5m`, `24h`,
/// `1500ms`): how the defaults are spelled in the shipped file and the reference.
pub(crate) fn format_config(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !millis.is_multiple_of(1000) {
        return format!("{millis}ms");
    }
    let seconds = millis / 1000;
    if seconds != 0 && seconds.is_multiple_of(3600) {
        format!("{}h", seconds / 3600)
    } else if seconds != 0 && seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_durations() {
        for (text, want) in [
            ("250ms", Duration::from_millis(250)),
            ("4s", Duration::from_secs(4)),
            ("4", Duration::from_secs(4)),
            (" 4s ", Duration::from_secs(4)),
            ("0s", Duration::ZERO),
            ("5m", Duration::from_secs(300)),
            ("24h", Duration::from_secs(86400)),
        ] {
            assert_eq!(parse_config(text).unwrap(), want, "{text}");
        }
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "1d",
            "99999999999999999999h",
            "1h30m",
            "10us",
            "5 s",
        ] {
            let err = parse_config(bad).unwrap_err();
            assert!(err.contains("e.g. 500ms, 4s, 5m, 24h"), "{bad}: {err}");
        }
    }

    #[test]
    fn go_durations() {
        for (text, seconds) in [
            ("10m0s", 600.0),
            ("12h", 43200.0),
            ("1h30m", 5400.0),
            ("1.5h", 5400.0),
            ("500ms", 0.5),
            ("0", 0.0),
            ("0s", 0.0),
            ("90s", 90.0),
            ("2us", 0.000002),
            ("+3s", 3.0),
        ] {
            assert_eq!(parse_go(text).unwrap().as_secs_f64(), seconds, "{text}");
        }
        for bad in ["", "10", "1d", "-5m", "m", "1h m", "1..5s"] {
            assert!(parse_go(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_go("-5m").unwrap_err(), "\"-5m\" is negative");
    }

    #[test]
    fn config_durations_are_written_back_as_read() {
        for text in ["0s", "250ms", "1500ms", "4s", "90s", "5m", "24h", "1h"] {
            let duration = parse_config(text).unwrap();
            assert_eq!(format_config(duration), text);
        }
        assert_eq!(format_config(Duration::from_secs(120)), "2m");
    }
}
