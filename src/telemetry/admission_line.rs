//! The one line logged per admission, written straight into the log batch.
//!
//! At the shipped `info` level every admission logs a line, so its cost is paid on every
//! request: through tracing's formatter (a visitor per field, a buffer per event, a copy into
//! the batch) it cost about 6 µs of CPU per admission at a realistic rate (BENCHMARKS.md, "The
//! admission log line"). Written here field by field into the batch buffer, in exactly the text
//! or JSON form tracing's formatter gives the same event (a test compares the two), and checked
//! by the same one-line rule as every other line. When tolerable's own subscriber is not the one
//! installed (a test's, a library user's), the line goes through tracing as any other event.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;

/// The target the line is logged under: the one `log_level` directives name
/// (`info,tolerable::server=warn` silences it).
pub(crate) const ADMISSION_TARGET: &str = "tolerable::server";

/// The format of tolerable's own subscriber, once `init` installed it as the global one.
pub(super) static DIRECT: OnceLock<LogFormat> = OnceLock::new();

/// What the line says about one answered admission.
pub(crate) struct AdmissionLine<'a> {
    pub(crate) uid: &'a str,
    pub(crate) outcome: &'static str,
    pub(crate) allowed: bool,
    pub(crate) patched: bool,
    pub(crate) warnings: usize,
    pub(crate) elapsed_us: u64,
    /// The decision's summary, the line's message.
    pub(crate) summary: &'a str,
}

impl AdmissionLine<'_> {
    /// Logs the line when `info` is enabled for [`ADMISSION_TARGET`].
    pub(crate) fn log(&self) {
        if !tracing::enabled!(target: ADMISSION_TARGET, tracing::Level::INFO) {
            return;
        }
        match DIRECT.get() {
            Some(&format) => {
                super::append_line(|out| self.write(format, SystemTime::now(), out));
            }
            None => self.through_tracing(),
        }
    }

    fn through_tracing(&self) {
        tracing::info!(
            target: ADMISSION_TARGET,
            uid = %self.uid,
            outcome = self.outcome,
            allowed = self.allowed,
            patched = self.patched,
            warnings = self.warnings,
            elapsed_us = self.elapsed_us,
            "{}",
            self.summary
        );
    }

    /// The line as tracing's formatter writes it, newline included (before the one-line check).
    fn write(&self, format: LogFormat, now: SystemTime, out: &mut Vec<u8>) {
        match format {
            LogFormat::Text => self.write_text(now, out),
            LogFormat::Json => self.write_json(now, out),
        }
    }

    fn write_text(&self, now: SystemTime, out: &mut Vec<u8>) {
        write_timestamp(now, out);
        // The level right-aligned in five columns, as tracing's full format does; a `&str` field
        // is written quoted (Debug), a `%` one as it is.
        let _ = writeln!(
            out,
            "  INFO {ADMISSION_TARGET}: {} uid={} outcome={:?} allowed={} patched={} warnings={} elapsed_us={}",
            self.summary,
            self.uid,
            self.outcome,
            self.allowed,
            self.patched,
            self.warnings,
            self.elapsed_us
        );
    }

    fn write_json(&self, now: SystemTime, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        write_timestamp(now, out);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":");
        json_string(self.summary, out);
        out.extend_from_slice(b",\"uid\":");
        json_string(self.uid, out);
        out.extend_from_slice(b",\"outcome\":");
        json_string(self.outcome, out);
        let _ = writeln!(
            out,
            ",\"allowed\":{},\"patched\":{},\"warnings\":{},\"elapsed_us\":{}}},\"target\":\"{ADMISSION_TARGET}\"}}",
            self.allowed, self.patched, self.warnings, self.elapsed_us
        );
    }
}

fn json_string(value: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// `now` as RFC 3339 in UTC with microseconds (`2026-11-24T18:55:01.123456Z`), as tracing's
/// default timer writes it. The date and time up to the second are formatted once per second
/// per thread.
fn write_timestamp(now: SystemTime, out: &mut Vec<u8>) {
    thread_local! {
        static SECOND: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
    }
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(second, prefix)| {
        if *second != seconds {
            *second = seconds;
            prefix.clear();
            write_date_time(seconds, prefix);
        }
        out.extend_from_slice(prefix);
    });
    let _ = write!(out, ".{:06}Z", since_epoch.subsec_micros());
}

/// `seconds` since the Unix epoch as `YYYY-MM-DDTHH:MM:SS`.
fn write_date_time(seconds: u64, out: &mut Vec<u8>) {
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
}

/// The proleptic Gregorian date `days` after 1970-01-01: the calendar counted in 400-year eras
/// of 146,097 days, each year starting on 1 March so that the leap day ends it.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let from_era_start = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = from_era_start / 146_097;
    let day_of_era = from_era_start % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn line(summary: &'static str, uid: &'static str) -> AdmissionLine<'static> {
        AdmissionLine {
            uid,
            outcome: "decided",
            allowed: true,
            patched: true,
            warnings: 2,
            elapsed_us: 1234,
            summary,
        }
    }

    /// What tracing's own formatter writes for the same line, in `format`.
    fn through_tracing(format: LogFormat, line: &AdmissionLine<'_>) -> String {
        let captured = super::super::tests::Captured::default();
        let config = crate::config::Config::load(None, Vec::new()).unwrap();
        let builder = super::super::subscriber(&config, captured.clone());
        let dispatch = match format {
            LogFormat::Text => tracing::Dispatch::new(builder.finish()),
            LogFormat::Json => tracing::Dispatch::new(builder.json().finish()),
        };
        tracing::dispatcher::with_default(&dispatch, || line.through_tracing());
        let written = captured.0.lock().unwrap().clone();
        String::from_utf8(written).unwrap()
    }

    fn written(format: LogFormat, line: &AdmissionLine<'_>) -> String {
        let mut out = Vec::new();
        line.write(format, SystemTime::now(), &mut out);
        String::from_utf8(out).unwrap()
    }

    /// A timestamp is 27 bytes (`2026-11-24T18:55:01.123456Z`); the rest must be the same bytes.
    fn without_timestamp(text_line: &str) -> &str {
        &text_line[27..]
    }

    #[test]
    fn the_text_line_is_the_one_tracing_writes() {
        for admission in [
            line("placed on arm64: all 2 images run there", "705ab4f5-6393"),
            line("quotes \" and \\ and = stay", "uid with spaces"),
        ] {
            let ours = written(LogFormat::Text, &admission);
            let theirs = through_tracing(LogFormat::Text, &admission);
            assert_eq!(without_timestamp(&ours), without_timestamp(&theirs));
            assert_eq!(ours.as_bytes()[26], b'Z', "{ours}");
            assert_eq!(ours[..4], theirs[..4], "the year: {ours} / {theirs}");
        }
    }

    #[test]
    fn the_json_line_is_the_one_tracing_writes() {
        for admission in [
            line("placed on arm64", "705ab4f5-6393"),
            line("a \"quoted\" \\ summary\nwith a newline\u{1}", "uid\t\"x\""),
        ] {
            let mut ours: serde_json::Value =
                serde_json::from_str(&written(LogFormat::Json, &admission)).unwrap();
            let mut theirs: serde_json::Value =
                serde_json::from_str(&through_tracing(LogFormat::Json, &admission)).unwrap();
            let (our_time, their_time) = (ours["timestamp"].take(), theirs["timestamp"].take());
            assert_eq!(ours, theirs);
            assert_eq!(our_time.as_str().unwrap().len(), 27, "{our_time}");
            assert_eq!(
                our_time.as_str().unwrap()[..4],
                their_time.as_str().unwrap()[..4]
            );
        }
    }

    #[test]
    fn timestamps_are_utc_rfc3339_with_microseconds() {
        // Dates checked against Python's datetime.utcfromtimestamp.
        for (seconds, micros, expected) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 5, "2000-02-29T00:00:00.000005Z"),
            (1_709_251_199, 999_999, "2024-02-29T23:59:59.999999Z"),
            (1_795_545_301, 123_456, "2026-11-24T18:35:01.123456Z"),
            (4_107_542_399, 0, "2100-02-28T23:59:59.000000Z"),
            (4_107_542_400, 0, "2100-03-01T00:00:00.000000Z"),
        ] {
            let now = UNIX_EPOCH + Duration::new(seconds, micros * 1000);
            let mut out = Vec::new();
            write_timestamp(now, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn a_hostile_summary_or_uid_stays_one_line() {
        let admission = line("evil\nERROR forged\u{2028}line", "uid\u{202e}\r");
        for format in [LogFormat::Text, LogFormat::Json] {
            let mut batch = Vec::new();
            super::super::append_clean(&mut batch, |out| {
                admission.write(format, SystemTime::now(), out)
            });
            let text = String::from_utf8(batch).unwrap();
            assert_eq!(text.matches('\n').count(), 1, "{text}");
            assert!(text.ends_with('\n'));
            for raw in ['\u{2028}', '\u{202e}', '\r'] {
                assert!(!text.contains(raw), "{raw:?} written raw: {text}");
            }
            if format == LogFormat::Json {
                // Still one JSON object, its values what they were.
                let event: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert_eq!(event["fields"]["message"], "evil\nERROR forged\u{2028}line");
                assert_eq!(event["fields"]["uid"], "uid\u{202e}\r", "{text}");
            }
        }
    }
}
