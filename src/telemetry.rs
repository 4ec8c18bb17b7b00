//! Logging set-up, in one place. Logs go to stderr so command output on stdout stays clean.
//!
//! Every event is one line, whatever it carries: image names, hosts and registry answers come
//! from Pod authors and registries, so a newline or an escape sequence inside a value is
//! written escaped (`\n`, `\u001b`, a form JSON reads too) and can never start a forged line, and a line longer than
//! [`MAX_LINE_BYTES`] is cut with a marker. So are, in every part of the line (the message
//! included), the characters that make a line read other than it is: Unicode line and paragraph
//! separators (a viewer may break the line there), bidi controls (they reorder what follows)
//! and zero-width characters (they hide text or make two names look alike).
//!
//! Lines are batched: an event appends its line to one buffer, and a background thread writes
//! the buffer out [`BATCH_WINDOW`] after its first line — one `write` per batch instead of one
//! per line (at the shipped `info` level there is a line per admission; BENCHMARKS.md). The
//! buffer is written out at exit ([`flush`]) and before a panic's message. The buffer's lock is
//! held only to append a line or take the batch, never while it is written: a slow reader of
//! stderr holds up a thread that logs only once the batch reaches [`MAX_BATCH_BYTES`].

use std::io::Write;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::fmt::{MakeWriter, SubscriberBuilder};
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

mod admission_line;
pub(crate) use admission_line::AdmissionLine;

/// Longest log line written; the rest is replaced by `…[cut N bytes]`.
pub(crate) const MAX_LINE_BYTES: usize = 8 << 10;

/// How long the first line of a batch waits for others before the batch is written. Each batch
/// wakes the writing thread twice, and on a busy server those wake-ups preempt the thread
/// answering admissions: at 10 ms the writing thread cost ~2.7 µs of CPU per skipped admission
/// on the real-path bench, at 100 ms ~0.9 µs, most of it the write itself (BENCHMARKS.md,
/// session 15). A line still reaches stderr well before anyone reading the log could tell.
pub(crate) const BATCH_WINDOW: Duration = Duration::from_millis(100);
/// A batch this large is written at once by the thread that fills it (memory stays bounded
/// however fast lines come).
const MAX_BATCH_BYTES: usize = 1 << 20;

pub(crate) fn init(config: &Config) {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush_before_panic();
        hook(info);
    }));
    let builder = subscriber(config, OneLineStderr);
    // A second init (tests, repeated commands) keeps the first subscriber.
    let installed = match config.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if installed.is_ok() {
        let _ = admission_line::DIRECT.set(config.log_format);
    }
}

/// The subscriber `init` installs, writing to `writer`. No colour escapes, on a terminal or not:
/// [`OneLine`] would escape them into visible text, and log collectors store them as noise.
fn subscriber<W>(
    config: &Config,
    writer: W,
) -> SubscriberBuilder<DefaultFields, Format, EnvFilter, W>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(writer)
}

/// Stderr, one escaped line per event (the formatter writes each event in one call), batched.
#[derive(Clone, Copy)]
struct OneLineStderr;

impl<'a> MakeWriter<'a> for OneLineStderr {
    type Writer = OneLine<BatchedStderr>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine(BatchedStderr)
    }
}

/// The lines not yet written, the signal that wakes the writing thread, and the turn to write:
/// whoever takes a batch holds `writing` from taking it until it is written, so batches reach
/// stderr in order.
struct Batch {
    lines: Mutex<Vec<u8>>,
    first_line: Condvar,
    writing: Mutex<()>,
}

/// Set by the first line logged, which also starts the writing thread.
static BATCH: OnceLock<Batch> = OnceLock::new();

fn batch() -> &'static Batch {
    BATCH.get_or_init(|| {
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(write_batches)
            .expect("starting the log writer thread");
        Batch {
            lines: Mutex::new(Vec::with_capacity(64 << 10)),
            first_line: Condvar::new(),
            writing: Mutex::new(()),
        }
    })
}

/// The writing thread: waits for a first line, lets a batch gather, writes it.
fn write_batches() {
    let batch = batch();
    loop {
        {
            let lines = batch.lines.lock().unwrap_or_else(|e| e.into_inner());
            let _waiting = batch
                .first_line
                .wait_while(lines, |lines| lines.is_empty())
                .unwrap_or_else(|e| e.into_inner());
        }
        std::thread::sleep(BATCH_WINDOW);
        flush();
    }
}

/// Writes out the lines not yet written (at exit, before a panic's message).
pub(crate) fn flush() {
    let Some(batch) = BATCH.get() else {
        return;
    };
    let _writing = batch.writing.lock().unwrap_or_else(|e| e.into_inner());
    write_out(batch.lines.lock().unwrap_or_else(|e| e.into_inner()));
}

/// Takes the batch `lines` guards and writes it to stderr once the lock is let go; the caller
/// holds the turn to write.
fn write_out(mut lines: std::sync::MutexGuard<'_, Vec<u8>>) {
    let taken = std::mem::replace(&mut *lines, Vec::with_capacity(64 << 10));
    drop(lines);
    let _ = std::io::stderr().write_all(&taken);
}

/// [`flush`] before a panic's message, unless the batch stays locked: the thread panicking may
/// hold it itself (a line being formatted), or another may hold the turn to write while it
/// waits for the lines this thread holds. A panic's message is never held up for more than
/// ~[`PANIC_FLUSH_WAIT`] by a lock it cannot have.
fn flush_before_panic() {
    let Some(batch) = BATCH.get() else {
        return;
    };
    let Some(_writing) = lock_within(&batch.writing, PANIC_FLUSH_WAIT) else {
        return;
    };
    let Some(lines) = lock_within(&batch.lines, PANIC_FLUSH_WAIT) else {
        return;
    };
    write_out(lines);
}

/// How long a panic waits for each of the batch's locks before its message goes out without
/// the lines not yet written.
const PANIC_FLUSH_WAIT: Duration = Duration::from_millis(20);

/// `mutex`, once it is free within about `wait` (a poisoned one is taken as it is).
fn lock_within<T>(mutex: &Mutex<T>, wait: Duration) -> Option<std::sync::MutexGuard<'_, T>> {
    const STEP: Duration = Duration::from_millis(1);
    for _ in 0..=wait.as_millis() {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(STEP),
        }
    }
    None
}

/// Appends each line to the batch.
struct BatchedStderr;

impl Write for BatchedStderr {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        append(|lines| lines.extend_from_slice(line));
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Appends what `write_line` writes (one event, newline included) to the batch, made one line
/// by the rule every line follows ([`one_line`]).
fn append_line(write_line: impl FnOnce(&mut Vec<u8>)) {
    append(|lines| append_clean(lines, write_line));
}

/// Lets `write_line` write at the end of `lines`, then escapes what it wrote if it is not one
/// clean line.
fn append_clean(lines: &mut Vec<u8>, write_line: impl FnOnce(&mut Vec<u8>)) {
    let start = lines.len();
    write_line(lines);
    if !is_one_clean_line(&lines[start..]) {
        let clean = one_line(&lines[start..]);
        lines.truncate(start);
        lines.extend_from_slice(&clean);
    }
}

/// Lets `append_to` add a line to the batch; a batch grown past [`MAX_BATCH_BYTES`] is written
/// out by the thread that filled it (waiting for a batch being written: memory stays bounded
/// however slowly stderr is read), and the first line of a batch wakes the writing thread.
fn append(append_to: impl FnOnce(&mut Vec<u8>)) {
    let batch = batch();
    let mut lines = batch.lines.lock().unwrap_or_else(|e| e.into_inner());
    let first = lines.is_empty();
    append_to(&mut lines);
    let full = lines.len() > MAX_BATCH_BYTES;
    drop(lines);
    if full {
        flush();
    } else if first {
        batch.first_line.notify_one();
    }
}

/// Writes each buffer it is given as one line: see [`one_line`].
pub(crate) struct OneLine<W>(pub W);

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        // Nearly every event is already one clean line: written as it is, with no copy.
        if is_one_clean_line(event) {
            self.0.write_all(event)?;
        } else {
            self.0.write_all(&one_line(event))?;
        }
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Whether `event` is short, ends with its only newline and holds no character to escape (C1
/// controls start with the byte 0xC2 in UTF-8; the separators, bidi and zero-width characters
/// with 0xD8, 0xE2 or 0xEF: such an event takes the careful path when it holds one).
fn is_one_clean_line(event: &[u8]) -> bool {
    let Some((b'\n', body)) = event.split_last() else {
        return false;
    };
    if body.len() > MAX_LINE_BYTES {
        return false;
    }
    let mut lead_bytes_of_deceptive = false;
    let mut check = |bytes: &[u8]| {
        bytes.iter().all(|&b| {
            lead_bytes_of_deceptive |= matches!(b, 0xd8 | 0xe2 | 0xef);
            !((b < 0x20 && b != b'\t') || b == 0x7f || b == 0xc2)
        })
    };
    // Eight bytes at a time while they are printable ASCII (a line is nearly all of it: an
    // admission's line is ~600 bytes, checked on every request); byte by byte otherwise.
    let mut words = body.chunks_exact(8);
    for word in &mut words {
        let printable = printable_ascii(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        if !printable && !check(word) {
            return false;
        }
    }
    if !check(words.remainder()) {
        return false;
    }
    !(lead_bytes_of_deceptive && String::from_utf8_lossy(body).chars().any(is_deceptive))
}

/// Whether every byte of `word` is printable ASCII (0x20 to 0x7e): none has its high bit, none
/// is below 0x20 and none is 0x7f. The two tests are exact for "any byte" (a borrow only
/// starts at a byte that is below the bound, which already answers).
#[inline(always)]
fn printable_ascii(word: u64) -> bool {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    let del = word ^ (ONES * 0x7f);
    let is_del = del.wrapping_sub(ONES) & !del;
    (word | below_space | is_del) & HIGH == 0
}

/// A character that changes how a line reads without being seen: a Unicode line or paragraph
/// separator, a bidi control (embeddings, overrides, isolates, marks) or a zero-width one.
fn is_deceptive(c: char) -> bool {
    matches!(
        c,
        '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{200e}' | '\u{200f}' | '\u{061c}' // bidi marks
            | '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}' // zero-width
    )
}

/// `event` as one line: control and [deceptive](is_deceptive) characters inside it escaped, cut at [`MAX_LINE_BYTES`], and
/// ended by exactly one newline.
pub(crate) fn one_line(event: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(event);
    let body = text.strip_suffix('\n').unwrap_or(&text);
    let mut out = String::with_capacity(body.len().min(MAX_LINE_BYTES) + 32);
    for (at, c) in body.char_indices() {
        if out.len() >= MAX_LINE_BYTES {
            out.push_str(&format!("…[cut {} bytes]", body.len() - at));
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            // `\u2028`, not Rust's `\u{2028}`: valid inside a JSON string as well (every such
            // character is in the Basic Multilingual Plane), so a JSON line stays JSON.
            c if c.is_control() || is_deceptive(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\n');
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    pub(super) struct Captured(pub(super) std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;

        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// A panic while the batch is locked — by the thread panicking, formatting a line — goes
    /// on to its message instead of waiting for the lock forever; once the lock is free, the
    /// lines waiting are written out.
    #[test]
    fn a_panic_holding_the_batch_is_not_held_up_by_it() {
        let batch = batch();
        let line = b"written before a panic's message\n";
        let lines = batch.lines.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        flush_before_panic();
        assert!(started.elapsed() < Duration::from_secs(5), "held up");
        drop(lines);
        append_line(|out| out.extend_from_slice(line));
        flush_before_panic();
        let lines = batch.lines.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!lines.windows(line.len()).any(|w| w == line), "written out");
    }

    /// A batch being written (a slow reader of stderr) holds up no thread that logs a line: the
    /// line joins the next batch at once.
    #[test]
    fn a_line_is_appended_while_a_batch_is_written() {
        let batch = batch();
        // The turn to write, as the writing thread holds it while stderr takes a batch.
        let writing = batch.writing.lock().unwrap_or_else(|e| e.into_inner());
        let line = b"appended while a batch is written\n";
        let (appended, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            append_line(|out| out.extend_from_slice(line));
            appended.send(()).unwrap();
        });
        done.recv_timeout(Duration::from_secs(10))
            .expect("the line waited for the batch being written");
        let lines = batch.lines.lock().unwrap_or_else(|e| e.into_inner());
        assert!(lines.windows(line.len()).any(|w| w == line));
        drop(lines);
        drop(writing);
    }

    #[test]
    fn text_logs_carry_no_colour_escapes() {
        let config = Config::load(None, [("TOLERABLE_LOG_LEVEL".into(), "debug".into())]).unwrap();
        assert_eq!(config.log_format, LogFormat::Text);
        let captured = Captured::default();
        let subscriber = subscriber(&config, captured.clone()).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(image = "example.com/app:1", "lookup failed");
            tracing::debug!("a debug line");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("WARN")
                && text.contains("lookup failed")
                && text.contains("a debug line"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }

    #[test]
    fn a_value_cannot_start_a_line_and_long_lines_are_cut() {
        let forged = b"INFO admission: unchanged: evil\nERROR forged line \x1b[31mred\r\n";
        let line = String::from_utf8(one_line(forged)).unwrap();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n'));
        assert!(
            line.contains("evil\\nERROR forged line \\u001b[31mred\\r"),
            "{line}"
        );

        assert!(is_one_clean_line(b"INFO admission: fine\tand \xc3\xa9\n"));
        for unclean in [&b"a\nb\n"[..], b"no newline", b"a\x1bb\n", b"a\xc2\x9bb\n"] {
            assert!(!is_one_clean_line(unclean), "{unclean:?}");
        }
        // A C1 control (CSI, U+009B) is escaped too.
        let line = String::from_utf8(one_line("a\u{9b}31m\n".as_bytes())).unwrap();
        assert!(line.contains("\\u009b"), "{line}");

        let long = format!("INFO {}\n", "x".repeat(1 << 20));
        let line = String::from_utf8(one_line(long.as_bytes())).unwrap();
        assert!(line.len() < MAX_LINE_BYTES + 64, "{}", line.len());
        assert!(line.contains("…[cut "), "{}", &line[line.len() - 40..]);
        assert_eq!(line.matches('\n').count(), 1);
    }

    /// The word-at-a-time check answers as a byte-by-byte one would, for every byte value at
    /// every place of a word and of the tail after the last whole word.
    #[test]
    fn the_clean_line_check_sees_every_byte_value_wherever_it_is() {
        let byte_by_byte = |event: &[u8]| {
            let (last, body) = event.split_last().unwrap();
            *last == b'\n'
                && body
                    .iter()
                    .all(|&b| !((b < 0x20 && b != b'\t') || b == 0x7f || b == 0xc2))
        };
        for len in [8, 16, 21] {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut event = vec![b'x'; len];
                    event[at] = b;
                    event.push(b'\n');
                    // Lone lead bytes of deceptive characters decode to U+FFFD: still clean.
                    assert_eq!(
                        is_one_clean_line(&event),
                        byte_by_byte(&event),
                        "byte {b:#04x} at {at} of {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn separators_bidi_and_zero_width_characters_are_escaped_in_every_part_of_the_line() {
        let deceptive = [
            '\u{2028}', '\u{2029}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
            '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}',
            '\u{200b}', '\u{200c}', '\u{200d}', '\u{feff}', '\u{2060}',
        ];
        for c in deceptive {
            let event = format!("INFO admission: unchanged: ima{c}ge\n");
            assert!(!is_one_clean_line(event.as_bytes()), "{c:?}");
            let line = String::from_utf8(one_line(event.as_bytes())).unwrap();
            let escaped = format!("ima\\u{:04x}ge", u32::from(c));
            assert!(line.contains(&escaped), "{c:?}: {line}");
            assert!(!line.contains(c), "{c:?} written raw: {line}");
        }
        // Characters that only share a lead byte with them stay as they are, on the fast path.
        for fine in ["…", "—", "€", "\u{fb01}", "\u{0627}"] {
            let event = format!("INFO admission: {fine}\n");
            assert!(is_one_clean_line(event.as_bytes()), "{fine}");
        }

        // Through the subscriber: the message, a field's value and a quoted (Debug) value.
        let config = Config::load(None, Vec::new()).unwrap();
        let captured = Captured::default();
        let subscriber = subscriber(&config, OneLineCaptured(captured.clone())).finish();
        tracing::subscriber::with_default(subscriber, || {
            let image = "evil\u{2028}INFO forged\u{202e}gpj.exe";
            tracing::warn!(image, quoted = ?image, "lookup of {image} failed\u{200b}");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        for raw in ['\u{2028}', '\u{202e}', '\u{200b}'] {
            assert!(!text.contains(raw), "{raw:?} written raw: {text}");
        }
        assert!(
            text.contains("lookup of evil\\u2028INFO forged\\u202egpj.exe failed\\u200b"),
            "{text}"
        );
    }

    #[test]
    fn a_json_line_with_escaped_characters_is_still_json() {
        let config = Config::load(None, Vec::new()).unwrap();
        let captured = Captured::default();
        // As `init` installs it for `[log] format = "json"`.
        let subscriber = subscriber(&config, OneLineCaptured(captured.clone()))
            .json()
            .finish();
        let image = "evil\u{2028}INFO forged\u{202e}gpj.exe\u{1b}[31m";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(image, "lookup failed\u{200b}");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(
            !text.contains('\u{2028}') && !text.contains('\u{202e}'),
            "{text}"
        );
        let event: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(event["fields"]["image"], image, "{text}");
        assert_eq!(
            event["fields"]["message"], "lookup failed\u{200b}",
            "{text}"
        );
    }

    /// [`Captured`] behind the [`OneLine`] writer `init` installs.
    #[derive(Clone)]
    struct OneLineCaptured(Captured);

    impl<'a> MakeWriter<'a> for OneLineCaptured {
        type Writer = OneLine<Captured>;

        fn make_writer(&'a self) -> Self::Writer {
            OneLine(self.0.clone())
        }
    }
}
